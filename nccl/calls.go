package nccl

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// ncclDataType_t and ncclRedOp_t values (nccl.h).
var (
	ncclTypes = [...]uintptr{comm.Uint8: 1, comm.Int32: 2, comm.Int64: 4, comm.Float16: 6,
		comm.Float32: 7, comm.Float64: 8, comm.BFloat16: 9}
	ncclOps = [...]uintptr{comm.Sum: 0, comm.Prod: 1, comm.Max: 2, comm.Min: 3, comm.Avg: 4}
)

// launch is one NCCL call, made under issueMu with the device bound; it
// returns the call's name (for errors) and result.
type launch func(stream uintptr) (string, Result)

// issue makes the launches on the communicator's stream, after the compute
// stream's work, as one NCCL group when there are several, records one done
// event behind them and returns a handle per launch. A refused or failed
// launch fails the communicator, as every rank must make the same calls.
func (c *Comm) issue(ctx context.Context, ls []launch) []comm.Handle {
	return c.issueAs(ctx, ls, len(ls) > 1)
}

// issueAs is issue with the grouping chosen by the caller: device copies
// (CopyDevice) are never put in an NCCL group, which would defer the NCCL
// calls to ncclGroupEnd while the copies went on the stream at once.
func (c *Comm) issueAs(ctx context.Context, ls []launch, group bool) []comm.Handle {
	hs := make([]comm.Handle, len(ls))
	fill := func(err error) []comm.Handle {
		for i := range hs {
			hs[i] = failedHandle(c, err)
		}
		return hs
	}
	if err := ctx.Err(); err != nil {
		err = fmt.Errorf("%w: nccl: call context: %w", comm.ErrAborted, err)
		c.fail(err)
		return fill(c.Err())
	}
	c.issueMu.Lock()
	if c.closed {
		c.issueMu.Unlock()
		return fill(comm.ErrClosed)
	}
	if err := c.Err(); err != nil || c.released {
		c.issueMu.Unlock()
		if err == nil {
			err = comm.ErrClosed
		}
		return fill(err)
	}
	ref, err := c.launchLocked(ctx, ls, group)
	c.issueMu.Unlock()
	if err != nil {
		c.fail(err)
		return fill(c.Err())
	}
	for i := range hs {
		hs[i] = &Handle{c: c, ref: ref}
	}
	return hs
}

// launchLocked is issue's part under issueMu: the device is bound to this
// thread for the whole sequence, because NCCL's group state and CUDA's
// current context are both per thread, and a goroutine could otherwise move
// between ncclGroupStart and ncclGroupEnd.
func (c *Comm) launchLocked(ctx context.Context, ls []launch, group bool) (*doneRef, error) {
	unbind, err := c.dev.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	cu := &c.lib.cu
	// Start after the work already queued on the compute stream (the
	// kernels that produced the send buffer), without blocking the CPU.
	if err := c.lib.check("cuEventRecord", call(cu.eventRecord, uintptr(c.readyEv), uintptr(c.computeStream(ctx)))); err != nil {
		return nil, err
	}
	if err := c.lib.check("cuStreamWaitEvent", call(cu.streamWaitEvent, uintptr(c.stream), uintptr(c.readyEv), 0)); err != nil {
		return nil, err
	}
	if group {
		if r := Result(call(c.lib.nc.groupStart)); r != Success {
			return nil, c.lib.ncclErr("ncclGroupStart", r, c.nc, c.me)
		}
	}
	var first error
	for _, l := range ls {
		name, r := l(uintptr(c.stream))
		if r == InProgress && !group {
			r = c.settleLocked()
		}
		if r != Success && r != InProgress && first == nil {
			first = c.lib.ncclErr(name, r, c.nc, c.me)
		}
	}
	if group {
		// Always close the group, also after a refused call: NCCL keeps
		// group state per thread.
		r := Result(call(c.lib.nc.groupEnd))
		if r == InProgress {
			r = c.settleLocked()
		}
		if r != Success && first == nil {
			first = c.lib.ncclErr("ncclGroupEnd", r, c.nc, c.me)
		}
	}
	if first != nil {
		return nil, first
	}
	ref := &doneRef{}
	c.pendMu.Lock()
	if k := len(c.free); k > 0 {
		ref.ev = c.free[k-1]
		c.free = c.free[:k-1]
	}
	c.pendMu.Unlock()
	if ref.ev == 0 {
		var e uintptr
		if err := c.lib.check("cuEventCreate", call(cu.eventCreate, uintptr(unsafe.Pointer(&e)), eventDisableTiming)); err != nil {
			return nil, err
		}
		ref.ev = Event(e)
	}
	if err := c.lib.check("cuEventRecord", call(cu.eventRecord, uintptr(ref.ev), uintptr(c.stream))); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		// The call's own context cancels it, which for NCCL means the
		// communicator: there is no taking back one collective.
		ref.stopCtx = context.AfterFunc(ctx, func() {
			c.fail(fmt.Errorf("%w: nccl: call context: %w", comm.ErrAborted, ctx.Err()))
		})
	}
	c.pendMu.Lock()
	if err := c.pendFailed; err != nil {
		// The communicator failed while this call was being launched:
		// fail() has already marked the pending calls, and the abort
		// may complete this call's event without it having run.
		ref.state, ref.err = refFailed, err
		c.spent = append(c.spent, ref.ev)
		ref.ev = 0
		if ref.stopCtx != nil {
			ref.stopCtx()
		}
	} else {
		c.pending = append(c.pending, ref)
	}
	c.pendMu.Unlock()
	return ref, nil
}

// settleLocked waits out ncclInProgress from a non-blocking communicator
// (NCCL may still be connecting peers) and returns the final result.
func (c *Comm) settleLocked() Result {
	for i := 0; ; i++ {
		r := c.asyncErr()
		if r != InProgress {
			return r
		}
		select {
		case <-c.failed:
			return InvalidUsage
		case <-c.boot.Failed():
			return RemoteError
		default:
		}
		if i > 64 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// refuse fails the communicator with an invalid-argument error: the peers
// cannot skip the call this rank refuses.
func (c *Comm) refuse(format string, args ...any) comm.Handle {
	err := fmt.Errorf("%w: nccl: rank %d: %s", comm.ErrInvalidArgument, c.me, fmt.Sprintf(format, args...))
	c.fail(err)
	return failedHandle(c, c.Err())
}

// ptr returns a buffer's device address, checking it is device memory of
// this communicator's device with the expected element type.
func (c *Comm) ptr(what string, b comm.Buffer, dt comm.DType) (uintptr, error) {
	if b == nil {
		return 0, fmt.Errorf("%s buffer is nil", what)
	}
	db, ok := b.(*DeviceBuffer)
	if !ok {
		if _, host := b.Host(); host {
			return 0, fmt.Errorf("%s buffer: %w", what, ErrHostBuffer)
		}
		return 0, fmt.Errorf("%s buffer: %T is not an nccl.DeviceBuffer", what, b)
	}
	if db.dev != c.dev {
		return 0, fmt.Errorf("%s buffer is on device %d, the communicator on %d", what, db.dev.Index, c.dev.Index)
	}
	if db.dt != dt {
		return 0, fmt.Errorf("%s buffer is %v, expected %v", what, db.dt, dt)
	}
	if db.n > 0 && db.ptr == 0 {
		return 0, fmt.Errorf("%s buffer was freed", what)
	}
	return db.ptr, nil
}

// one issues a single launch.
func (c *Comm) one(ctx context.Context, l launch) comm.Handle { return c.issue(ctx, []launch{l})[0] }

// args checks send and recv and the reduction; it returns their addresses.
func (c *Comm) args(call string, send, recv comm.Buffer, op comm.Op) (s, r uintptr, err error) {
	if send == nil || recv == nil {
		return 0, 0, fmt.Errorf("%s: nil buffer", call)
	}
	if !send.DType().Valid() {
		return 0, 0, fmt.Errorf("%s: invalid dtype %v", call, send.DType())
	}
	if op != 0 && !op.Valid() {
		return 0, 0, fmt.Errorf("%s: invalid op %v", call, op)
	}
	if s, err = c.ptr("send", send, send.DType()); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", call, err)
	}
	if r, err = c.ptr("recv", recv, send.DType()); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", call, err)
	}
	return s, r, nil
}

// AllReduce: recv = op over ranks of send (ncclAllReduce).
func (c *Comm) AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) comm.Handle {
	l, err := c.allReduce(send, recv, op)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

// allReduce and the other lower-case builders check a call and return its
// launch without issuing it, so that Comm's methods issue one call and
// Group collects several; the checks run before anything reaches NCCL,
// because a call NCCL refuses mid-group leaves the group half-launched.
func (c *Comm) allReduce(send, recv comm.Buffer, op comm.Op) (launch, error) {
	if !op.Valid() {
		return nil, fmt.Errorf("AllReduce: invalid op %v", op)
	}
	s, r, err := c.args("AllReduce", send, recv, op)
	if err != nil {
		return nil, err
	}
	if send.Len() != recv.Len() {
		return nil, fmt.Errorf("AllReduce: send has %d elements, recv %d", send.Len(), recv.Len())
	}
	// The launch captures addresses and counts, not the Buffers: it runs
	// under issueMu with c.nc read there, which Close and the watcher
	// may have released by then (the issue path checks that first).
	n, dt := uintptr(send.Len()), ncclTypes[send.DType()]
	return func(st uintptr) (string, Result) {
		return "ncclAllReduce", Result(call(c.lib.nc.allReduce, s, r, n, dt, ncclOps[op], c.nc, st))
	}, nil
}

// AllGather: block r of recv = send of rank r (ncclAllGather).
func (c *Comm) AllGather(ctx context.Context, send, recv comm.Buffer) comm.Handle {
	l, err := c.allGather(send, recv)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

func (c *Comm) allGather(send, recv comm.Buffer) (launch, error) {
	s, r, err := c.args("AllGather", send, recv, 0)
	if err != nil {
		return nil, err
	}
	if recv.Len() != c.n*send.Len() {
		return nil, fmt.Errorf("AllGather: recv has %d elements, want %d ranks × %d", recv.Len(), c.n, send.Len())
	}
	n, dt := uintptr(send.Len()), ncclTypes[send.DType()]
	return func(st uintptr) (string, Result) {
		return "ncclAllGather", Result(call(c.lib.nc.allGather, s, r, n, dt, c.nc, st))
	}, nil
}

// ReduceScatter: recv = block Rank() of op over ranks of send
// (ncclReduceScatter).
func (c *Comm) ReduceScatter(ctx context.Context, send, recv comm.Buffer, op comm.Op) comm.Handle {
	l, err := c.reduceScatter(send, recv, op)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

func (c *Comm) reduceScatter(send, recv comm.Buffer, op comm.Op) (launch, error) {
	if !op.Valid() {
		return nil, fmt.Errorf("ReduceScatter: invalid op %v", op)
	}
	s, r, err := c.args("ReduceScatter", send, recv, op)
	if err != nil {
		return nil, err
	}
	if send.Len() != c.n*recv.Len() {
		return nil, fmt.Errorf("ReduceScatter: send has %d elements, want %d ranks × %d", send.Len(), c.n, recv.Len())
	}
	n, dt := uintptr(recv.Len()), ncclTypes[send.DType()]
	return func(st uintptr) (string, Result) {
		return "ncclReduceScatter", Result(call(c.lib.nc.reduceScatter, s, r, n, dt, ncclOps[op], c.nc, st))
	}, nil
}

// Broadcast: recv = send of root (ncclBroadcast). send is read only at
// root; elsewhere it may be nil.
func (c *Comm) Broadcast(ctx context.Context, send, recv comm.Buffer, root int) comm.Handle {
	l, err := c.broadcast(send, recv, root)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

func (c *Comm) broadcast(send, recv comm.Buffer, root int) (launch, error) {
	if root < 0 || root >= c.n {
		return nil, fmt.Errorf("Broadcast: root %d outside %d ranks", root, c.n)
	}
	// Off the root NCCL never reads send; passing recv keeps the
	// address valid for the argument checks.
	if send == nil && c.me != root {
		send = recv
	}
	s, r, err := c.args("Broadcast", send, recv, 0)
	if err != nil {
		return nil, err
	}
	if send.Len() != recv.Len() {
		return nil, fmt.Errorf("Broadcast: send has %d elements, recv %d", send.Len(), recv.Len())
	}
	n, dt := uintptr(recv.Len()), ncclTypes[recv.DType()]
	return func(st uintptr) (string, Result) {
		return "ncclBroadcast", Result(call(c.lib.nc.broadcast, s, r, n, dt, uintptr(root), c.nc, st))
	}, nil
}

// Reduce: recv at root = op over ranks of send (ncclReduce); recv may be
// nil elsewhere.
func (c *Comm) Reduce(ctx context.Context, send, recv comm.Buffer, op comm.Op, root int) comm.Handle {
	if root < 0 || root >= c.n {
		return c.refuse("Reduce: root %d outside %d ranks", root, c.n)
	}
	if !op.Valid() {
		return c.refuse("Reduce: invalid op %v", op)
	}
	if recv == nil && c.me != root {
		recv = send
	}
	s, r, err := c.args("Reduce", send, recv, op)
	if err != nil {
		return c.refuse("%v", err)
	}
	if c.me == root && send.Len() != recv.Len() {
		return c.refuse("Reduce: send has %d elements, recv %d", send.Len(), recv.Len())
	}
	n, dt := uintptr(send.Len()), ncclTypes[send.DType()]
	return c.one(ctx, func(st uintptr) (string, Result) {
		return "ncclReduce", Result(call(c.lib.nc.reduce, s, r, n, dt, ncclOps[op], uintptr(root), c.nc, st))
	})
}

// AllToAll: block p of send goes to rank p, block p of recv comes from p;
// one NCCL group of sends and receives, as torch.distributed does.
func (c *Comm) AllToAll(ctx context.Context, send, recv comm.Buffer) comm.Handle {
	if send == nil || recv == nil || send.Len() != recv.Len() || send.Len()%c.n != 0 {
		return c.refuse("AllToAll: send and recv must have equal lengths, a multiple of %d ranks", c.n)
	}
	// The uniform exchange is the varying one with equal counts: one code
	// path, and NCCL sees the same group of sends and receives either way.
	counts := make([]int, c.n)
	for p := range counts {
		counts[p] = send.Len() / c.n
	}
	return c.AllToAllV(ctx, send, counts, recv, counts)
}

// AllToAllV: sendCounts[p] elements go to rank p, recvCounts[p] come from p,
// as one NCCL group of sends and receives.
func (c *Comm) AllToAllV(ctx context.Context, send comm.Buffer, sendCounts []int, recv comm.Buffer, recvCounts []int) comm.Handle {
	l, err := c.allToAllV(send, sendCounts, recv, recvCounts)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

func (c *Comm) allToAllV(send comm.Buffer, sendCounts []int, recv comm.Buffer, recvCounts []int) (launch, error) {
	s, r, err := c.args("AllToAllV", send, recv, 0)
	if err != nil {
		return nil, err
	}
	if len(sendCounts) != c.n || len(recvCounts) != c.n {
		return nil, fmt.Errorf("AllToAllV: %d send and %d recv counts for %d ranks", len(sendCounts), len(recvCounts), c.n)
	}
	var ts, tr int
	for p := range c.n {
		if sendCounts[p] < 0 || recvCounts[p] < 0 {
			return nil, fmt.Errorf("AllToAllV: negative count for rank %d", p)
		}
		ts += sendCounts[p]
		tr += recvCounts[p]
	}
	if ts > send.Len() || tr > recv.Len() {
		return nil, fmt.Errorf("AllToAllV: counts need %d send and %d recv elements, buffers have %d and %d", ts, tr, send.Len(), recv.Len())
	}
	es, dt := uintptr(send.DType().Size()), ncclTypes[send.DType()]
	sc, rc := append([]int(nil), sendCounts...), append([]int(nil), recvCounts...)
	// In place (the buffers overlap), the receives would overwrite blocks
	// the sends have yet to read: NCCL orders nothing inside a group. The
	// input is copied to staging on the stream first.
	sendBytes := uintptr(ts) * es
	inPlace := s < r+uintptr(recv.Len())*es && r < s+uintptr(send.Len())*es && ts > 0
	return func(st uintptr) (string, Result) {
		if inPlace {
			stage, err := c.stagingLocked(int(sendBytes))
			if err != nil {
				return "cuMemAlloc_v2 (staging)", UnhandledCudaError
			}
			if call(c.lib.cu.memcpyDtoDAsync, stage, s, sendBytes, st) != cudaSuccess {
				return "cuMemcpyDtoDAsync_v2 (staging)", UnhandledCudaError
			}
			s = stage
		}
		// Nested in the caller's group when there is one; NCCL counts
		// the depth.
		if r := Result(call(c.lib.nc.groupStart)); r != Success {
			return "ncclGroupStart", r
		}
		// Zero counts are skipped on both sides (counts agree pairwise),
		// so no empty send waits for a receive that is not posted. The
		// first refusal stops the loop but the group is still closed.
		var so, ro uintptr
		name, res := "", Success
		for p := range c.n {
			if sc[p] > 0 && res == Success {
				name, res = "ncclSend", Result(call(c.lib.nc.send, s+so*es, uintptr(sc[p]), dt, uintptr(p), c.nc, st))
			}
			if rc[p] > 0 && res == Success {
				name, res = "ncclRecv", Result(call(c.lib.nc.recv, r+ro*es, uintptr(rc[p]), dt, uintptr(p), c.nc, st))
			}
			so += uintptr(sc[p])
			ro += uintptr(rc[p])
		}
		if r := Result(call(c.lib.nc.groupEnd)); res == Success && r != Success {
			if r == InProgress {
				r = c.settleLocked()
			}
			if r != Success {
				return "ncclGroupEnd", r
			}
		}
		return name, res
	}, nil
}

// Barrier completes once every rank has issued it: NCCL has no barrier, so
// it is a one-element all-reduce on device scratch memory (as torch's is).
func (c *Comm) Barrier(ctx context.Context) comm.Handle {
	s := c.scratch.ptr
	return c.one(ctx, func(st uintptr) (string, Result) {
		return "ncclAllReduce", Result(call(c.lib.nc.allReduce, s, s, 1, ncclTypes[comm.Float32], ncclOps[comm.Sum], c.nc, st))
	})
}

// Send sends buf to peer (ncclSend).
func (c *Comm) Send(ctx context.Context, buf comm.Buffer, peer int) comm.Handle {
	l, err := c.p2p("Send", buf, peer, false)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

// Recv receives buf from peer (ncclRecv).
func (c *Comm) Recv(ctx context.Context, buf comm.Buffer, peer int) comm.Handle {
	l, err := c.p2p("Recv", buf, peer, false)
	if err != nil {
		return c.refuse("%v", err)
	}
	return c.one(ctx, l)
}

// p2p checks a send or receive. Only inside a group may the peer be this
// rank (NCCL pairs the two halves in one launch; alone they would wait for
// each other).
func (c *Comm) p2p(what string, buf comm.Buffer, peer int, grouped bool) (launch, error) {
	if peer < 0 || peer >= c.n || (peer == c.me && !grouped) {
		return nil, fmt.Errorf("%s: peer %d (rank %d of %d)", what, peer, c.me, c.n)
	}
	if buf == nil {
		return nil, fmt.Errorf("%s: nil buffer", what)
	}
	p, err := c.ptr("the", buf, buf.DType())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	n, dt := uintptr(buf.Len()), ncclTypes[buf.DType()]
	fn, name := c.lib.nc.send, "ncclSend"
	if what == "Recv" {
		fn, name = c.lib.nc.recv, "ncclRecv"
	}
	return func(st uintptr) (string, Result) {
		return name, Result(call(fn, p, n, dt, uintptr(peer), c.nc, st))
	}, nil
}

// stagingLocked returns device memory of at least n bytes for an in-place
// exchange's input; issueMu is held and the device bound. Calls on the
// stream run in order, so one staging buffer serves them all; a larger one
// replaces it, and the old one lives until Close (queued calls may use it).
func (c *Comm) stagingLocked(n int) (uintptr, error) {
	if c.staging != nil && c.staging.Len() >= n {
		return c.staging.ptr, nil
	}
	size := max(n, 2*c.stagingLen())
	var p uintptr
	if err := c.lib.check("cuMemAlloc_v2", call(c.lib.cu.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size))); err != nil {
		return 0, err
	}
	if c.staging != nil {
		c.outgrown = append(c.outgrown, c.staging)
	}
	c.staging = &DeviceBuffer{dev: c.dev, ptr: p, dt: comm.Uint8, n: size, owner: true}
	return p, nil
}

func (c *Comm) stagingLen() int {
	if c.staging == nil {
		return 0
	}
	return c.staging.Len()
}
