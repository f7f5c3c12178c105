package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"
)

// Fusion on the fly: small all-reduces queued behind one another on a
// communicator travel as one message (see "Fusion" in the package comment
// for the rule and its proof obligations; notes/fusion.md for the
// measurements). This file holds the token holder's side of it: what it
// takes from the queue (offer), the recursive doubling that agrees, in
// the messages it exchanges anyway, on how many of the offered calls every
// rank runs (fusedRD), and the bookkeeping that completes them in issue
// order (runFused).

// maxFuseCalls bounds the calls one fused message carries, and so the list
// of counts at its front (fuseListBytes). It also bounds the aliasing check
// of offer, which is quadratic in the calls taken.
const maxFuseCalls = 128

// fuseListBytes is the room in front of the packed data for the list of
// counts a fused message starts with: one uint32 per call, padded to 8.
const fuseListBytes = 4 * maxFuseCalls

// listBytes is the length of the count list of a message of k > 1 calls.
func listBytes(k int) int { return (4*k + 7) &^ 7 }

// unit is one vector of a fused message: an all-reduce, or one part of a
// coalesced all-reduce (AllReduceCoalesced).
type unit struct {
	cl         *call
	send, recv []byte
	count      int
	call       int // index of cl in fusion.calls
	part       int // index in cl.co.parts (0 for a call of one buffer)
}

// fusion is the token holder's state for fused all-reduces (no lock: only
// the token holder touches it, like the rest of the per-call state).
type fusion struct {
	// calls are the calls offered in the current fused all-reduce, the
	// lead first, in issue order, and units their vectors, in order; off[i]
	// is where unit i's data starts in the packed vector (compute-type
	// bytes) and off[len(units)] its end.
	calls []*call
	slots []uint64 // slots[i]: the flight record of calls[i], once numbered
	units []unit
	off   []int
	// held are calls taken from the queue and not run yet, in issue order
	// from heldAt: a call that ended an offer, and offered calls that the
	// ranks did not agree on (a coalesced call possibly in part). They run
	// before anything still queued.
	held   []*call
	heldAt int
	// buf holds fuseListBytes of room for a count list, then the packed
	// data of the offered units (up to FuseBytes); in receives a peer's
	// fused message when it cannot be folded into buf as it arrives, and
	// list a count list when it can.
	buf, in, list []byte
	// The message being folded (foldRecvd): its header, sender, count
	// list length and vectors; this rank's offer m; the reduction; toRecv:
	// the agreed vectors go straight into their receive buffers (the
	// last exchange); parsed, mt and err: the list's verdict once read;
	// ru: the unit the fold has reached.
	rh              *Header
	rp, rlist, rkt  int
	rm, rmt, ru     int
	rop             Op
	rct             DType
	toRecv, rparsed bool
	rerr            error
	// wrote is how many units' results are already in their receive
	// buffers (folded there by the last exchange).
	wrote int
	// foldFn is c.foldRecvd, bound once so that a receive allocates no
	// closure.
	foldFn func(dst, src []byte)
}

// units returns how many units cl has: its parts, or 1.
func (cl *call) units() int {
	if cl.co == nil {
		return 1
	}
	return len(cl.co.parts)
}

// unitsDone is how many of cl's units have run (0 or, for a coalesced
// call cut short, how far it got).
func (cl *call) unitsDone() int {
	if cl.co == nil {
		return 0
	}
	return cl.co.done
}

// unitOf returns part j of cl as a unit (the call itself for j = 0 when
// it has no parts).
func (cl *call) unitOf(j, ci int) unit {
	if cl.co == nil {
		return unit{cl: cl, send: cl.send, recv: cl.recv, count: cl.count, call: ci}
	}
	p := &cl.co.parts[j]
	return unit{cl: cl, send: p.send, recv: p.recv, count: p.count, call: ci, part: j}
}

// take returns the next call in issue order without blocking: a held one,
// else one from the queue; nil when there is none, with closed set when
// the queue is closed and drained.
func (c *Comm) take() (cl *call, closed bool) {
	f := &c.fz
	if f.heldAt < len(f.held) {
		cl = f.held[f.heldAt]
		f.held[f.heldAt] = nil
		f.heldAt++
		if f.heldAt == len(f.held) {
			f.held, f.heldAt = f.held[:0], 0
		}
		return cl, false
	}
	select {
	case cl, ok := <-c.queue:
		return cl, !ok
	default:
		return nil, false
	}
}

// unshift puts cl back in front of the held calls: it runs next.
func (c *Comm) unshift(cl *call) {
	f := &c.fz
	if f.heldAt > 0 {
		f.heldAt--
		f.held[f.heldAt] = cl
		return
	}
	f.held = slices.Insert(f.held, 0, cl)
}

// heldCalls is how many calls are held (token holder only).
func (c *Comm) heldCalls() int { return len(c.fz.held) - c.fz.heldAt }

// fusable reports whether cl may lead or join a fused all-reduce: a valid
// all-reduce on two ranks or more whose vectors (its parts, for a
// coalesced one) are each at most Config.FuseBytes in the compute type
// and would each take the latency path (recursive doubling) on their own,
// which is what a fused message runs. Every rank decides alike for the
// same call (the inputs are the call's fingerprint, the Config and the
// group's placement), and a lone fusable call sends exactly the frames it
// sends unfused, so a rank that decides otherwise for a call of another
// size still gets a desync error from the frames, not wrong data. Not in
// deterministic mode on more than two ranks, whose latency path is the
// gather of every rank's vector (gatherAllReduce), not fused here.
func (c *Comm) fusable(cl *call) bool {
	if cl.kind != KindAllReduce || cl.invalid != nil || c.n < 2 || c.cfg.Deterministic && c.n > 2 {
		return false
	}
	es := computeType(cl.dtype).Size()
	if cl.co == nil {
		return c.fusableSize(cl.count * es)
	}
	for i := range cl.co.parts {
		if !c.fusableSize(cl.co.parts[i].count * es) {
			return false
		}
	}
	return true
}

func (c *Comm) fusableSize(size int) bool {
	return size <= c.cfg.fuseLimit() && !c.allReduceRing(size)
}

// offer offers the units of lead not run yet and the calls queued right
// behind it that may join it (joins), in issue order, into c.fz; the
// first call that may not join is held to run next. It never waits for a
// call: what is queued now is the offer. Of the lead it offers as many
// units as the limits allow (at least one); a call that joins comes whole.
func (c *Comm) offer(lead *call) {
	f := &c.fz
	f.calls = append(f.calls[:0], lead)
	f.units = f.units[:0]
	es := computeType(lead.dtype).Size()
	total := 0
	for j := lead.unitsDone(); j < lead.units(); j++ {
		u := lead.unitOf(j, 0)
		if len(f.units) > 0 && (len(f.units) == maxFuseCalls || total+u.count*es > c.cfg.fuseLimit() || c.aliased(u.send)) {
			return
		}
		f.units = append(f.units, u)
		total += u.count * es
	}
	for len(f.units) < maxFuseCalls {
		nx, _ := c.take()
		if nx == nil {
			return
		}
		if !c.joins(nx, lead, total) {
			c.unshift(nx)
			return
		}
		f.calls = append(f.calls, nx)
		for j := range nx.units() {
			u := nx.unitOf(j, len(f.calls)-1)
			f.units = append(f.units, u)
			total += u.count * es
		}
	}
}

// aliased reports whether send overlaps the receive buffer of a unit
// offered so far: run in turn, it would read that unit's result; fused,
// every send buffer is read before any result is written.
func (c *Comm) aliased(send []byte) bool {
	for i := range c.fz.units {
		if overlaps(send, c.fz.units[i].recv) {
			return true
		}
	}
	return false
}

// joins reports whether nx may join, whole, the offer led by lead, whose
// units hold total bytes so far: the same kind, dtype and op, fusable,
// within FuseBytes and maxFuseCalls, and reading no memory that an
// earlier unit of the offer (or of nx) writes.
func (c *Comm) joins(nx, lead *call, total int) bool {
	if nx.kind != lead.kind || nx.dtype != lead.dtype || nx.op != lead.op || len(c.fz.units)+nx.units() > maxFuseCalls || !c.fusable(nx) {
		return false
	}
	es := computeType(nx.dtype).Size()
	for j := range nx.units() {
		u := nx.unitOf(j, 0)
		if total += u.count * es; total > c.cfg.fuseLimit() || c.aliased(u.send) {
			return false
		}
		for i := range j {
			if overlaps(u.send, nx.unitOf(i, 0).recv) {
				return false
			}
		}
	}
	return true
}

// runFused runs lead, a fusable call, with the calls queued behind it that
// may join it, and completes the calls every rank agreed to run with it
// in issue order; the others are held and run next (a coalesced call cut
// short first, with the units it has left). It returns the issue number of
// the last call it completed, and false if it completed none. Token holder
// only.
func (c *Comm) runFused(lead *call) (uint64, bool) {
	if err := c.Err(); err != nil {
		seq := lead.seq
		c.finish(lead, err)
		return seq, true
	}
	c.offer(lead)
	f := &c.fz
	k := len(f.units)
	record := !flightOff.Load()
	var began int64
	if record {
		began = ticks()
	}
	// The lead is numbered when it first runs (its frames carry its
	// number on each pair); the calls that join it once the ranks have
	// agreed on them.
	f.slots = append(f.slots[:0], 0)
	if lead.unitsDone() == 0 {
		f.slots[0] = c.number(lead, record, began)
	} else {
		f.slots[0] = lead.co.slot
	}
	m, err := c.fusedAllReduce()
	if err != nil {
		c.fail(err)
		if isLinkDown(err) {
			err = c.failErr
		}
		if record {
			c.rec.end(f.slots[0], err, ticks())
		}
		// The other offered calls fail at their turn (the communicator
		// has failed).
		for i := len(f.calls) - 1; i >= 1; i-- {
			c.unshift(f.calls[i])
		}
		seq := lead.seq
		c.finish(lead, err)
		return seq, true
	}
	if m > 1 {
		c.fusedRuns++
	}
	if m < k {
		c.fuseShrunk++
	}
	// The agreed units are a prefix: whole calls, then at most one call
	// in part (a coalesced one), then calls with none of their units run.
	ran := f.units[m-1].call + 1 // calls with units run
	for _, cl := range f.calls[1:ran] {
		f.slots = append(f.slots, c.number(cl, record, began))
	}
	for i := len(f.calls) - 1; i >= ran; i-- {
		c.unshift(f.calls[i])
	}
	done := ran
	if cl := f.calls[ran-1]; cl.co != nil {
		// A coalesced call: how far the agreed units took it.
		n := 0
		for i := m - 1; i >= 0 && f.units[i].call == ran-1; i-- {
			n++
		}
		cl.co.done += n
		cl.co.slot = f.slots[ran-1]
		if cl.co.done < cl.units() {
			c.unshift(cl)
			done--
		}
	}
	var now int64
	if record {
		now = ticks()
	}
	var last uint64
	for i, cl := range f.calls[:done] {
		if record {
			c.rec.fused(f.slots[i], ran)
			c.rec.end(f.slots[i], nil, now)
		}
		last = cl.seq
		c.finish(cl, nil) // recycles cl
		f.calls[i] = nil
	}
	for i := range f.units {
		f.units[i] = unit{}
	}
	return last, done > 0
}

// number counts cl as the next collective of the group (and of every
// pair), and records it as running since began; it returns the record.
func (c *Comm) number(cl *call, record bool, began int64) uint64 {
	c.cseq++
	for _, p := range c.peers {
		if p != nil {
			p.seq++
		}
	}
	if record {
		return c.rec.start(cl, c.cseq, 0, began)
	}
	return 0
}

// fusedAllReduce runs the offered units c.fz.units as one all-reduce and
// returns how many of them, from the first, every rank ran (their results
// are in their receive buffers). One unit alone runs on its own buffers
// exactly as allReduce runs it; several are packed into one vector.
func (c *Comm) fusedAllReduce() (int, error) {
	f := &c.fz
	lead := f.calls[0]
	k := len(f.units)
	dt := lead.dtype
	ct := computeType(dt)
	es := ct.Size()
	f.off = f.off[:0]
	total := 0
	for i := range f.units {
		f.off = append(f.off, total)
		total += f.units[i].count * es
	}
	f.off = append(f.off, total)
	f.wrote = 0
	var src, data []byte
	if k == 1 {
		u := &f.units[0]
		src, data = u.send, u.recv
		switch {
		case dt.isHalf():
			data = c.scratch(0, total)
			widen(dt, data, u.send)
			src = data
		case overlaps(u.send, u.recv):
			if !sameMem(u.send, u.recv) {
				copyData(u.recv, u.send)
			}
			src = data
		}
	} else {
		if cap(f.buf) < fuseListBytes+c.cfg.fuseLimit() {
			f.buf = make([]byte, fuseListBytes+c.cfg.fuseLimit())
		}
		data = f.buf[fuseListBytes : fuseListBytes+total]
		for i := range f.units {
			part := data[f.off[i]:f.off[i+1]]
			if dt.isHalf() {
				widen(dt, part, f.units[i].send)
			} else {
				copyData(part, f.units[i].send)
			}
		}
		src = data
	}
	m, err := c.fusedRD(lead, ct, src, data)
	if err != nil {
		return 0, err
	}
	for i := f.wrote; i < m; i++ {
		part := data[f.off[i]:f.off[i+1]]
		if lead.op == Avg {
			finishAvg(ct, part, c.n)
		}
		switch {
		case dt.isHalf():
			narrow(dt, f.units[i].recv, part)
		case k > 1:
			copyData(f.units[i].recv, part)
		}
	}
	return m, nil
}

// fusedRD is recursiveDoubling over a prefix of the offered calls that
// shrinks to what every rank offers. Each message carries how many calls
// its data holds (m); a rank that receives a message of mt calls goes on
// with min(m, mt), the calls both hold, reduced over both sides. After the
// exchange with the partner at distance 2^j, a rank's m is the least
// offer among the 2^(j+1) ranks whose data its vector holds (by induction:
// both partners take the minimum of their halves' minima), so after the
// last exchange every rank has the same m, the least offer of all, and
// the first m calls reduced over all ranks. For n not a power of two the
// absorbed ranks' offers enter through their partners, and the result
// they get back carries the final m. A rank never runs a call it did not
// offer, so no rank waits for a call another has not issued.
//
// With one call on every rank the frames are exactly recursiveDoubling's
// (the count is carried in the header's Root, -1 for one call), and every
// element of every call is combined in the same order as unfused, so
// fused or not, the results are the same bits.
func (c *Comm) fusedRD(lead *call, ct DType, src, data []byte) (int, error) {
	n, me := c.n, c.me
	pof2 := 1 << (bits.Len(uint(n)) - 1)
	rem := n - pof2
	m := len(c.fz.units)
	cur := src
	newRank := -1
	var err error
	switch {
	case me < 2*rem && me%2 == 0:
		if err := c.fuseSend(lead, me+1, cur, m); err != nil {
			return 0, err
		}
		if err := c.flush(lead, me+1); err != nil {
			return 0, err
		}
	case me < 2*rem:
		if m, err = c.fuseStep(lead, ct, -1, me-1, m, cur, data, false); err != nil {
			return 0, err
		}
		cur = data
		newRank = me / 2
	default:
		newRank = me - rem
	}
	if newRank >= 0 {
		for mask := 1; mask < pof2; mask <<= 1 {
			p := rdPeer(newRank^mask, rem)
			// The last exchange of a power-of-two group (nothing is sent
			// after it) may fold the result straight into the receive
			// buffers (foldRecvd).
			last := mask<<1 == pof2 && rem == 0 && !lead.dtype.isHalf()
			if m, err = c.fuseStep(lead, ct, p, p, m, cur, data, last); err != nil {
				return 0, err
			}
			cur = data
		}
	}
	if me < 2*rem {
		if me%2 == 0 {
			return c.fuseResult(lead, me+1, m, data)
		}
		if err := c.fuseSend(lead, me-1, data, m); err != nil {
			return 0, err
		}
		if err := c.flush(lead, me-1); err != nil {
			return 0, err
		}
	}
	return m, nil
}

// fuseMsg is the message of the first m offered units of vector v (the
// packed data, or for one unit its own vector): v's first unit alone for
// m = 1; else the count list, written in front of the packed data in
// c.fz.buf, then their data.
func (c *Comm) fuseMsg(v []byte, m int) []byte {
	f := &c.fz
	if m == 1 {
		return v[:f.off[1]]
	}
	lb := listBytes(m)
	list := f.buf[fuseListBytes-lb : fuseListBytes]
	for i := range f.units[:m] {
		binary.LittleEndian.PutUint32(list[4*i:], f.units[i].listed())
	}
	clear(list[4*m:])
	return f.buf[fuseListBytes-lb : fuseListBytes+f.off[m]]
}

// foldRecvd is the reduction fuseRecv hands the link for a fused message
// folded as it arrives (the message lands over buf so that its data lines
// up with the packed data): the count list is copied into c.fz.list and
// checked before the first data byte (checkList); then the data of the
// agreed units is combined with the packed data, in place, or with toRecv
// straight into their receive buffers (finished for Avg). Nothing is
// combined once the list has failed the check.
func (c *Comm) foldRecvd(d, s []byte) {
	f := &c.fz
	o := int(uintptr(unsafe.Pointer(unsafe.SliceData(d)))-uintptr(unsafe.Pointer(unsafe.SliceData(f.buf)))) - (fuseListBytes - f.rlist)
	if o < f.rlist {
		n := copy(f.list[o:f.rlist], s)
		d, s, o = d[n:], s[n:], o+n
		if len(d) == 0 {
			return
		}
	}
	if !f.rparsed {
		f.rparsed = true
		f.rmt, f.rerr = c.checkList(f.rp, f.rh, f.rkt, f.list[:f.rlist], f.rm, false)
	}
	if f.rerr != nil {
		return
	}
	a := o - f.rlist // data offset of d
	end := min(a+len(d), f.off[f.rmt])
	if a >= end {
		return
	}
	d, s = d[:end-a], s[:end-a]
	if !f.toRecv {
		reduce3(f.rop, f.rct, d, d, s)
		return
	}
	local := f.buf[fuseListBytes+a : fuseListBytes+end]
	for a < end {
		for f.off[f.ru+1] <= a {
			f.ru++
		}
		u := &f.units[f.ru]
		b := min(end, f.off[f.ru+1])
		lo := a - f.off[f.ru]
		dst := u.recv[lo : lo+b-a]
		reduce3(f.rop, f.rct, dst, local[:b-a], s[:b-a])
		if f.rop == Avg {
			finishAvg(f.rct, dst, c.n)
		}
		local, s, a = local[b-a:], s[b-a:], b
	}
}

// callStart marks, in a count list, a unit that begins its call: two
// ranks that split the same vectors into calls differently disagree.
const callStart = 1 << 31

// listed is u's entry in a count list: its count, with callStart if it
// is its call's first unit.
func (u *unit) listed() uint32 {
	if u.part == 0 {
		return uint32(u.count) | callStart
	}
	return uint32(u.count)
}

// fuseLen is the length of fuseMsg's message of m calls.
func (c *Comm) fuseLen(m int) int {
	if m == 1 {
		return c.fz.off[1]
	}
	return listBytes(m) + c.fz.off[m]
}

// fuseSend sends the message of the first m calls of v to p: inline when
// it is eager, else through p's sender goroutine (flush waits for it).
// Its header is the lead's, with Root -m.
func (c *Comm) fuseSend(lead *call, p int, v []byte, m int) error {
	msg := c.fuseMsg(v, m)
	pe := c.peers[p]
	h := c.headerTo(lead, p)
	h.Count = uint64(c.fz.units[0].count)
	h.Root = -int32(m)
	h.Aux = uint64(len(msg))
	h.Len = h.Aux
	if c.eager(p, len(msg)) {
		pe.inlHdr = h
		if err := pe.link.Send(&pe.inlHdr, msg); err != nil {
			return c.sendErr(lead, p, err)
		}
		return nil
	}
	c.postHdr(p, h, msg)
	return nil
}

// fuseStep sends the first m calls of cur to `to` (none when to < 0),
// receives the message of `from` and folds the calls both carry into data
// (data = cur op theirs, this rank on the left as in recursiveDoubling),
// and returns how many that is.
func (c *Comm) fuseStep(lead *call, ct DType, to, from, m int, cur, data []byte, toRecv bool) (int, error) {
	f := &c.fz
	// Fold a lone message straight from the link when our send is complete
	// before the receive begins, or does not read data (as recursiveDoubling).
	direct := to < 0 || c.eager(to, c.fuseLen(m)) || !overlaps(cur, data) && len(c.fz.units) == 1
	if to >= 0 {
		if err := c.fuseSend(lead, to, cur, m); err != nil {
			return 0, err
		}
	}
	f.toRecv = toRecv
	mt, theirs, err := c.fuseRecv(lead, ct, from, m, cur, data, direct, false)
	f.toRecv = false
	if err != nil {
		return 0, err
	}
	if to >= 0 {
		if err := c.flush(lead, to); err != nil {
			return 0, err
		}
	}
	if theirs != nil {
		end := f.off[mt]
		reduce3(lead.op, ct, data[:end], cur[:end], theirs[:end])
	}
	return mt, nil
}

// fuseResult receives the final result of the partner that absorbed this
// rank's offer (n not a power of two) into data, and returns how many
// calls it holds.
func (c *Comm) fuseResult(lead *call, p, m int, data []byte) (int, error) {
	mt, _, err := c.fuseRecv(lead, 0, p, m, nil, data, false, true)
	return mt, err
}

// fuseRecv receives p's next message of the lead's call and checks it:
// its header must be the lead's fingerprint (a frame of another call is
// a desync, as in recvHeader), and for several calls each of the calls
// both ranks carry must have the same count (another count is a desync
// naming the two calls). It returns how many calls both carry, mt. With
// result, the message is the final result (it may not carry more calls
// than this rank offered) and is copied into data. Otherwise, when direct
// (our send is complete, or reads no data) the message is folded into
// data straight from the link (a fused one through foldRecvd, into the
// receive buffers with c.fz.toRecv), and else returned as theirs, to be
// folded once the send is flushed.
func (c *Comm) fuseRecv(lead *call, ct DType, p, m int, cur, data []byte, direct, result bool) (mt int, theirs []byte, err error) {
	f := &c.fz
	pe := c.peers[p]
	l := pe.link
	h := &pe.recvHdr
	if err := c.nextHeader(p, h); err != nil {
		if isProtocol(err) {
			return 0, nil, fmt.Errorf("comm: from %s: %w", c.info[p], err)
		}
		return 0, nil, c.linkErr(p, err)
	}
	if h.Frame != frameData {
		return 0, nil, c.frameErr(p, h, lead.info(pe.seq).String())
	}
	kt := int(-int64(h.Root))
	want := c.headerTo(lead, p)
	want.Count = uint64(f.units[0].count)
	switch {
	case h.Group != want.Group:
		return 0, nil, c.fuseDesync(lead, p, h, 0, h.Count, "frame of another group")
	case h.Kind != want.Kind || h.DType != want.DType || h.Op != want.Op || h.Count != want.Count || h.Seq != want.Seq || kt < 1:
		detail := ""
		if h.Kind == KindAllReduce && kt > 1 {
			detail = fmt.Sprintf("rank %d sent #%d-#%d fused", p, h.Seq, h.Seq+uint64(kt-1))
		}
		return 0, nil, c.fuseDesync(lead, p, h, 0, h.Count, detail)
	case h.Len != h.Aux:
		return 0, nil, fmt.Errorf("%w: rank %d sent an all-reduce message of %d bytes in a frame of %d", ErrProtocol, p, h.Aux, h.Len)
	}
	one := f.off[1]
	if kt == 1 {
		if h.Aux != uint64(one) {
			return 0, nil, c.fuseDesync(lead, p, h, 0, h.Count, fmt.Sprintf("rank %d sends %d bytes, rank %d expects %d", p, h.Aux, c.me, one))
		}
		switch rr, ok := l.(ReduceReceiver); {
		case result:
			err = l.RecvPayload(data[:one])
		case direct && ok:
			c.rr.base, c.rr.local, c.rr.op, c.rr.ct = uintptr(unsafe.Pointer(unsafe.SliceData(data))), cur, lead.op, ct
			err = rr.RecvReduce(data[:one], c.rrFn)
			c.rr.local = nil
		default:
			theirs = c.scratch(2, one)
			err = l.RecvPayload(theirs)
			if err == nil && direct {
				reduce3(lead.op, ct, data[:one], cur[:one], theirs)
				theirs = nil
			}
		}
		if err != nil {
			return 0, nil, c.linkErr(p, err)
		}
		return 1, theirs, nil
	}
	if kt > maxFuseCalls || h.Aux < uint64(listBytes(kt)) || h.Aux > uint64(fuseListBytes+max(c.cfg.fuseLimit(), 0)) {
		return 0, nil, fmt.Errorf("%w: rank %d sent a fused all-reduce of %d calls in %d bytes (this rank fuses at most %d calls, %d bytes: is Config.FuseBytes the same on every rank?)",
			ErrProtocol, p, kt, h.Aux, maxFuseCalls, c.cfg.fuseLimit())
	}
	lb := listBytes(kt)
	dataLen := int(h.Aux) - lb
	if rr, ok := l.(ReduceReceiver); ok && direct && !result && len(f.units) > 1 {
		// Our vector is the packed one in buf, which has room for any
		// message this rank accepts in front of and after it: fold the
		// message into it as it arrives (foldRecvd), the list checked
		// before any data is combined.
		if cap(f.list) < fuseListBytes {
			f.list = make([]byte, fuseListBytes)
		}
		if f.foldFn == nil {
			f.foldFn = c.foldRecvd
		}
		f.rh, f.rp, f.rlist, f.rkt, f.rm, f.rop, f.rct = h, p, lb, kt, m, lead.op, ct
		f.rparsed, f.rerr, f.ru = false, nil, 0
		err := rr.RecvReduce(f.buf[fuseListBytes-lb:fuseListBytes+dataLen], f.foldFn)
		f.rh = nil
		if err != nil {
			return 0, nil, c.linkErr(p, err)
		}
		if !f.rparsed { // no data: the fold never reached the check
			f.rmt, f.rerr = c.checkList(p, h, kt, f.list[:lb], m, false)
		}
		if f.rerr != nil {
			return 0, nil, f.rerr
		}
		if f.toRecv {
			f.wrote = f.rmt
		}
		return f.rmt, nil, nil
	}
	if cap(f.in) < int(h.Aux) {
		f.in = make([]byte, fuseListBytes+max(c.cfg.fuseLimit(), 0))
	}
	in := f.in[:h.Aux]
	if err := l.RecvPayload(in); err != nil {
		return 0, nil, c.linkErr(p, err)
	}
	theirs = in[lb:]
	if mt, err = c.checkList(p, h, kt, in[:lb], m, result); err != nil {
		return 0, nil, err
	}
	if result {
		copyData(data[:f.off[mt]], theirs[:f.off[mt]])
		return mt, nil, nil
	}
	return mt, theirs, nil
}

// checkList checks the count list of p's fused message of kt units
// (header h) against the message's length and this rank's offer of m
// units, and returns how many units both carry: another count, or
// another call boundary, among those is a desync naming the two calls. A
// result (the final one from the rank that absorbed this one's offer) may
// not carry more units than offered.
func (c *Comm) checkList(p int, h *Header, kt int, list []byte, m int, result bool) (int, error) {
	f := &c.fz
	es := uint64(computeType(f.calls[0].dtype).Size())
	sum := uint64(listBytes(kt))
	listed := func(i int) uint32 { return binary.LittleEndian.Uint32(list[4*i:]) }
	counts := func(i int) uint64 { return uint64(listed(i) &^ callStart) }
	for i := range kt {
		sum += counts(i) * es
	}
	if counts(0) != h.Count || sum != h.Aux {
		return 0, fmt.Errorf("%w: rank %d sent a fused all-reduce whose counts do not match its %d bytes", ErrProtocol, p, h.Aux)
	}
	if result && kt > m {
		return 0, fmt.Errorf("%w: rank %d returned %d fused calls where this rank offered %d", ErrProtocol, p, kt, m)
	}
	mt := min(m, kt)
	for i := 1; i < mt; i++ {
		if listed(i) != f.units[i].listed() {
			detail := fmt.Sprintf("vector %d of a fused message (%d vectors from rank %d, %d offered by rank %d)", i+1, kt, p, m, c.me)
			if counts(i) == uint64(f.units[i].count) {
				detail = fmt.Sprintf("vector %d of a fused message begins a call on one rank and not on the other (coalesced calls split differently)", i+1)
			}
			return 0, c.fuseDesync(f.calls[0], p, h, i, counts(i), detail)
		}
	}
	return mt, nil
}

// fuseDesync is the DesyncError of a fused message from p (header h) that
// does not match this rank's offered unit i: theirs has count.
func (c *Comm) fuseDesync(lead *call, p int, h *Header, i int, count uint64, detail string) error {
	u := &c.fz.units[i]
	seq := c.peers[p].seq + uint64(u.call)
	theirs := CallInfo{Kind: h.Kind, DType: h.DType, Op: h.Op, Count: int(count), Root: int(h.Root), Seq: h.Seq + uint64(u.call)}
	if h.Kind == KindAllReduce && h.Root < 0 {
		theirs.Root = -1
	}
	if h.Kind != KindAllReduce && h.Kind != KindReduceScatter && h.Kind != KindReduce {
		theirs.Op = 0
	}
	mine := u.cl.info(seq)
	mine.Count = u.count
	return &DesyncError{Rank: c.me, Mine: mine, Peer: p, Theirs: theirs, Detail: detail}
}

func isLinkDown(err error) bool { return errors.Is(err, errLinkDown) }

func isProtocol(err error) bool { return errors.Is(err, ErrProtocol) }
