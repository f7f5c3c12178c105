package comm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// call is one issued operation; it is also its Handle.
type call struct {
	kind       Kind
	dtype      DType
	op         Op
	count      int // elements of the call as fingerprinted
	root       int // root, or peer for Send/Recv; -1 otherwise
	send, recv []byte
	counts     *vCounts // AllToAllV only
	invalid    error    // set at issue: fails the communicator at its turn
	issued     int64    // ticks()
	// unkicked: issued with IssuerWaits, so the worker was not woken for
	// it; a Wait that cannot run it inline wakes the worker instead.
	unkicked bool

	ctx  context.Context
	hook *ctxHook // the cancellation hook of ctx, nil if ctx never ends

	c   *Comm // runs it; Wait may run it itself (see drain)
	err error // written before state's callDone bit is set
	// doneAt is when the call completed, written with err. It lets a
	// caller that waits late (overlap's executor) know when the network
	// finished without a goroutine parked on every call to stamp it.
	doneAt time.Time

	// Completion without a channel per call: state has callDone once the
	// call has completed and callWaited once a Wait blocks on doneCh,
	// which only such a Wait makes (under mu). A channel made and closed
	// per call was a fifth of issuing and completing a small call; most
	// calls are run by the goroutine that waits for them and never block.
	state  atomic.Uint32
	mu     sync.Mutex
	doneCh chan struct{}
}

// vCounts are an AllToAllV's per-peer element counts. Behind a pointer:
// every call is allocated, and its size decides how often the allocator
// needs fresh pages (each a page fault of a few microseconds on the
// latency path until the first garbage collection recycles memory).
type vCounts struct{ send, recv []int }

// Bits of call.state.
const (
	callDone   = 1
	callWaited = 2
)

var _ Handle = (*call)(nil)

func (cl *call) Wait(ctx context.Context) error {
	if cl.Done() {
		return cl.err
	}
	// If no goroutine is running calls, run this one (and any issued
	// before it) here rather than hand it to the worker and back. Only when
	// giving up on ctx could not come sooner that way: ctx is the call's
	// own context (whose end fails the call anyway) or never ends.
	if d := ctx.Done(); cl.c != nil && (d == nil || d == cl.ctx.Done()) && inlineWait.Load() {
		cl.c.drain(cl)
		if cl.Done() {
			return cl.err
		}
	} else if cl.unkicked {
		// Issued for an inline wait that this one cannot be: hand it to
		// the worker now (a spare wake-up is harmless).
		cl.c.kick()
	}
	ch := cl.waitCh()
	if ch == nil {
		return cl.err
	}
	select {
	case <-ch:
		return cl.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitCh returns the channel finish closes, or nil if the call is done.
func (cl *call) waitCh() chan struct{} {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.doneCh == nil {
		cl.doneCh = make(chan struct{})
	}
	for {
		s := cl.state.Load()
		if s&callDone != 0 {
			return nil
		}
		if cl.state.CompareAndSwap(s, s|callWaited) {
			return cl.doneCh
		}
	}
}

func (cl *call) Done() bool { return cl.state.Load()&callDone != 0 }

// CompletedAt returns when the call completed; the zero time until Done
// (or Wait) has reported it complete. Safe for concurrent use after that.
func (cl *call) CompletedAt() time.Time {
	if !cl.Done() {
		return time.Time{}
	}
	return cl.doneAt
}

func (cl *call) finish(err error) {
	if cl.hook != nil {
		cl.c.unhook(cl.hook)
	}
	cl.err = err
	cl.doneAt = time.Now()
	if cl.state.Or(callDone)&callWaited != 0 {
		cl.mu.Lock()
		close(cl.doneCh)
		cl.mu.Unlock()
	}
}

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
	c.issueMu.RLock()
	defer c.issueMu.RUnlock()
	if c.closed {
		err := c.Err()
		if err == nil {
			err = ErrClosed
		}
		cl.finish(err)
		return cl
	}
	cl.c = c
	if ctx.Done() != nil {
		c.hook(cl)
	}
	_, cl.unkicked = ctx.(issuerWaits)
	c.queue <- cl
	if !cl.unkicked {
		c.kick()
	}
	return cl
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
	cl := &call{kind: KindAllReduce, root: -1}
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r }, always)
	c.checkOp(cl, op)
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// AllGather issues recv = concatenation over ranks of send.
func (c *Comm) AllGather(ctx context.Context, send, recv Buffer) Handle {
	cl := &call{kind: KindAllGather, root: -1}
	c.prepare(cl, send, recv, func(s, r int) bool { return r == s*c.n }, always)
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// ReduceScatter issues recv = block Rank() of op over ranks of send.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv Buffer, op Op) Handle {
	cl := &call{kind: KindReduceScatter, root: -1}
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r*c.n }, always)
	c.checkOp(cl, op)
	if recv != nil {
		cl.count = recv.Len()
	}
	return c.issue(ctx, cl)
}

// Broadcast issues recv = send of root.
func (c *Comm) Broadcast(ctx context.Context, send, recv Buffer, root int) Handle {
	cl := &call{kind: KindBroadcast}
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
	cl := &call{kind: KindReduce}
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
	cl := &call{kind: KindAllToAll, root: -1}
	c.prepare(cl, send, recv, func(s, r int) bool { return s == r && s%c.n == 0 }, always)
	if send != nil {
		cl.count = send.Len()
	}
	return c.issue(ctx, cl)
}

// AllToAllV issues an exchange with per-peer element counts.
func (c *Comm) AllToAllV(ctx context.Context, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) Handle {
	cl := &call{kind: KindAllToAllV, root: -1}
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
	return c.issue(ctx, &call{kind: KindBarrier, dtype: Uint8, root: -1})
}

// Send issues a send of buf to peer.
func (c *Comm) Send(ctx context.Context, buf Buffer, peer int) Handle {
	cl := &call{kind: KindSend}
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
	cl := &call{kind: KindRecv}
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
