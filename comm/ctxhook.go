package comm

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Cancellation hooks. There is no way to skip one collective on one rank,
// so a call whose context ends before it completes fails the communicator
// (and with it the peers' matching call).
//
// One context.AfterFunc per call cost more than the rest of issuing a small
// call: registering and unregistering it takes the context's lock, a map
// insert and delete, and three allocations (2 ranks, 8-byte all-reduce
// through `gorun bench`, whose calls all carry one cancellable context;
// notes/shm-latency.md). Programs issue call after call with the same
// context, so the communicator keeps one hook for the context it saw last
// and counts the calls issued with it that have not finished; the hook
// fails the communicator only if that count is above zero when the context
// ends, which is what per-call hooks did. A call with another context
// replaces the current hook; the one it replaces is unregistered once its
// last call finishes.

// ctxHook is the cancellation hook of one context.
type ctxHook struct {
	ctx     context.Context
	stop    func() bool
	pending atomic.Int64 // calls issued with ctx and not yet finished
	fired   atomic.Bool  // ctx ended: the hook ran (or is running)
	kind    atomic.Int32 // the last call issued with ctx, for the error
}

// hook attaches cl to the hook of its context, registering a new one when
// the current hook belongs to another context or has fired. Safe for
// concurrent issuers.
func (c *Comm) hook(cl *call) {
	var h *ctxHook
	for {
		h = c.ctxHook.Load()
		if h == nil || h.ctx != cl.ctx || h.fired.Load() {
			h = c.newHook(cl.ctx)
			break
		}
		h.pending.Add(1)
		// A concurrent issuer with another context may have replaced h
		// and, seeing no pending call, unregistered it before our count:
		// then take a hook again. (The replacer swaps before it reads the
		// count, we count before we read the current hook: one of the two
		// sees the other.)
		if c.ctxHook.Load() == h {
			break
		}
		c.unhook(h)
	}
	cl.hook = h
	h.kind.Store(int32(cl.kind))
	// The hook may have fired between the check above and the count: it
	// then saw no pending call, so fail here (fired is stored before the
	// hook reads the count).
	if h.fired.Load() {
		c.cancelled(h)
	}
}

// newHook registers a hook for ctx counting one pending call (the
// caller's: counted before the hook is published, so that no concurrent
// replacer finds it idle and unregisters it) and makes it current.
func (c *Comm) newHook(ctx context.Context) *ctxHook {
	h := &ctxHook{ctx: ctx}
	h.pending.Store(1)
	h.stop = context.AfterFunc(ctx, func() {
		h.fired.Store(true)
		if h.pending.Load() > 0 {
			c.cancelled(h)
		}
	})
	if old := c.ctxHook.Swap(h); old != nil && old.pending.Load() == 0 {
		old.stop()
	}
	return h
}

// cancelled fails the communicator for the end of h's context.
func (c *Comm) cancelled(h *ctxHook) {
	c.fail(fmt.Errorf("comm: %v on rank %d cancelled: %w", Kind(h.kind.Load()), c.me, context.Cause(h.ctx)))
}

// unhook is a finished call's release of its hook: a hook that is no
// longer current is unregistered with its last call.
func (c *Comm) unhook(h *ctxHook) {
	if h.pending.Add(-1) == 0 && c.ctxHook.Load() != h {
		h.stop()
	}
}

// dropHook unregisters the current hook (Close: no call will need it).
func (c *Comm) dropHook() {
	if h := c.ctxHook.Swap(nil); h != nil {
		h.stop()
	}
}
