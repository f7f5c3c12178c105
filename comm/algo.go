package comm

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// The algorithms. Each runs on the worker goroutine for one call, in place on
// a buffer of the compute type, and reaches the peers only through sendTo,
// recvFrom, recvReduce and sendRecv, which check every frame against the call.
// Chunk j of a buffer of cnt elements over n ranks is elements
// [cnt·j/n, cnt·(j+1)/n): chunks differ by at most one element, and counts
// smaller than n give empty chunks, which still exchange one empty frame so a
// desync is noticed.

func mod(a, n int) int { return ((a % n) + n) % n }

// chunkOf returns chunk j (taken modulo n) of data, whose elements are es bytes.
func chunkOf(data []byte, es, n, j int) []byte {
	j = mod(j, n)
	cnt := len(data) / es
	lo := int(int64(cnt)*int64(j)/int64(n)) * es
	hi := int(int64(cnt)*int64(j+1)/int64(n)) * es
	return data[lo:hi:hi]
}

func sameMem(a, b []byte) bool {
	return len(a) > 0 && len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// slotsOver cuts buf into n slots of l bytes, reusing the slice header array.
func (c *Comm) slotsOver(buf []byte, l int) [][]byte {
	if cap(c.slots) < c.n {
		c.slots = make([][]byte, c.n)
	}
	s := c.slots[:c.n]
	for r := range s {
		s[r] = buf[r*l : (r+1)*l : (r+1)*l]
	}
	return s
}

// preferRing applies the cost model in Config (see LatencyNs) to an
// all-reduce of size bytes: true when the bandwidth-optimal ring (or, in
// deterministic mode, the direct reduce-scatter + all-gather) is cheaper than
// the latency-optimal recursive doubling (or gather-to-all).
func (c *Comm) preferRing(size int) bool {
	n := c.n
	if n < 2 || size/8 < n {
		return false
	}
	a, s := c.cfg.LatencyNs, float64(size)/c.cfg.BytesPerNs
	steps := float64(bits.Len(uint(n - 1))) // ceil(log2 n)
	rd := steps * (a + 2*s)                 // send S and reduce S per step
	if n&(n-1) != 0 {
		rd += 2 * (a + s)
	}
	fn := float64(n)
	ring := 2*(fn-1)*a + 3*(fn-1)/fn*s
	return ring < rd
}

// crowdedRingFrom is the size above which an all-reduce on a crowded host
// (see Comm.crowded) takes the ring rather than recursive doubling.
// Measured on the 2-core reference host, 3, 4 and 7 ranks over shared
// memory, each algorithm forced (`gorun bench`, medians of 3 interleaved
// rounds, out-of-place µs, ring / recursive doubling;
// notes/shm-latency.md): 4 ranks 16 KiB 21.6 / 10.2, 64 KiB 43.6 / 22.3, 256 KiB
// 105 / 90, 1 MiB 305 / 368, 4 MiB 1365 / 3994; 7 ranks 64 KiB 94 / 75,
// 256 KiB 199 / 206, 1 MiB 684 / 905; 3 ranks 16 KiB 19.7 / 14.0, 256
// KiB 59 / 60. On a crowded host every step that waits for a rank that
// is not running costs a switch of a few microseconds or more, whatever
// it carries, so the ring's 2(n-1) steps lose to recursive doubling's
// log2(n) far beyond where the cost model (tuned on TCP, where a step
// costs the same whether or not the peer runs) puts the crossover.
const crowdedRingFrom = 256 << 10

// allReduceRing decides whether an all-reduce of size bytes takes a
// bandwidth-optimal algorithm (ring, pair exchange, direct reduce-scatter
// + all-gather) rather than a latency-optimal one (recursive doubling,
// gather-to-all). Every rank decides alike: the inputs are the size, the
// Config and the group's placement.
//
// With two ranks over shared memory, recursive doubling up to the eager
// limit (one exchange of the whole vector) was tried against the pair
// exchange from 16 KiB to 1 MiB and was not faster
// (notes/shm-latency.md), so two ranks keep the cost model.
func (c *Comm) allReduceRing(size int) bool {
	switch {
	case c.crowded && !c.cfg.Deterministic:
		return size > crowdedRingFrom
	}
	return c.preferRing(size)
}

func (c *Comm) allReduce(cl *call, send, recv []byte) error {
	dt := cl.dtype
	ct := computeType(dt)
	work, src := recv, send
	switch {
	case dt.isHalf():
		work = c.scratch(0, len(send)/2*4)
		widen(dt, work, send)
		src = work
	case c.n == 1 || c.cfg.Deterministic && c.n > 2 || overlaps(send, recv):
		// The deterministic algorithms reduce gathered copies anyway, and a
		// partial overlap cannot be read and written in one pass.
		if !sameMem(send, recv) {
			copyData(recv, send)
		}
		src = recv
	}
	// Otherwise the ring and recursive doubling read send where they first
	// combine an element with the local contribution and write recv then,
	// instead of copying send into recv first: one pass over the vector less.
	var err error
	switch ring := c.allReduceRing(len(work)); {
	case c.n == 1:
	case c.n == 2 && ring:
		// With two ranks the fixed tree is r0 op r1, and every op here is
		// commutative bit for bit (IEEE sum and product; min and max as the
		// builtins define them), so the ring and the pair exchange compute
		// exactly the tree.
		if k := c.pairSegments(ct, len(work)); k > 0 {
			err = c.pairAllReduce(cl, ct, src, work, k)
		} else {
			err = c.ringAllReduce(cl, ct, src, work)
		}
	case c.n == 2:
		err = c.recursiveDoubling(cl, ct, src, work)
	case c.cfg.Deterministic && ring:
		err = c.directAllReduce(cl, ct, work)
	case c.cfg.Deterministic:
		err = c.gatherAllReduce(cl, ct, work)
	case ring:
		err = c.ringAllReduce(cl, ct, src, work)
	default:
		err = c.recursiveDoubling(cl, ct, src, work)
	}
	if err != nil {
		return err
	}
	if cl.op == Avg {
		finishAvg(ct, work, c.n)
	}
	if dt.isHalf() {
		narrow(dt, recv, work)
	}
	return nil
}

// pairSegments returns how many segments per half pairAllReduce cuts a
// vector of size bytes (compute type ct) into, or 0 when it does not apply:
// the link to the peer must deliver a segment without waiting for the peer
// to read it (shared memory; TCP's eager frames are too small to be worth
// it) and every segment must hold at least one element.
func (c *Comm) pairSegments(ct DType, size int) int {
	l := c.peers[1-c.me].link
	seg := min(c.cfg.SegmentBytes, l.EagerLimit())
	if seg < 64<<10 {
		return 0
	}
	seg -= 8 // segments are cut on element bounds, so one may be an element longer
	half := size / ct.Size() / 2 * ct.Size()
	k := max(1, (size-half+seg-1)/seg)
	if half/ct.Size() < k {
		return 0
	}
	return k
}

// pairAllReduce is the two-rank all-reduce for links that deliver segments
// eagerly. Each rank sends the half of its vector the peer reduces (half
// me) and reduces the other (half p = 1-me), segment by segment, sending
// each reduced segment back as soon as it is made:
//
//	for each segment k:  send mine[k]; receive theirs[k] and reduce it
//	                     (src op received); send the result; receive the
//	                     peer's result into mine[k]
//
// against the ring (reduce-scatter, then all-gather) this reads each
// reduced segment for sending while it is still in cache rather than in a
// second pass, and it runs entirely on the calling goroutine: no hand-off to
// the sender goroutine, and on a two-core host no third thread competing
// for the cores.
//
// Deadlock freedom: each rank has at most two frames the peer has not
// received (its result for segment k-1 and mine[k], or mine[k] and its
// result for k), which Link.EagerLimit promises to deliver without the
// peer reading. Frames carry the length of their half in Aux like any
// message, and each must be exactly the expected segment.
func (c *Comm) pairAllReduce(cl *call, ct DType, src, data []byte, k int) error {
	me, es := c.me, ct.Size()
	p := 1 - me
	pe := c.peers[p]
	l := pe.link
	rr, direct := l.(ReduceReceiver)
	mine, theirs := chunkOf(data, es, 2, me), chunkOf(data, es, 2, p)
	srcMine, srcTheirs := chunkOf(src, es, 2, me), chunkOf(src, es, 2, p)
	seg := func(b []byte, i int) []byte {
		m := len(b) / es
		lo, hi := m*i/k*es, m*(i+1)/k*es
		return b[lo:hi:hi]
	}
	send := func(b []byte, total int) error {
		pe.inlHdr = c.headerTo(cl, p)
		pe.inlHdr.Aux = uint64(total)
		pe.inlHdr.Len = uint64(len(b))
		if err := l.Send(&pe.inlHdr, b); err != nil {
			return c.sendErr(cl, p, err)
		}
		return nil
	}
	h := &pe.recvHdr
	header := func(total, off, want int) error {
		if err := c.recvHeader(cl, p, h, total, total-off); err != nil {
			return err
		}
		if int(h.Len) != want {
			return fmt.Errorf("%w: rank %d sent a %d-byte segment, want %d", ErrProtocol, p, h.Len, want)
		}
		return nil
	}
	// The reduction of one received piece is c.rrFn (reduceRecvd), with
	// the segment's slices set in c.rr before each receive.
	op := cl.op
	reduce := c.rrFn
	offMine, offTheirs := 0, 0
	for i := range k {
		if err := send(seg(srcMine, i), len(mine)); err != nil {
			return err
		}
		res, local := seg(theirs, i), seg(srcTheirs, i)
		c.rr.base, c.rr.local, c.rr.op, c.rr.ct = uintptr(unsafe.Pointer(unsafe.SliceData(res))), local, op, ct
		if err := header(len(theirs), offTheirs, len(res)); err != nil {
			return err
		}
		var err error
		if direct {
			err = rr.RecvReduce(res, reduce)
		} else {
			tmp := c.scratch(1, len(res))
			if err = l.RecvPayload(tmp); err == nil {
				reduce3(op, ct, res, local, tmp)
			}
		}
		if err != nil {
			return c.linkErr(p, err)
		}
		offTheirs += len(res)
		if err := send(res, len(theirs)); err != nil {
			return err
		}
		back := seg(mine, i)
		if err := header(len(mine), offMine, len(back)); err != nil {
			return err
		}
		if err := l.RecvPayload(back); err != nil {
			return c.linkErr(p, err)
		}
		offMine += len(back)
	}
	return nil
}

// ringAllReduce: reduce-scatter then all-gather around the ring
// me → me+1. After step s of the first phase, rank me holds chunk me-s-1
// reduced over ranks me-s-1..me; it ends owning chunk me+1 fully reduced.
// src holds this rank's contribution and data receives the result; they are
// the same slice or do not overlap.
func (c *Comm) ringAllReduce(cl *call, ct DType, src, data []byte) error {
	if err := c.ringReduceScatter(cl, ct, src, data); err != nil {
		return err
	}
	return c.ringAllGather(cl, data, ct.Size(), c.me+1)
}

// ringReduceScatter is the first phase of the ring all-reduce: rank me ends
// owning chunk me+1 of data, reduced over all ranks. Each chunk is combined
// with this rank's contribution (in src) exactly once, so the chunks of
// data that are received are written, never read first; the others are
// left alone. src and data are the same slice or do not overlap.
func (c *Comm) ringReduceScatter(cl *call, ct DType, src, data []byte) error {
	n, me, es := c.n, c.me, ct.Size()
	right, left := mod(me+1, n), mod(me-1, n)
	for s := 0; s < n-1; s++ {
		from := data // the partial result received in the previous step
		if s == 0 {
			from = src
		}
		if err := c.sendRecv(cl, right, chunkOf(from, es, n, me-s), left, chunkOf(data, es, n, me-s-1), true, chunkOf(src, es, n, me-s-1), ct); err != nil {
			return err
		}
	}
	return nil
}

// directReduceScatter (deterministic): rank me gathers chunk me from every
// rank and reduces it along the fixed tree; it ends owning chunk me.
func (c *Comm) directReduceScatter(cl *call, ct DType, data []byte) error {
	n, me, es := c.n, c.me, ct.Size()
	mine := chunkOf(data, es, n, me)
	l := len(mine)
	slots := c.slotsOver(c.scratch(2, n*l), l)
	// Our own contribution stays in place: the tree may overwrite it with
	// partial results, which is what the tree means, and it is not sent.
	slots[me] = mine
	if err := c.exchangeAll(cl, func(p int) []byte { return chunkOf(data, es, n, p) }, func(p int) []byte { return slots[p] }); err != nil {
		return err
	}
	treeReduce(cl.op, ct, slots)
	if me != 0 {
		copyData(mine, slots[0])
	}
	return nil
}

// reduce: small messages take the all-reduce's latency path; large ones are
// reduce-scattered (ring, or direct in deterministic mode, so the tree is the
// same as the all-reduce's) and the reduced chunks gathered at the root:
// (n-1)/n·S on the wire per rank instead of 2(n-1)/n·S.
func (c *Comm) reduce(cl *call) error {
	n, me, root := c.n, c.me, cl.root
	dt := cl.dtype
	ct := computeType(dt)
	es := ct.Size()
	size := len(cl.send) / dt.Size() * es
	if n == 1 || !c.preferRing(size) {
		recv := cl.recv
		if me != root {
			recv = c.scratch(3, len(cl.send))
		}
		return c.allReduce(cl, cl.send, recv)
	}
	work, src := c.scratch(0, size), cl.send
	if dt.isHalf() {
		widen(dt, work, cl.send)
		src = work
	} else if c.cfg.Deterministic {
		copyData(work, cl.send)
	}
	ownOf := func(r int) int { return r + 1 }
	var err error
	if c.cfg.Deterministic {
		ownOf = func(r int) int { return r }
		err = c.directReduceScatter(cl, ct, work)
	} else {
		err = c.ringReduceScatter(cl, ct, src, work)
	}
	if err != nil {
		return err
	}
	if me != root {
		return c.sendTo(cl, root, chunkOf(work, es, n, ownOf(me)))
	}
	for p := range n {
		if p != me {
			if err := c.recvFrom(cl, p, chunkOf(work, es, n, ownOf(p))); err != nil {
				return err
			}
		}
	}
	if cl.op == Avg {
		finishAvg(ct, work, n)
	}
	if dt.isHalf() {
		narrow(dt, cl.recv, work)
	} else {
		copyData(cl.recv, work)
	}
	return nil
}

// ringAllGather circulates chunks so that every rank ends with all of them;
// rank me starts owning chunk own.
func (c *Comm) ringAllGather(cl *call, data []byte, es, own int) error {
	n, me := c.n, c.me
	right, left := mod(me+1, n), mod(me-1, n)
	for s := 0; s < n-1; s++ {
		if err := c.sendRecv(cl, right, chunkOf(data, es, n, own-s), left, chunkOf(data, es, n, own-s-1), false, nil, 0); err != nil {
			return err
		}
	}
	return nil
}

// recursiveDoubling is the latency-optimal all-reduce (and the barrier, with
// no data): log2(n) exchanges of the whole vector. For n not a power of two
// the first 2·rem ranks pair up first (odd absorbs even) and the even ones
// get the result back at the end. src holds this rank's contribution and
// data receives the result (the same slice, or not overlapping): the first
// exchange reads src, and its reduction writes data.
func (c *Comm) recursiveDoubling(cl *call, ct DType, src, data []byte) error {
	n, me := c.n, c.me
	if n == 1 {
		return nil
	}
	pof2 := 1 << (bits.Len(uint(n)) - 1)
	rem := n - pof2
	tmp := c.scratch(2, len(data))
	cur := src
	newRank := -1
	switch {
	case me < 2*rem && me%2 == 0:
		if err := c.sendTo(cl, me+1, src); err != nil {
			return err
		}
	case me < 2*rem:
		if err := c.recvFrom(cl, me-1, tmp); err != nil {
			return err
		}
		reduce3(cl.op, ct, data, src, tmp)
		cur = data
		newRank = me / 2
	default:
		newRank = me - rem
	}
	if newRank >= 0 {
		for mask := 1; mask < pof2; mask <<= 1 {
			p := rdPeer(newRank^mask, rem)
			// Fold the peer's vector into data straight from the link
			// (a fast slot or the ring) when our send is done before the
			// receive begins or does not read data: one pass over the
			// received bytes instead of a copy into tmp and a reduction
			// from it. 2 ranks, 512 B float32 sum: ... (notes/shm-latency.md).
			if len(data) > 0 && (c.eager(p, len(cur)) || !overlaps(cur, data)) {
				if err := c.sendRecv(cl, p, cur, p, data, true, cur, ct); err != nil {
					return err
				}
			} else {
				if err := c.sendRecv(cl, p, cur, p, tmp, false, nil, 0); err != nil {
					return err
				}
				reduce3(cl.op, ct, data, cur, tmp)
			}
			cur = data
		}
	}
	if me < 2*rem {
		if me%2 == 0 {
			return c.recvFrom(cl, me+1, data)
		}
		return c.sendTo(cl, me-1, data)
	}
	return nil
}

// exchangeAll sends sendOf(p) to every peer p and receives recvOf(p) from it,
// in n-1 staggered steps (step i: to me+i, from me-i) so that no rank is
// the target of everyone at once.
func (c *Comm) exchangeAll(cl *call, sendOf, recvOf func(p int) []byte) error {
	n, me := c.n, c.me
	for i := 1; i < n; i++ {
		to, from := mod(me+i, n), mod(me-i, n)
		if err := c.sendRecv(cl, to, sendOf(to), from, recvOf(from), false, nil, 0); err != nil {
			return err
		}
	}
	return nil
}

// gatherAllReduce (deterministic, small): every rank gathers every rank's
// vector and reduces them along the fixed tree.
func (c *Comm) gatherAllReduce(cl *call, ct DType, data []byte) error {
	l := len(data)
	slots := c.slotsOver(c.scratch(2, c.n*l), l)
	copyData(slots[c.me], data)
	if err := c.exchangeAll(cl, func(int) []byte { return data }, func(p int) []byte { return slots[p] }); err != nil {
		return err
	}
	treeReduce(cl.op, ct, slots)
	copyData(data, slots[0])
	return nil
}

// directAllReduce (deterministic, large): rank r gathers chunk r from every
// rank, reduces it along the fixed tree, and the reduced chunks are
// all-gathered. It moves the same bytes as the ring.
func (c *Comm) directAllReduce(cl *call, ct DType, data []byte) error {
	n, me, es := c.n, c.me, ct.Size()
	if err := c.directReduceScatter(cl, ct, data); err != nil {
		return err
	}
	mine := chunkOf(data, es, n, me)
	return c.exchangeAll(cl, func(int) []byte { return mine }, func(p int) []byte { return chunkOf(data, es, n, p) })
}

func (c *Comm) allGather(cl *call) error {
	es := cl.dtype.Size()
	k := len(cl.send)
	block := func(j int) []byte { j = mod(j, c.n); return cl.recv[j*k : (j+1)*k] }
	if !sameMem(cl.send, block(c.me)) {
		copyData(block(c.me), cl.send)
	}
	_ = es
	n, me := c.n, c.me
	right, left := mod(me+1, n), mod(me-1, n)
	for s := 0; s < n-1; s++ {
		if err := c.sendRecv(cl, right, block(me-s), left, block(me-s-1), false, nil, 0); err != nil {
			return err
		}
	}
	return nil
}

func (c *Comm) reduceScatter(cl *call) error {
	n, me := c.n, c.me
	dt := cl.dtype
	ct := computeType(dt)
	es := ct.Size()
	l := len(cl.recv) / dt.Size() * es // bytes of one block in the compute type
	// The input goes to scratch first. A copy-free ring (reading send where
	// each block is first combined, as all-reduce does) was tried: it raised
	// the exposed communication of the overlapped step benchmark
	// (scripts/bench-step.sh) from 3-10% to 24-44% of the communication time
	// at 2 and 4 ranks, on shm and TCP, for a reason not found yet, while
	// reduce-scatter alone gained little. So the copy stays.
	work := c.scratch(0, n*l)
	if dt.isHalf() {
		widen(dt, work, cl.send)
	} else {
		copyData(work, cl.send)
	}
	block := func(j int) []byte { j = mod(j, n); return work[j*l : (j+1)*l] }
	res := block(me)
	switch {
	case n == 1:
	case c.cfg.Deterministic:
		slots := c.slotsOver(c.scratch(2, n*l), l)
		copyData(slots[me], block(me))
		if err := c.exchangeAll(cl, block, func(p int) []byte { return slots[p] }); err != nil {
			return err
		}
		treeReduce(cl.op, ct, slots)
		res = slots[0]
	default:
		right, left := mod(me+1, n), mod(me-1, n)
		for s := 0; s < n-1; s++ {
			if err := c.sendRecv(cl, right, block(me-s-1), left, block(me-s-2), true, nil, ct); err != nil {
				return err
			}
		}
	}
	if cl.op == Avg {
		finishAvg(ct, res, n)
	}
	if dt.isHalf() {
		narrow(dt, cl.recv, res)
	} else {
		copyData(cl.recv, res)
	}
	return nil
}

// broadcast runs a binomial tree rooted at root: log2(n) rounds, each rank
// receiving once from its parent and then sending to its children.
//
// In a tree the root receives nothing, so ranks that disagree about the root
// could each send and return. An empty frame to the right neighbour first
// closes that hole: every rank then reads one frame from its left neighbour,
// and if the ranks' roots are not all equal, some neighbour pair differs.
func (c *Comm) broadcast(cl *call) error {
	n, me, root := c.n, c.me, cl.root
	if n > 1 {
		if err := c.sendRecv(cl, mod(me+1, n), nil, mod(me-1, n), nil, false, nil, 0); err != nil {
			return err
		}
	}
	if me == root && !sameMem(cl.send, cl.recv) {
		copyData(cl.recv, cl.send)
	}
	if n > 2 && c.preferRing(len(cl.recv)) {
		// Large: the root scatters one chunk to each rank, then a ring
		// all-gather: 2(n-1)/n·S through the root instead of log2(n)·S.
		es := cl.dtype.Size()
		if me == root {
			for p := range n {
				if p != me {
					c.post(cl, p, chunkOf(cl.recv, es, n, p))
				}
			}
			if err := c.flushAll(cl); err != nil {
				return err
			}
		} else if err := c.recvFrom(cl, root, chunkOf(cl.recv, es, n, me)); err != nil {
			return err
		}
		return c.ringAllGather(cl, cl.recv, es, me)
	}
	vr := mod(me-root, n)
	mask := 1
	for ; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			if err := c.recvFrom(cl, mod(vr-mask+root, n), cl.recv); err != nil {
				return err
			}
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			c.post(cl, mod(vr+mask+root, n), cl.recv)
		}
	}
	return c.flushAll(cl)
}

func (c *Comm) allToAll(cl *call) error {
	n, me := c.n, c.me
	es := cl.dtype.Size()
	soff, roff := make([]int, n+1), make([]int, n+1)
	for p := range n {
		sc, rc := len(cl.send)/es/n, len(cl.recv)/es/n
		if cl.kind == KindAllToAllV {
			sc, rc = cl.counts.send[p], cl.counts.recv[p]
		}
		soff[p+1] = soff[p] + sc*es
		roff[p+1] = roff[p] + rc*es
	}
	send := cl.send[:soff[n]]
	if overlaps(send, cl.recv) {
		tmp := c.scratch(0, len(send))
		copyData(tmp, send)
		send = tmp
	}
	copyData(cl.recv[roff[me]:roff[me+1]], send[soff[me]:soff[me+1]])
	return c.exchangeAll(cl,
		func(p int) []byte { return send[soff[p]:soff[p+1]] },
		func(p int) []byte { return cl.recv[roff[p]:roff[p+1]] })
}

// rdPeer is the group rank behind newRank in recursive doubling's
// power-of-two subgroup, when the first 2*rem ranks were folded in pairs
// (the odd rank of each pair carries on) and the rest were shifted down by
// rem. Both the plain all-reduce and the fused one pair ranks this way.
func rdPeer(newRank, rem int) int {
	if newRank < rem {
		return newRank*2 + 1
	}
	return newRank + rem
}
