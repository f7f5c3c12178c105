//go:build cgo

package main

/*
#cgo CFLAGS: -O2
#include <stdint.h>
#include <stdlib.h>
#define GORUN_NO_PROTOTYPES
#include "gorun.h"
void gorunSetError(const char *text, size_t n, int rank);
void gorunClearError(void);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rendezvous"
)

const abiVersion = 1 // GORUN_ABI_VERSION

// dtypeBool is gorun.h's GORUN_BOOL: bytes reduced as logical values.
const dtypeBool = 8

// errOpTimeout is the error of a gorun_wait that gave up (the call goes on).
var errOpTimeout = errors.New("gorun: call timed out")

func init() {
	// The host program (Python, torch's thread pools) owns the cores; a
	// collective needs a couple of threads to progress. GOMAXPROCS in the
	// environment wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(min(2, runtime.NumCPU()))
	}
	// Calls come from the host program's threads (comm.SetForeignCallers).
	comm.SetForeignCallers(true)
}

// setErr records err as the calling thread's error text and returns its
// status. ce (may be nil) maps group ranks in err to world ranks.
func setErr(err error, ce *commEntry) C.int {
	err = nameLost(err, ce)
	code, rank := classify(err, ce)
	text := err.Error()
	if len(text) == 0 {
		text = "gorun: unknown error"
	}
	// A pointer to a Go string's bytes may be passed to C for the duration
	// of the call; gorunSetError copies them.
	C.gorunSetError((*C.char)(unsafe.Pointer(unsafe.StringData(text))), C.size_t(len(text)), C.int(rank))
	return C.int(code)
}

// classify maps an error to a status and the world rank it is about (-1).
func classify(err error, ce *commEntry) (int, int) {
	worldRank := func(r int) int {
		if ce != nil && r >= 0 && r < ce.c.Size() {
			return ce.c.Group().GlobalRank(r)
		}
		return -1
	}
	var (
		de *comm.DesyncError
		pe *comm.PeerError
		le *rendezvous.LostError
		lf *rendezvous.LeftError
		se *comm.StallError
	)
	rank := -1
	switch {
	case errors.As(err, &de):
		rank = worldRank(de.Peer)
	case errors.As(err, &se):
		// timeout_ms ran out (comm's StallTimeout): name the first rank
		// that had not reached the call, if the diagnosis found one.
		if len(se.Behind) > 0 {
			rank = worldRank(se.Behind[0])
		}
	case errors.As(err, &le):
		rank = le.Rank
	case errors.As(err, &pe):
		rank = pe.WorldRank
	case errors.As(err, &lf):
		rank = lf.Rank
	}
	switch {
	case errors.Is(err, comm.ErrDesync):
		return statusDesync, rank
	case errors.Is(err, errInvalid), errors.Is(err, errNotInit), errors.Is(err, comm.ErrInvalidArgument):
		return statusInvalid, rank
	case errors.Is(err, errOpTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, comm.ErrStalled):
		return statusTimeout, rank
	case errors.Is(err, comm.ErrPeerLost), errors.Is(err, rendezvous.ErrLost), errors.Is(err, rendezvous.ErrLeft):
		return statusPeerLost, rank
	case pe != nil && errors.Is(err, comm.ErrAborted):
		return statusAborted, rank
	case pe != nil:
		return statusPeerLost, rank // a peer that closed or broke its link mid-call
	case errors.Is(err, comm.ErrAborted):
		return statusAborted, rank
	case errors.Is(err, comm.ErrClosed), errors.Is(err, rendezvous.ErrClosed):
		return statusClosed, rank
	}
	return statusInternal, rank
}

// lostWait bounds how long a failed call waits for the membership to name a
// lost rank; well inside the 5 s in which a survivor must hear of a death.
const lostWait = 2 * time.Second

// nameLost makes a failure caused by a death name the dead rank. A survivor
// often hears of a death second-hand — a peer's abort frame, or a link that
// the aborting peer closed before its reason arrived — which names the
// messenger, not the dead rank. The rendezvous declares the dead rank lost
// within moments (a host's ranks are attached to its leader by a socket), so
// wait briefly for the group's verdict and add it.
func nameLost(err error, ce *commEntry) error {
	var (
		pe *comm.PeerError
		le *rendezvous.LostError
	)
	if ce == nil || errors.As(err, &le) || errors.Is(err, comm.ErrDesync) || errors.Is(err, comm.ErrInvalidArgument) {
		return err
	}
	if !errors.As(err, &pe) && !errors.Is(err, comm.ErrPeerLost) {
		return err
	}
	g := ce.c.Group()
	select {
	case <-g.Failed():
	case <-time.After(lostWait):
		return err
	}
	if ge := g.Err(); errors.As(ge, &le) {
		return fmt.Errorf("%w; the cause: %w", err, ge)
	}
	return err
}

// guard turns a panic into GORUN_ERR_INTERNAL: a Go panic must never unwind
// into C, and the library never ends the host process.
func guard(rc *C.int) {
	if p := recover(); p != nil {
		*rc = setErr(fmt.Errorf("gorun: internal error (a bug, please report): %v\n%s", p, debug.Stack()), nil)
	}
}

// ok clears the thread's error text for a successful call.
func ok() C.int {
	C.gorunClearError()
	return statusOK
}

//export gorun_abi_version
func gorun_abi_version() C.int { return abiVersion }

//export gorun_init
func gorun_init(config *C.char, world *C.gorun_comm_t) (rc C.int) {
	defer guard(&rc)
	if world == nil {
		return setErr(fmt.Errorf("%w: gorun_init: world is NULL", errInvalid), nil)
	}
	var cfg string
	if config != nil {
		cfg = C.GoString(config)
	}
	st, err := parseSettings(cfg)
	if err != nil {
		return setErr(err, nil)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.sess != nil {
		if reg.sess.st != st {
			return setErr(fmt.Errorf("%w: gorun_init: already initialized with other settings (finalize first)", errInvalid), nil)
		}
		*world = C.gorun_comm_t(reg.worldH)
		return ok()
	}
	s, err := start(context.Background(), st)
	if err != nil {
		setErr(fmt.Errorf("gorun: joining the world: %w", err), nil)
		return statusInit
	}
	if s.trace, err = newTraceSet(s.world().Group().GlobalRank(s.world().Rank())); err != nil {
		_ = s.close()
		setErr(err, nil)
		return statusInit
	}
	s.trace.add(s.world(), "world")
	reg.sess = s
	reg.worldH = reg.comms.Add(&commEntry{c: s.world(), world: true, close: s.world().Close})
	*world = C.gorun_comm_t(reg.worldH)
	return ok()
}

//export gorun_finalize
func gorun_finalize() (rc C.int) {
	defer guard(&rc)
	closeMatchers()
	reg.mu.Lock()
	s := reg.sess
	reg.sess, reg.worldH = nil, 0
	reg.comms.Clear()
	reg.reqs.Clear()
	reg.mu.Unlock()
	if s == nil {
		return ok() // finalizing twice is harmless
	}
	// The rank closes subgroups (newest first), the world communicator and
	// the membership: the reverse of how they were made.
	err := s.close()
	// The trace is written even after a failure: that is when it is read.
	if terr := s.trace.write(s.world().Group().GlobalRank(s.world().Rank())); err == nil {
		err = terr
	}
	if err != nil {
		return setErr(fmt.Errorf("gorun: finalize: %w", err), nil)
	}
	return ok()
}

//export gorun_report_step
func gorun_report_step(step C.longlong) (rc C.int) {
	defer guard(&rc)
	reg.mu.Lock()
	s := reg.sess
	reg.mu.Unlock()
	if s == nil {
		return setErr(fmt.Errorf("%w: gorun_report_step: not initialized (call gorun_init first)", errInvalid), nil)
	}
	if step < 0 {
		return setErr(fmt.Errorf("%w: gorun_report_step: step %d is negative", errInvalid, int64(step)), nil)
	}
	s.r.ReportStep(int(step))
	return ok()
}

//export gorun_comm_rank
func gorun_comm_rank(h C.gorun_comm_t, rank *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(err, nil)
	}
	if rank == nil {
		return setErr(fmt.Errorf("%w: gorun_comm_rank: rank is NULL", errInvalid), nil)
	}
	*rank = C.int(e.c.Rank())
	return ok()
}

//export gorun_comm_size
func gorun_comm_size(h C.gorun_comm_t, size *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(err, nil)
	}
	if size == nil {
		return setErr(fmt.Errorf("%w: gorun_comm_size: size is NULL", errInvalid), nil)
	}
	*size = C.int(e.c.Size())
	return ok()
}

//export gorun_comm_world_rank
func gorun_comm_world_rank(h C.gorun_comm_t, r C.int, out *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(err, nil)
	}
	if out == nil || r < 0 || int(r) >= e.c.Size() {
		return setErr(fmt.Errorf("%w: gorun_comm_world_rank: rank %d of a group of %d (or out is NULL)", errInvalid, r, e.c.Size()), nil)
	}
	*out = C.int(e.c.Group().GlobalRank(int(r)))
	return ok()
}

//export gorun_comm_group
func gorun_comm_group(h C.gorun_comm_t, ranks *C.int, n C.int, tag *C.char, out *C.gorun_comm_t) (rc C.int) {
	defer guard(&rc)
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(err, nil)
	}
	if !e.world {
		return setErr(fmt.Errorf("%w: gorun_comm_group: groups are made from the world communicator", errInvalid), nil)
	}
	if out == nil || n <= 0 || ranks == nil {
		return setErr(fmt.Errorf("%w: gorun_comm_group: need n > 0 ranks and an out handle", errInvalid), nil)
	}
	list := make([]int, int(n))
	for i, r := range unsafe.Slice(ranks, int(n)) {
		list[i] = int(r)
	}
	reg.mu.Lock()
	s := reg.sess
	reg.mu.Unlock()
	if s == nil {
		return setErr(errNotInit, nil)
	}
	var t string
	if tag != nil {
		t = C.GoString(tag)
	}
	c, err := s.newComm(context.Background(), list, t)
	if err != nil {
		return setErr(fmt.Errorf("gorun_comm_group %v: %w", list, err), nil)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.sess != s { // finalized meanwhile
		_ = c.Close()
		return setErr(fmt.Errorf("%w: gorun_comm_group: finalized while connecting", comm.ErrClosed), nil)
	}
	// Freed, the communicator leaves the rank's list: gorun_comm_free reports its
	// failure once, and gorun_finalize reports only what is still open.
	s.groups++
	s.trace.add(c, groupName(c, s.groups))
	*out = C.gorun_comm_t(reg.comms.Add(&commEntry{c: c, close: func() error { return s.r.CloseComm(c) }}))
	return ok()
}

//export gorun_comm_abort
func gorun_comm_abort(h C.gorun_comm_t, reason *C.char) (rc C.int) {
	defer guard(&rc)
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(err, nil)
	}
	var why error
	if reason != nil {
		why = errors.New(C.GoString(reason))
	}
	e.c.Abort(why)
	return ok()
}

//export gorun_comm_free
func gorun_comm_free(h C.gorun_comm_t) (rc C.int) {
	defer guard(&rc)
	reg.mu.Lock()
	e, err := reg.comms.Get(int64(h))
	switch {
	case reg.sess == nil:
		reg.mu.Unlock()
		return setErr(errNotInit, nil)
	case err != nil:
		reg.mu.Unlock()
		return setErr(fmt.Errorf("%w: gorun_comm_free: %w", errInvalid, err), nil)
	case e.world:
		reg.mu.Unlock()
		return setErr(fmt.Errorf("%w: gorun_comm_free: the world communicator is closed by gorun_finalize", errInvalid), nil)
	}
	reg.comms.Drop(int64(h))
	reg.mu.Unlock()
	if err := e.close(); err != nil {
		return setErr(err, e)
	}
	return ok()
}

// buffer views C memory as a comm.Buffer of count elements of dt. A NULL
// pointer is allowed only where the call ignores the buffer (nilOK) or for a
// count of zero.
func buffer(p unsafe.Pointer, count C.size_t, dt comm.DType, what string, nilOK bool) (comm.Buffer, error) {
	if p == nil {
		if nilOK {
			return nil, nil
		}
		if count != 0 {
			return nil, fmt.Errorf("%w: %s is NULL with count %d", errInvalid, what, count)
		}
		return comm.Alloc(dt, 0), nil
	}
	es := uint64(dt.Size())
	if uint64(count) > math.MaxInt/es {
		return nil, fmt.Errorf("%w: %s: count %d is too large", errInvalid, what, count)
	}
	return comm.Bytes(dt, unsafe.Slice((*byte)(p), int(uint64(count)*es)))
}

// dtypeOp maps the C dtype and op; bool becomes uint8 with its logical
// reductions. op 0 means "no reduction".
func dtypeOp(dt, op C.int) (comm.DType, comm.Op, error) {
	if dt == dtypeBool {
		switch comm.Op(op) {
		case 0:
			return comm.Uint8, 0, nil
		case comm.Sum, comm.Max:
			return comm.Uint8, comm.Max, nil
		case comm.Prod, comm.Min:
			return comm.Uint8, comm.Min, nil
		}
		return 0, 0, fmt.Errorf("%w: op %v is not defined for bool", errInvalid, comm.Op(op))
	}
	d := comm.DType(dt)
	if dt < 0 || dt > 255 || !d.Valid() {
		return 0, 0, fmt.Errorf("%w: unknown dtype %d (see gorun_dtype)", errInvalid, dt)
	}
	if op != 0 && (op < 0 || op > 255 || !comm.Op(op).Valid()) {
		return 0, 0, fmt.Errorf("%w: unknown op %d (see gorun_op)", errInvalid, op)
	}
	return d, comm.Op(op), nil
}

// issue runs one call: do issues it, then issue either waits for it (req ==
// NULL) or returns a request.
//
// No context is made per call. A timeout context per call (timeout_ms) cost
// more than the collective itself: a timer, an error text, and comm's
// cancellation hook, whose end runs in a goroutine of its own that wakes
// another thread (8-byte all-reduce from Python, 1 rank: 2.9 µs per library
// call with it, 1.1 µs without). timeout_ms is comm's StallTimeout instead
// (session.go): the communicator's watchdog, which looks at the running call
// anyway, fails a call that has run that long.
//
// label is the call's flight record label (takeLabel), 0 for none.
func issue(h C.gorun_comm_t, what string, label comm.Label, req *C.gorun_request_t,
	do func(ctx context.Context, e *commEntry) (comm.Handle, error)) C.int {
	e, err := reg.comm(int64(h))
	if err != nil {
		return setErr(fmt.Errorf("gorun_%s: %w", what, err), nil)
	}
	// req == NULL: this thread waits at once, so comm runs the call here
	// when nothing else is running, without waking its worker goroutine
	// (and with it a second thread) for nothing (comm.IssuerWaits).
	ctx, err := issueCtx(label, req == nil)
	if err != nil {
		return setErr(fmt.Errorf("gorun_%s: %w", what, err), e)
	}
	hd, err := do(ctx, e)
	if err != nil {
		return setErr(fmt.Errorf("gorun_%s: %w", what, err), e)
	}
	if req == nil {
		if err := hd.Wait(ctx); err != nil {
			return setErr(err, e)
		}
		return ok()
	}
	*req = C.gorun_request_t(reg.reqs.Add(&reqEntry{h: hd, c: e, what: what}))
	return ok()
}

//export gorun_allreduce
func gorun_allreduce(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype, op C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "allreduce", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, o, err := dtypeOp(dtype, op)
		if err != nil {
			return nil, err
		}
		if o == 0 {
			return nil, fmt.Errorf("%w: op 0", errInvalid)
		}
		s, err := buffer(send, count, dt, "send", false)
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, count, dt, "recv", false)
		if err != nil {
			return nil, err
		}
		return e.c.AllReduce(ctx, s, r, o), nil
	})
}

//export gorun_allgather
func gorun_allgather(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "allgather", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, _, err := dtypeOp(dtype, 0)
		if err != nil {
			return nil, err
		}
		s, err := buffer(send, count, dt, "send", false)
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, count*C.size_t(e.c.Size()), dt, "recv", false)
		if err != nil {
			return nil, err
		}
		return e.c.AllGather(ctx, s, r), nil
	})
}

//export gorun_reduce_scatter
func gorun_reduce_scatter(h C.gorun_comm_t, send, recv unsafe.Pointer, recvcount C.size_t, dtype, op C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "reduce_scatter", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, o, err := dtypeOp(dtype, op)
		if err != nil {
			return nil, err
		}
		if o == 0 {
			return nil, fmt.Errorf("%w: op 0", errInvalid)
		}
		s, err := buffer(send, recvcount*C.size_t(e.c.Size()), dt, "send", false)
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, recvcount, dt, "recv", false)
		if err != nil {
			return nil, err
		}
		return e.c.ReduceScatter(ctx, s, r, o), nil
	})
}

//export gorun_broadcast
func gorun_broadcast(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype, root C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "broadcast", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, _, err := dtypeOp(dtype, 0)
		if err != nil {
			return nil, err
		}
		if err := checkRoot(e, root); err != nil {
			return nil, err
		}
		s, err := buffer(send, count, dt, "send", int(root) != e.c.Rank())
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, count, dt, "recv", false)
		if err != nil {
			return nil, err
		}
		return e.c.Broadcast(ctx, s, r, int(root)), nil
	})
}

//export gorun_reduce
func gorun_reduce(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype, op, root C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "reduce", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, o, err := dtypeOp(dtype, op)
		if err != nil {
			return nil, err
		}
		if o == 0 {
			return nil, fmt.Errorf("%w: op 0", errInvalid)
		}
		if err := checkRoot(e, root); err != nil {
			return nil, err
		}
		s, err := buffer(send, count, dt, "send", false)
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, count, dt, "recv", int(root) != e.c.Rank())
		if err != nil {
			return nil, err
		}
		return e.c.Reduce(ctx, s, r, o, int(root)), nil
	})
}

// rootCounts returns counts of n entries: k at root, 0 elsewhere.
func rootCounts(n, root, k int) []int {
	c := make([]int, n)
	c[root] = k
	return c
}

// fullCounts returns counts of n entries, all k.
func fullCounts(n, k int) []int {
	c := make([]int, n)
	for i := range c {
		c[i] = k
	}
	return c
}

// checkRoot rejects a root outside the group before anything is issued.
func checkRoot(e *commEntry, root C.int) error {
	if root < 0 || int(root) >= e.c.Size() {
		return fmt.Errorf("%w: root %d outside a group of %d", errInvalid, root, e.c.Size())
	}
	return nil
}

//export gorun_gather
func gorun_gather(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype, root C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "gather", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		return rooted(ctx, e, send, recv, count, dtype, root, true)
	})
}

//export gorun_scatter
func gorun_scatter(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype, root C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "scatter", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		return rooted(ctx, e, send, recv, count, dtype, root, false)
	})
}

// rooted issues a gather (gather true) or a scatter as an all-to-all-v in
// which only root's side has n blocks: in a gather every rank sends count
// elements to root and only root receives; a scatter is the mirror image,
// root sending block p to rank p. One message per rank, no extra copy.
func rooted(ctx context.Context, e *commEntry, send, recv unsafe.Pointer, count C.size_t, dtype, root C.int, gather bool) (comm.Handle, error) {
	dt, _, err := dtypeOp(dtype, 0)
	if err != nil {
		return nil, err
	}
	if err := checkRoot(e, root); err != nil {
		return nil, err
	}
	n, me, k := e.c.Size(), e.c.Rank(), int(count)
	// The one-block side (every rank's) and the n-block side (root's only).
	onePtr, oneName, manyPtr, manyName := send, "send", recv, "recv"
	if !gather {
		onePtr, oneName, manyPtr, manyName = recv, "recv", send, "send"
	}
	one, err := buffer(onePtr, count, dt, oneName, false)
	if err != nil {
		return nil, err
	}
	manyCounts := make([]int, n)
	many := comm.Alloc(dt, 0)
	if me == int(root) {
		if many, err = buffer(manyPtr, count*C.size_t(n), dt, manyName, false); err != nil {
			return nil, err
		}
		manyCounts = fullCounts(n, k)
	}
	oneCounts := rootCounts(n, int(root), k)
	if gather {
		return e.c.AllToAllV(ctx, one, oneCounts, many, manyCounts), nil
	}
	return e.c.AllToAllV(ctx, many, manyCounts, one, oneCounts), nil
}

//export gorun_alltoall
func gorun_alltoall(h C.gorun_comm_t, send, recv unsafe.Pointer, count C.size_t, dtype C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "alltoall", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, _, err := dtypeOp(dtype, 0)
		if err != nil {
			return nil, err
		}
		if int(count)%e.c.Size() != 0 {
			return nil, fmt.Errorf("%w: count %d is not a multiple of the group size %d", errInvalid, count, e.c.Size())
		}
		s, err := buffer(send, count, dt, "send", false)
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, count, dt, "recv", false)
		if err != nil {
			return nil, err
		}
		return e.c.AllToAll(ctx, s, r), nil
	})
}

//export gorun_alltoallv
func gorun_alltoallv(h C.gorun_comm_t, send unsafe.Pointer, sendcounts *C.size_t, recv unsafe.Pointer, recvcounts *C.size_t, dtype C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "alltoallv", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		dt, _, err := dtypeOp(dtype, 0)
		if err != nil {
			return nil, err
		}
		if sendcounts == nil || recvcounts == nil {
			return nil, fmt.Errorf("%w: sendcounts or recvcounts is NULL", errInvalid)
		}
		n := e.c.Size()
		counts := func(p *C.size_t, what string) ([]int, C.size_t, error) {
			out := make([]int, n)
			var total C.size_t
			for i, v := range unsafe.Slice(p, n) {
				if uint64(v) > math.MaxInt32*uint64(1<<16) {
					return nil, 0, fmt.Errorf("%w: %s[%d] = %d is too large", errInvalid, what, i, v)
				}
				out[i] = int(v)
				total += v
			}
			return out, total, nil
		}
		sc, st, err := counts(sendcounts, "sendcounts")
		if err != nil {
			return nil, err
		}
		rcs, rt, err := counts(recvcounts, "recvcounts")
		if err != nil {
			return nil, err
		}
		s, err := buffer(send, st, dt, "send", false)
		if err != nil {
			return nil, err
		}
		r, err := buffer(recv, rt, dt, "recv", false)
		if err != nil {
			return nil, err
		}
		return e.c.AllToAllV(ctx, s, sc, r, rcs), nil
	})
}

//export gorun_barrier
func gorun_barrier(h C.gorun_comm_t, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "barrier", 0, req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		return e.c.Barrier(ctx), nil
	})
}

//export gorun_send
func gorun_send(h C.gorun_comm_t, buf unsafe.Pointer, count C.size_t, dtype, peer C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "send", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		return p2p(ctx, e, buf, count, dtype, peer, e.c.Send)
	})
}

//export gorun_recv
func gorun_recv(h C.gorun_comm_t, buf unsafe.Pointer, count C.size_t, dtype, peer C.int, req *C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	return issue(h, "recv", takeLabel(&dtype), req, func(ctx context.Context, e *commEntry) (comm.Handle, error) {
		return p2p(ctx, e, buf, count, dtype, peer, e.c.Recv)
	})
}

func p2p(ctx context.Context, e *commEntry, buf unsafe.Pointer, count C.size_t, dtype, peer C.int,
	call func(context.Context, comm.Buffer, int) comm.Handle) (comm.Handle, error) {
	dt, _, err := dtypeOp(dtype, 0)
	if err != nil {
		return nil, err
	}
	if peer < 0 || int(peer) >= e.c.Size() || int(peer) == e.c.Rank() {
		return nil, fmt.Errorf("%w: peer %d (this is rank %d of %d)", errInvalid, peer, e.c.Rank(), e.c.Size())
	}
	b, err := buffer(buf, count, dt, "buf", false)
	if err != nil {
		return nil, err
	}
	return call(ctx, b, int(peer)), nil
}

//export gorun_test
func gorun_test(r C.gorun_request_t, done *C.int) (rc C.int) {
	defer guard(&rc)
	e, err := reg.req(int64(r))
	if err != nil {
		return setErr(err, nil)
	}
	if done == nil {
		return setErr(fmt.Errorf("%w: gorun_test: done is NULL", errInvalid), nil)
	}
	if !e.h.Done() {
		*done = 0
		return ok()
	}
	*done = 1
	// Done: Wait returns at once with the call's result.
	if err := e.h.Wait(context.Background()); err != nil {
		return setErr(err, e.c)
	}
	return ok()
}

//export gorun_wait
func gorun_wait(r C.gorun_request_t, timeoutMs C.int64_t) (rc C.int) {
	defer guard(&rc)
	e, err := reg.req(int64(r))
	if err != nil {
		return setErr(err, nil)
	}
	if timeoutMs < 0 {
		if err := e.h.Wait(context.Background()); err != nil {
			return setErr(err, e.c)
		}
		return ok()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeoutMs)*time.Millisecond)
	defer cancel()
	if err := e.h.Wait(ctx); err == nil {
		return ok()
	}
	if !e.h.Done() {
		return setErr(fmt.Errorf("%w: gorun_wait: %s not complete after %d ms (it is still running)", errOpTimeout, e.what, timeoutMs), e.c)
	}
	// It completed as the wait gave up: report the call's own result.
	if err := e.h.Wait(context.Background()); err != nil {
		return setErr(err, e.c)
	}
	return ok()
}

//export gorun_request_free
func gorun_request_free(r C.gorun_request_t) (rc C.int) {
	defer guard(&rc)
	// A call still running goes on (bounded by timeout_ms); only its
	// request is gone.
	if _, err := reg.reqs.Take(int64(r)); err != nil {
		return setErr(invalidHandle(err), nil)
	}
	return ok()
}
