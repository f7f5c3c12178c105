package comm

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// call is one issued operation, from its issue to its completion. Call
// objects are recycled (Comm.newCall): a caller holds a Handle, which names the
// call by its issue number in the communicator (see handlePage), never the
// call object itself.
type call struct {
	kind       Kind
	dtype      DType
	op         Op
	count      int // elements of the call as fingerprinted
	root       int // root, or peer for Send/Recv; -1 otherwise
	send, recv []byte
	counts     *vCounts // AllToAllV only
	// co holds the vectors of a coalesced all-reduce (send and recv are
	// then nil, count their total); behind a pointer, which keeps the
	// call object small.
	co      *coalesced
	invalid error // set at issue: fails the communicator at its turn
	issued  int64 // ticks()
	label   Label // the caller's name for the call (WithLabel), 0 if none

	ctx  context.Context
	hook *ctxHook // the cancellation hook of ctx, nil if ctx never ends

	c *Comm // runs it; Wait may run it itself (see drain)
	// seq is the call's issue number in c (0 for the first), page and
	// slot where its Handle and its result live.
	seq  uint64
	page *handlePage
	slot int
}

// coalesced is what a coalesced all-reduce adds to a call: its vectors,
// how many of them have run (token holder), and its flight record once
// it has started (it may run over several fused messages).
type coalesced struct {
	parts []part
	done  int
	slot  uint64
}

// part is one vector of a coalesced all-reduce.
type part struct {
	send, recv []byte
	count      int
}

// vCounts are an AllToAllV's per-peer element counts. Behind a pointer: it
// keeps the call object small.
type vCounts struct{ send, recv []int }

// Call objects are recycled through each communicator's free list. A
// call used to be its own Handle, one heap object of 176 bytes per call,
// and until the process's first garbage collection (4 MiB of heap, some
// 23,000 small calls) every new span of them landed on pages the process
// had never touched: a page fault of 1-15 µs on this 2-core VM every 23
// calls on each rank, which the peer waited out too. It was the slow
// tail of the first sizes of a sweep (`perf record -e page-faults`: pairs
// of faults in mallocgc and memclrNoHeapPointers under AllReduce, one pair
// per span; 2 ranks, 8-byte all-reduce, notes/shm-latency.md). Recycled,
// a call touches the same few cache lines every time. The list starts
// with freeCalls objects, touched in New, so that a burst of calls issued
// before any completes (`gorun bench` issues 200, then waits) takes no
// fresh memory either; it keeps at most QueueDepth.
const freeCalls = 256

// newCall takes a call object from the free list (or the heap).
func (c *Comm) newCall(kind Kind, root int) *call {
	var cl *call
	c.freeMu.Lock()
	if n := len(c.free); n > 0 {
		cl = c.free[n-1]
		c.free = c.free[:n-1]
	}
	c.freeMu.Unlock()
	if cl == nil {
		cl = new(call)
	}
	cl.kind, cl.root = kind, root
	return cl
}

// recycle returns a completed call to the free list. Nothing refers to it
// any more: handles name the call by its page and slot.
func (c *Comm) recycle(cl *call) {
	*cl = call{}
	c.freeMu.Lock()
	if len(c.free) < cap(c.free) {
		c.free = append(c.free, cl)
	}
	c.freeMu.Unlock()
}

// fillFree gives c its first freeCalls call objects, one slab, touched now.
func (c *Comm) fillFree() {
	c.free = make([]*call, 0, max(c.cfg.QueueDepth, freeCalls))
	slab := make([]call, freeCalls)
	for i := range slab {
		slab[i].root = -1 // touch it: fresh pages fault here, not in a call
		c.free = append(c.free, &slab[i])
	}
}

// pageCalls is how many consecutive calls of a communicator share a
// handlePage.
const pageCalls = 256

// handlePage holds the Handles and the results of pageCalls consecutive
// calls of one communicator (issue numbers first .. first+pageCalls-1).
// A Handle is a pointer to the call's mark, marks[i], whose value is i: a
// Handle finds its page and slot without any per-call object, so issuing
// allocates nothing but a page every pageCalls calls (about 17 bytes per
// call instead of 176; see Comm.newCall), and a Handle stays exact however
// long it is kept: its page, kept alive by the Handle, is never reused.
//
// Calls complete in issue order, so whether call first+i is done is
// whether the communicator's completed count has passed it.
type handlePage struct {
	c     *Comm
	first uint64
	marks [pageCalls]handleMark
	// doneAt[i]: when call i completed, in nanoseconds since c.epoch;
	// written before the completed count passes the call.
	doneAt [pageCalls]int64
	// errs[i]: the error of call i, if it failed; allocated at the page's
	// first failure, stored before the completed count passes the call.
	errs atomic.Pointer[[pageCalls]error]
	// ctxDone[i]: the Done channel of call i's context (nil if it never
	// ends), written at issue; Wait runs the call itself only when its own
	// context could not end sooner (see Wait).
	ctxDone [pageCalls]<-chan struct{}
	// unkicked[i]: call i was issued with IssuerWaits, so the worker was
	// not woken for it; a Wait that cannot run it itself wakes the worker.
	// Written at issue.
	unkicked [pageCalls]bool
	// toWorker[i]: call i was issued with IssuerWaits but is the
	// worker's to run all the same (Comm.handsOff); Wait never runs it.
	// Written at issue.
	toWorker [pageCalls]bool
}

func newHandlePage(c *Comm, first uint64) *handlePage {
	p := &handlePage{c: c, first: first}
	for i := range p.marks {
		p.marks[i] = handleMark(i)
	}
	return p
}

// handleMark is what a Handle points to: the mark of its call in its page.
type handleMark uint8

var _ Handle = (*handleMark)(nil)

// at returns the mark's page and slot: the mark's value is its index in
// marks, so the page starts that many marks before it, at marks' offset.
func (m *handleMark) at() (*handlePage, int) {
	i := int(*m)
	base := unsafe.Add(unsafe.Pointer(m), -i-int(unsafe.Offsetof(handlePage{}.marks)))
	return (*handlePage)(base), i
}

func (p *handlePage) done(i int) bool { return p.c.completed.Load() > p.first+uint64(i) }

func (p *handlePage) err(i int) error {
	if e := p.errs.Load(); e != nil {
		return e[i]
	}
	return nil
}

func (m *handleMark) Done() bool {
	p, i := m.at()
	return p.done(i)
}

func (m *handleMark) Wait(ctx context.Context) error {
	p, i := m.at()
	if p.done(i) {
		return p.err(i)
	}
	c, seq := p.c, p.first+uint64(i)
	// If no goroutine is running calls, run this one (and any issued
	// before it) here rather than hand it to the worker and back. Only when
	// giving up on ctx could not come sooner that way: ctx is the call's
	// own context (whose end fails the call anyway) or never ends.
	if d := ctx.Done(); (d == nil || d == p.ctxDone[i]) && inlineWait.Load() && !p.toWorker[i] {
		c.drain(seq)
		if p.done(i) {
			return p.err(i)
		}
	} else if p.unkicked[i] {
		// Issued for an inline wait that this one cannot be: hand it to
		// the worker now (a spare wake-up is harmless).
		c.kick()
	}
	for {
		ch := c.waitCh(seq)
		if ch == nil {
			return p.err(i)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			c.waiters.Add(-1)
			return ctx.Err()
		}
		c.waiters.Add(-1)
	}
}

// CompletedAt returns when the call completed; the zero time until Done
// (or Wait) has reported it complete. Safe for concurrent use after that.
func (m *handleMark) CompletedAt() time.Time {
	p, i := m.at()
	if !p.done(i) {
		return time.Time{}
	}
	return p.c.epoch.Add(time.Duration(p.doneAt[i]))
}

// waitCh returns a channel closed at the next completion, counting the
// caller in c.waiters (the caller uncounts itself when it stops waiting),
// or nil, uncounted, once call seq is done.
func (c *Comm) waitCh(seq uint64) <-chan struct{} {
	c.waiters.Add(1)
	c.doneMu.Lock()
	if c.doneCh == nil {
		c.doneCh = make(chan struct{})
	}
	ch := c.doneCh
	c.doneMu.Unlock()
	// Counted before this check, so a completion stored after it sees a
	// waiter and closes ch.
	if c.completed.Load() > seq {
		c.waiters.Add(-1)
		return nil
	}
	return ch
}

// finish completes cl with err, the next call in issue order, and
// recycles it.
func (c *Comm) finish(cl *call, err error) {
	if cl.hook != nil {
		c.unhook(cl.hook)
	}
	p, i := cl.page, cl.slot
	p.doneAt[i] = int64(time.Since(c.epoch))
	if err != nil {
		e := p.errs.Load()
		if e == nil {
			e = new([pageCalls]error)
			p.errs.Store(e)
		}
		e[i] = err
	}
	c.completed.Store(cl.seq + 1)
	if c.waiters.Load() > 0 {
		c.doneMu.Lock()
		if c.doneCh != nil {
			close(c.doneCh)
			c.doneCh = nil
		}
		c.doneMu.Unlock()
	}
	c.recycle(cl)
}

// doneHandle is a call that failed at issue (a closed communicator).
type doneHandle struct {
	err error
	at  time.Time
}

func (h *doneHandle) Wait(context.Context) error { return h.err }
func (h *doneHandle) Done() bool                 { return true }
func (h *doneHandle) CompletedAt() time.Time     { return h.at }

func (cl *call) info(seq uint64) CallInfo {
	ci := CallInfo{Kind: cl.kind, DType: cl.dtype, Count: cl.count, Root: cl.root, Seq: seq}
	if cl.reduces() {
		ci.Op = cl.op
	}
	return ci
}

func (cl *call) reduces() bool {
	return cl.kind == KindAllReduce || cl.kind == KindReduceScatter || cl.kind == KindReduce
}

// headerTo is the fingerprint this rank puts on frames to peer p.
func (c *Comm) headerTo(cl *call, p int) Header {
	h := Header{Frame: frameData, Kind: cl.kind, DType: cl.dtype, Root: int32(cl.root),
		Group: c.gid, Seq: c.peers[p].seq, Count: uint64(cl.count)}
	if cl.reduces() {
		h.Op = cl.op
	}
	switch cl.kind {
	case KindAllToAllV:
		h.Count = uint64(cl.counts.send[p])
	case KindSend:
		h.Root = int32(p)
	}
	return h
}

// expectFrom is the fingerprint frames from peer p must carry.
func (c *Comm) expectFrom(cl *call, p int) Header {
	h := c.headerTo(cl, p)
	switch cl.kind {
	case KindAllToAllV:
		h.Count = uint64(cl.counts.recv[p])
	case KindRecv:
		h.Kind = KindSend
		h.Root = int32(c.me)
	}
	return h
}

func hostBytes(b Buffer, what string) ([]byte, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: %s buffer is nil", ErrInvalidArgument, what)
	}
	if !b.DType().Valid() {
		return nil, fmt.Errorf("%w: %s buffer has %v", ErrInvalidArgument, what, b.DType())
	}
	hb, ok := b.Host()
	if !ok {
		return nil, fmt.Errorf("%w (%s)", ErrDeviceBuffer, what)
	}
	if len(hb) != b.Len()*b.DType().Size() {
		return nil, fmt.Errorf("%w: %s buffer has %d bytes for %d %v", ErrInvalidArgument, what, len(hb), b.Len(), b.DType())
	}
	return hb, nil
}

// issue queues cl, or fails it at once when the communicator is closed.
func (c *Comm) issue(ctx context.Context, cl *call) Handle {
	// The issue time is worth a clock read only when the call will wait
	// behind another (the recorder uses the start time otherwise).
	if (len(c.queue) > 0 || c.running.Load()) && !flightOff.Load() {
		cl.issued = ticks()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	cl.ctx = ctx
	cl.label = labelOf(ctx)
	c.issueMu.RLock()
	defer c.issueMu.RUnlock()
	if c.closed {
		err := c.Err()
		if err == nil {
			err = ErrClosed
		}
		c.recycle(cl)
		return &doneHandle{err: err, at: time.Now()}
	}
	cl.c = c
	if ctx.Done() != nil {
		c.hook(cl)
	}
	// Issue numbers follow the queue's order, which is the order calls
	// complete in (see handlePage): numbering and queueing under one lock.
	_, unkicked := ctx.(issuerWaits)
	toWorker := unkicked && c.handsOff(cl)
	unkicked = unkicked && !toWorker
	c.seqMu.Lock()
	seq := c.issued
	c.issued++
	p := c.page
	if p == nil || seq-p.first >= pageCalls {
		p = newHandlePage(c, seq)
		c.page = p
	}
	i := int(seq - p.first)
	p.ctxDone[i] = ctx.Done()
	p.unkicked[i] = unkicked
	p.toWorker[i] = toWorker
	cl.seq, cl.page, cl.slot = seq, p, i
	c.queue <- cl
	c.seqMu.Unlock()
	if !unkicked {
		c.kick()
	}
	return &p.marks[i]
}

// IssuerWaits returns a context, otherwise parent's, for calls whose
// issuer waits for them at once: issue, then Wait with the same context
// (or one that never ends), as a blocking call does. Such a call is not
// handed to the communicator's worker goroutine: the Wait runs it on the
// issuer's goroutine. Handing it over anyway wakes the worker for nothing,
// and with more than one P that wake-up is a futex wake of another thread
// and a second thread on the cores: 2 µs of a 3 µs 8-byte all-reduce
// issued from a C thread (libgorun; notes/torch-backend.md). A call issued
// with it progresses only once it is waited for, or once the worker wakes
// for another call: an issuer that does not Wait at once, or polls Done,
// must not use it.
func IssuerWaits(parent context.Context) context.Context { return issuerWaits{parent} }

// issuerWaits marks a context made by IssuerWaits; it is parent in every
// other respect.
type issuerWaits struct{ context.Context }

func (c *Comm) invalidf(cl *call, format string, args ...any) {
	if cl.invalid == nil {
		cl.invalid = fmt.Errorf("%w: %v on rank %d: %s", ErrInvalidArgument, cl.kind, c.me, fmt.Sprintf(format, args...))
	}
}

// prepare checks the buffers of a send/recv pair of a call: both host, same
// dtype, and the element counts the collective requires.
func (c *Comm) prepare(cl *call, send, recv Buffer, sendLen, recvLen func(s, r int) bool) {
	var err error
	if cl.send, err = hostBytes(send, "send"); err != nil {
		cl.invalid = err
		return
	}
	if cl.recv, err = hostBytes(recv, "recv"); err != nil {
		cl.invalid = err
		return
	}
	cl.dtype = send.DType()
	if recv.DType() != send.DType() {
		c.invalidf(cl, "send is %v but recv is %v", send.DType(), recv.DType())
		return
	}
	if !sendLen(send.Len(), recv.Len()) {
		c.invalidf(cl, "send has %d elements and recv %d", send.Len(), recv.Len())
	}
}

func (c *Comm) checkOp(cl *call, op Op) {
	cl.op = op
	if !op.Valid() {
		c.invalidf(cl, "invalid op %v", op)
	}
}

func (c *Comm) checkRank(cl *call, r int, what string) {
	cl.root = r
	if r < 0 || r >= c.n {
		c.invalidf(cl, "%s %d outside group of %d", what, r, c.n)
		cl.root = -1
	}
}

func always(int, int) bool { return true }

// AllReduce issues recv = op over ranks of send.
func (c *Comm) AllReduce(ctx context.Context, send, recv Buffer, op Op) Handle {
	cl := c.newCall(KindAllReduce, -1)
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r }, always)
	c.checkOp(cl, op)
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// AllReduceCoalesced issues one all-reduce of several vectors: recvs[i] =
// op over ranks of sends[i], for every i, with one Handle and one flight
// record, as if each pair had been issued in turn (so sends[j] may be
// recvs[i] for i < j, and then reads its result). Every buffer has one
// dtype; each pair has one length. Its vectors travel fused (see Fusion in
// the package comment) when they are small, with each other and with
// all-reduces queued next to it; large ones run one after another. Every
// rank must issue it with the same vectors' lengths, as one call.
func (c *Comm) AllReduceCoalesced(ctx context.Context, sends, recvs []Buffer, op Op) Handle {
	cl := c.newCall(KindAllReduce, -1)
	c.checkOp(cl, op)
	switch {
	case len(sends) != len(recvs):
		c.invalidf(cl, "%d send buffers and %d recv buffers", len(sends), len(recvs))
	case len(sends) == 0:
		c.invalidf(cl, "no buffers")
	}
	if cl.invalid == nil {
		cl.co = &coalesced{parts: make([]part, len(sends))}
		for i := range sends {
			var err error
			pt := &cl.co.parts[i]
			if pt.send, err = hostBytes(sends[i], "send"); err != nil {
				cl.invalid = fmt.Errorf("vector %d: %w", i, err)
				break
			}
			if pt.recv, err = hostBytes(recvs[i], "recv"); err != nil {
				cl.invalid = fmt.Errorf("vector %d: %w", i, err)
				break
			}
			if i == 0 {
				cl.dtype = sends[0].DType()
			}
			if sends[i].DType() != cl.dtype || recvs[i].DType() != cl.dtype {
				c.invalidf(cl, "buffers %d are %v and %v, buffers 0 %v", i, sends[i].DType(), recvs[i].DType(), cl.dtype)
				break
			}
			if sends[i].Len() != recvs[i].Len() {
				c.invalidf(cl, "send %d has %d elements and recv %d has %d", i, sends[i].Len(), i, recvs[i].Len())
				break
			}
			pt.count = sends[i].Len()
			cl.count += pt.count
		}
	}
	return c.issue(ctx, cl)
}

// AllGather issues recv = concatenation over ranks of send.
func (c *Comm) AllGather(ctx context.Context, send, recv Buffer) Handle {
	cl := c.newCall(KindAllGather, -1)
	c.prepare(cl, send, recv, func(s, r int) bool { return r == s*c.n }, always)
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// ReduceScatter issues recv = block Rank() of op over ranks of send.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv Buffer, op Op) Handle {
	cl := c.newCall(KindReduceScatter, -1)
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r*c.n }, always)
	c.checkOp(cl, op)
	if recv != nil {
		cl.count = recv.Len()
	}
	return c.issue(ctx, cl)
}

// Broadcast issues recv = send of root.
func (c *Comm) Broadcast(ctx context.Context, send, recv Buffer, root int) Handle {
	cl := c.newCall(KindBroadcast, 0)
	if send == nil {
		send = recv // send is only read at root; non-roots may pass nil
	}
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r }, always)
	c.checkRank(cl, root, "root")
	if recv != nil {
		cl.count = recv.Len()
	}
	return c.issue(ctx, cl)
}

// Reduce issues recv at root = op over ranks of send.
func (c *Comm) Reduce(ctx context.Context, send, recv Buffer, op Op, root int) Handle {
	cl := c.newCall(KindReduce, 0)
	if recv == nil && root != c.me {
		recv = send // recv is only written at root
	}
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r || root != c.me }, always)
	c.checkOp(cl, op)
	c.checkRank(cl, root, "root")
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// AllToAll issues an exchange of equal blocks between every pair of ranks.
func (c *Comm) AllToAll(ctx context.Context, send, recv Buffer) Handle {
	cl := c.newCall(KindAllToAll, -1)
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r && s%c.n == 0 }, always)
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// AllToAllV issues an exchange with per-peer element counts.
func (c *Comm) AllToAllV(ctx context.Context, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) Handle {
	cl := c.newCall(KindAllToAllV, -1)
	c.prepare(cl, send, recv, always, always)
	sum := func(counts []int, what string, limit int) int {
		if len(counts) != c.n {
			c.invalidf(cl, "%d %s for %d ranks", len(counts), what, c.n)
			return 0
		}
		t := 0
		for p, k := range counts {
			if k < 0 {
				c.invalidf(cl, "%s[%d] = %d", what, p, k)
				return 0
			}
			t += k
		}
		if t > limit {
			c.invalidf(cl, "%s add up to %d elements but the buffer has %d", what, t, limit)
		}
		return t
	}
	if cl.invalid == nil {
		cl.count = sum(sendCounts, "sendCounts", send.Len())
		sum(recvCounts, "recvCounts", recv.Len())
	}
	if cl.invalid == nil {
		cl.counts = &vCounts{send: append([]int(nil), sendCounts...), recv: append([]int(nil), recvCounts...)}
		if cl.counts.send[c.me] != cl.counts.recv[c.me] {
			c.invalidf(cl, "sends %d elements to itself but receives %d", cl.counts.send[c.me], cl.counts.recv[c.me])
		}
	}
	return c.issue(ctx, cl)
}

// Barrier issues a call that completes once every rank has issued it.
func (c *Comm) Barrier(ctx context.Context) Handle {
	cl := c.newCall(KindBarrier, -1)
	cl.dtype = Uint8
	return c.issue(ctx, cl)
}

// Send issues a send of buf to peer.
func (c *Comm) Send(ctx context.Context, buf Buffer, peer int) Handle {
	cl := c.newCall(KindSend, 0)
	c.prepare(cl, buf, buf, always, always)
	c.checkRank(cl, peer, "peer")
	if peer == c.me {
		c.invalidf(cl, "send to itself")
	}
	if buf != nil {
		cl.count = buf.Len()
	}
	return c.issue(ctx, cl)
}

// Recv issues a receive into buf from peer; the sizes must match.
func (c *Comm) Recv(ctx context.Context, buf Buffer, peer int) Handle {
	cl := c.newCall(KindRecv, 0)
	c.prepare(cl, buf, buf, always, always)
	c.checkRank(cl, peer, "peer")
	if peer == c.me {
		c.invalidf(cl, "receive from itself")
	}
	if buf != nil {
		cl.count = buf.Len()
	}
	return c.issue(ctx, cl)
}

// WaitAll waits for every handle in order and returns the first error. With
// in-order completion, waiting for the last handle of a group is enough; this
// is for handles of several groups.
func WaitAll(ctx context.Context, hs ...Handle) error {
	var first error
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}
