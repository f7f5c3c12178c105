package nccl

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
)

// Bootstrap is what New needs from the rendezvous: the group, its failure
// signal, and a small all-gather to hand rank 0's unique id to the others
// (over gossip, or a host leader's local socket). *rendezvous.World and
// *rendezvous.Group satisfy it.
type Bootstrap interface {
	comm.Group
	// AllGather gives every member every member's payload, in group rank
	// order. Blocks; fails when a member is lost.
	AllGather(ctx context.Context, payload []byte) ([][]byte, error)
}

// BootstrapFor returns g as a Bootstrap: g itself when it has AllGather
// (the rendezvous' World and Group), or, for a group of one (a rank running
// alone), a bootstrap that needs no messages.
func BootstrapFor(g comm.Group) (Bootstrap, error) {
	if b, ok := g.(Bootstrap); ok {
		return b, nil
	}
	if g != nil && g.Size() == 1 {
		return alone{g}, nil
	}
	return nil, fmt.Errorf("%w: nccl: a %T of %d ranks cannot share a unique id (use the rendezvous World or a Group from it)",
		comm.ErrInvalidArgument, g, g.Size())
}

// Notifier is what a Bootstrap may offer so that an abort on a live rank
// reaches its peers at once (*rendezvous.World and *rendezvous.Group do):
// Notify sends text on topic to every other member, Noticed reports the
// first notice on topic from another member. Without it a peer learns of
// the abort only when this rank's process ends or its own NCCL call fails.
type Notifier interface {
	Notify(ctx context.Context, topic, text string) error
	Noticed(topic string) (<-chan struct{}, func() (from int, text string))
}

// NotifyTimeout bounds how long a failed communicator spends telling its
// peers (Notifier.Notify) before it gives up on the slow ones.
const NotifyTimeout = 3 * time.Second

// alone is the Bootstrap of a group of one.
type alone struct{ comm.Group }

func (alone) AllGather(_ context.Context, p []byte) ([][]byte, error) { return [][]byte{p}, nil }

// Comm is the Communicator on GPUs: one NCCL communicator, one CUDA stream
// of its own, device buffers. See the package documentation for the
// ordering and failure contract.
type Comm struct {
	lib  *Library
	dev  *Device
	cfg  Config
	boot Bootstrap
	log  zerolog.Logger
	me   int
	n    int

	// issueMu serializes every use of the NCCL communicator from this side
	// (launches, finalize, abort): NCCL does not allow two threads in one
	// communicator at once. Lock order: issueMu, then pendMu.
	issueMu sync.Mutex
	nc      uintptr // ncclComm_t; 0 once aborted or destroyed
	stream  Stream
	readyEv Event
	scratch *DeviceBuffer // Barrier's one float32
	// staging holds an in-place exchange's input (AllToAll(V)); grown on
	// demand, and the outgrown ones kept until Close, since calls still
	// queued on the stream may read them.
	staging  *DeviceBuffer
	outgrown []*DeviceBuffer
	closed   bool
	released bool // nc aborted or destroyed

	// pendMu guards the issued calls not yet seen complete, in issue order,
	// and the events they use. One done event per issue (a grouped issue
	// shares one), recycled once the call is seen complete: calls complete
	// in stream order, so a completed call completes every earlier one.
	pendMu     sync.Mutex
	pending    []*doneRef
	free       []Event
	spent      []Event // events of calls that failed; destroyed at Close
	pendFailed error   // the failure, once fail has marked pending calls

	failOnce sync.Once
	failed   chan struct{} // closed once failErr is set
	failErr  error

	// topic names this communicator among its group's notices (from the
	// unique id, which every member shares and no other communicator
	// has); peerAborted is closed by a notice, fromPeer is set when the
	// failure was one (so it is not sent back).
	topic       string
	peerAborted <-chan struct{}
	peerNotice  func() (int, string)
	fromPeer    bool

	stop      chan struct{} // closed by Close: the watcher returns
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ comm.Communicator = (*Comm)(nil)

// doneRef is one issue's completion, shared by the handles of a grouped
// issue. Fields are guarded by Comm.pendMu.
type doneRef struct {
	ev      Event
	state   int // refPending, refDone, refFailed
	err     error
	stopCtx func() bool // unregisters the call context's abort
}

const (
	refPending = iota
	refDone
	refFailed
)

// New makes this rank's NCCL communicator over boot's group: rank 0 makes
// the unique id, every member learns it through boot.AllGather, and all call
// ncclCommInitRankConfig (non-blocking, so that a peer lost while the
// communicator connects aborts it instead of hanging). It blocks until every
// member has joined, ctx ends, a member is lost or cfg.InitTimeout passes.
// Errors name the library, device or rank at fault.
func New(ctx context.Context, boot Bootstrap, cfg Config) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if boot == nil {
		return nil, fmt.Errorf("%w: nil bootstrap", comm.ErrInvalidArgument)
	}
	n, me := boot.Size(), boot.Rank()
	if n < 1 || me < 0 || me >= n {
		return nil, fmt.Errorf("%w: rank %d of %d", comm.ErrInvalidArgument, me, n)
	}
	lib, err := Open(cfg.Library)
	if err != nil {
		return nil, err
	}
	idx := cfg.Device
	if idx < 0 {
		idx = cfg.LocalRank % lib.Devices
	}
	dev, err := lib.Device(idx)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With().Int("rank", boot.GlobalRank(me)).Str("host", boot.Host(me)).Int("world", n).
		Int("device", idx).Logger()

	// Rank 0 makes the id; it is also a member of the communicator, so the
	// process that holds NCCL's bootstrap listener lives until everyone
	// has connected (New returns only then).
	var mine []byte
	if me == 0 {
		id, err := lib.UniqueID()
		if err != nil {
			return nil, err
		}
		mine = id.Internal[:]
	}
	all, err := boot.AllGather(ctx, mine)
	if err != nil {
		if boot.Err() != nil {
			return nil, fmt.Errorf("%w: nccl: sharing the unique id: %w", comm.ErrPeerLost, err)
		}
		return nil, fmt.Errorf("nccl: sharing the unique id: %w", err)
	}
	var id UniqueID
	if len(all) != n || len(all[0]) != len(id.Internal) {
		return nil, fmt.Errorf("nccl: rank 0 sent a %d-byte unique id; NCCL's is %d", len(all[0]), len(id.Internal))
	}
	copy(id.Internal[:], all[0])

	c := &Comm{lib: lib, dev: dev, cfg: cfg, boot: boot, log: log, me: me, n: n,
		failed: make(chan struct{}), stop: make(chan struct{})}
	if nt, ok := boot.(Notifier); ok {
		h := fnv.New64a()
		h.Write(id.Internal[:])
		c.topic = fmt.Sprintf("nccl-abort/%016x", h.Sum64())
		c.peerAborted, c.peerNotice = nt.Noticed(c.topic)
	}
	if err := c.setup(); err != nil {
		c.teardown()
		return nil, err
	}
	if err := c.init(ctx, id); err != nil {
		c.teardown()
		return nil, err
	}
	log.Debug().Str("nccl", lib.Version.String()).Str("gpu", dev.Name).Msg("nccl communicator ready")
	c.wg.Go(c.watch)
	return c, nil
}

// setup makes the stream, the ready event and Barrier's scratch float.
func (c *Comm) setup() error {
	var err error
	if c.stream, err = c.dev.NewStream(); err != nil {
		return err
	}
	if c.readyEv, err = c.dev.NewEvent(); err != nil {
		return err
	}
	if c.scratch, err = c.dev.Alloc(comm.Float32, 1); err != nil {
		return err
	}
	return c.scratch.Zero()
}

// teardown releases what setup made (after init failed, or at Close).
func (c *Comm) teardown() {
	for _, b := range append(c.outgrown, c.scratch, c.staging) {
		if b != nil {
			_ = b.Free()
		}
	}
	if c.readyEv != 0 {
		_ = c.dev.DestroyEvent(c.readyEv)
	}
	c.pendMu.Lock()
	evs := append(c.free, c.spent...)
	c.free, c.spent = nil, nil
	c.pendMu.Unlock()
	for _, e := range evs {
		if e != 0 {
			_ = c.dev.DestroyEvent(e)
		}
	}
	if c.stream != 0 {
		_ = c.dev.DestroyStream(c.stream)
	}
}

// init runs ncclCommInitRankConfig and waits for it to finish.
func (c *Comm) init(ctx context.Context, id UniqueID) error {
	cc := &commConfig{size: configSize, magic: configMagic, version: configVersion, blocking: 0}
	var nc uintptr
	var r Result
	err := c.dev.do(func() error {
		r = Result(c.lib.initRankConfig(&nc, int32(c.n), id, int32(c.me), cc))
		return nil
	})
	runtime.KeepAlive(cc)
	if err != nil {
		return err
	}
	if r != Success && r != InProgress {
		e := c.lib.ncclErr("ncclCommInitRankConfig", r, nc, c.me)
		if nc != 0 {
			c.abortComm(nc)
		}
		return e
	}
	c.nc = nc
	deadline := time.NewTimer(c.cfg.InitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		switch r := c.asyncErr(); r {
		case Success:
			return nil
		case InProgress:
		default:
			err := c.lib.ncclErr("ncclCommInitRankConfig", r, c.nc, c.me)
			c.abortComm(c.nc)
			c.nc = 0
			return err
		}
		var err error
		select {
		case <-c.boot.Failed():
			err = fmt.Errorf("%w: nccl: rank %d: initializing the communicator: %w", comm.ErrPeerLost, c.me, c.boot.Err())
		case <-ctx.Done():
			err = fmt.Errorf("%w: nccl: rank %d: initializing the communicator: %w", comm.ErrAborted, c.me, ctx.Err())
		case <-deadline.C:
			err = fmt.Errorf("%w: nccl: rank %d: the communicator of %d ranks did not form within %v (a rank that never called New?)",
				comm.ErrAborted, c.me, c.n, c.cfg.InitTimeout)
		case <-tick.C:
			continue
		}
		c.abortComm(c.nc)
		c.nc = 0
		return err
	}
}

// asyncErr is ncclCommGetAsyncError; NCCL allows it from any thread at any
// time, which is what lets the watcher poll while calls are issued.
func (c *Comm) asyncErr() Result {
	var r int32
	if e := Result(call(c.lib.nc.commGetAsyncError, c.nc, uintptr(unsafe.Pointer(&r)))); e != Success {
		return e
	}
	return Result(r)
}

// abortComm is ncclCommAbort: it stops the communicator's kernels and frees
// it, ending every call in flight.
func (c *Comm) abortComm(nc uintptr) {
	_ = c.dev.do(func() error {
		call(c.lib.nc.commAbort, nc)
		return nil
	})
}

// Rank is this process's rank in the group.
func (c *Comm) Rank() int { return c.me }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.n }

// Device is the CUDA device the communicator runs on.
func (c *Comm) Device() *Device { return c.dev }

// Stream is the communicator's own stream, on which every call runs.
func (c *Comm) Stream() Stream { return c.stream }

// Err returns the error that failed the communicator, or nil.
func (c *Comm) Err() error {
	select {
	case <-c.failed:
		return c.failErr
	default:
		return nil
	}
}

// watch turns a lost member (the rendezvous), an asynchronous NCCL error
// (polled) or any other failure into ncclCommAbort. It is the only place a
// live communicator is aborted, under issueMu.
func (c *Comm) watch() {
	tick := time.NewTicker(c.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.boot.Failed():
			c.fail(c.lostError())
		case <-c.peerAborted:
			from, text := c.peerNotice()
			c.fromPeer = c.fail(fmt.Errorf("%w: nccl: rank %d (host %s) aborted the communicator: %s",
				comm.ErrAborted, c.boot.GlobalRank(from), c.boot.Host(from), text))
		case <-c.failed:
		case <-tick.C:
			c.issueMu.Lock()
			r := Success
			if !c.released {
				r = c.asyncErr()
			}
			var err error
			if r != Success && r != InProgress {
				err = fmt.Errorf("%w: %w", comm.ErrAborted, c.lib.ncclErr("ncclCommGetAsyncError", r, c.nc, c.me))
			}
			c.issueMu.Unlock()
			if err != nil {
				c.fail(err)
			}
			continue
		case <-c.stop:
			if c.Err() == nil {
				return // closed without a failure
			}
			// Failed as Close began: still abort and tell.
		}
		c.release(true)
		c.tell()
		return
	}
}

// tell sends the communicator's failure to its peers through the
// bootstrap's notices (Notifier), so that a rank that aborted while alive
// fails its peers' pending and future calls at once, naming it, instead of
// leaving them to their own timeouts. Not for a lost peer (the rendezvous
// tells everyone) nor for a failure that was itself a peer's notice.
func (c *Comm) tell() {
	nt, ok := c.boot.(Notifier)
	if !ok || c.topic == "" || c.fromPeer || errors.Is(c.failErr, comm.ErrPeerLost) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), NotifyTimeout)
	defer cancel()
	if err := nt.Notify(ctx, c.topic, c.failErr.Error()); err != nil {
		c.log.Warn().Err(err).Msg("nccl: telling the peers of the abort")
	}
}

// lostError names the lost member, as comm does.
func (c *Comm) lostError() error {
	err := c.boot.Err()
	if err == nil {
		err = errors.New("group failed")
	}
	return fmt.Errorf("%w: %w", comm.ErrPeerLost, err)
}

// fail records err as the communicator's failure (the first wins) and fails
// every pending call with it. The watcher then aborts the NCCL
// communicator. Must not be called with pendMu held. It reports whether
// err was the first (the failure that counts).
func (c *Comm) fail(err error) (first bool) {
	c.failOnce.Do(func() {
		first = true
		c.failErr = err
		c.pendMu.Lock()
		c.pendFailed = err
		for _, r := range c.pending {
			r.state, r.err = refFailed, err
			// The event may still be recorded on the stream: keep it
			// out of the pool, destroy it at Close.
			c.spent = append(c.spent, r.ev)
			r.ev = 0
			if r.stopCtx != nil {
				r.stopCtx()
			}
		}
		c.pending = nil
		c.pendMu.Unlock()
		close(c.failed)
		c.log.Warn().Err(err).Msg("nccl communicator failed")
	})
	return first
}

// release aborts (abort) or destroys the NCCL communicator once.
func (c *Comm) release(abort bool) {
	c.issueMu.Lock()
	defer c.issueMu.Unlock()
	if c.released || c.nc == 0 {
		c.released = true
		return
	}
	c.released = true
	if abort {
		c.abortComm(c.nc)
	} else {
		_ = c.dev.do(func() error { call(c.lib.nc.commDestroy, c.nc); return nil })
	}
	c.nc = 0
}

// Abort fails every pending and future call with err (comm.ErrAborted if
// nil) and aborts the NCCL communicator. It does not wait. The watcher then
// tells the peers (Notifier), whose calls fail naming this rank.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = comm.ErrAborted
	} else if !errors.Is(err, comm.ErrAborted) {
		err = fmt.Errorf("%w: %w", comm.ErrAborted, err)
	}
	c.fail(err)
}

// Close waits for the issued calls (or a failure), releases the NCCL
// communicator (ncclCommFinalize then ncclCommDestroy; ncclCommAbort after a
// failure) and everything else, and returns once the watcher has exited.
// Idempotent. It returns the communicator's failure, if any.
func (c *Comm) Close() error {
	c.closeOnce.Do(func() {
		c.issueMu.Lock()
		c.closed = true
		c.issueMu.Unlock()
		c.drain()
		if c.Err() == nil {
			c.finalize()
		}
		close(c.stop)
		c.wg.Wait()
		c.release(c.Err() != nil)
		c.failOnce.Do(func() { c.failErr = comm.ErrClosed; close(c.failed) })
		c.teardown()
		if !errors.Is(c.failErr, comm.ErrClosed) {
			c.closeErr = c.failErr
		}
	})
	return c.closeErr
}

// drain waits until every issued call has completed or the communicator
// failed (the watcher keeps running meanwhile, so a lost peer or an
// asynchronous error ends the wait).
func (c *Comm) drain() {
	for {
		c.pendMu.Lock()
		var last *doneRef
		if len(c.pending) > 0 {
			last = c.pending[len(c.pending)-1]
		}
		c.pendMu.Unlock()
		if last == nil || c.Err() != nil {
			return
		}
		if done, _ := c.poll(last); done {
			return
		}
		select {
		case <-c.failed:
			return
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// finalize is ncclCommFinalize, waited for; a failure meanwhile ends it.
func (c *Comm) finalize() {
	c.issueMu.Lock()
	defer c.issueMu.Unlock()
	if c.nc == 0 {
		return
	}
	var r Result
	_ = c.dev.do(func() error { r = Result(call(c.lib.nc.commFinalize, c.nc)); return nil })
	for r == InProgress {
		select {
		case <-c.failed:
			return
		case <-c.boot.Failed():
			c.issueMu.Unlock()
			c.fail(c.lostError())
			c.issueMu.Lock()
			return
		case <-time.After(200 * time.Microsecond):
		}
		r = c.asyncErr()
	}
	if r != Success {
		err := c.lib.ncclErr("ncclCommFinalize", r, c.nc, c.me)
		c.issueMu.Unlock()
		c.fail(err)
		c.issueMu.Lock()
	}
}

// poll reports whether ref's issue has completed (or failed, with its
// error), retiring it and every earlier issue when it has.
func (c *Comm) poll(ref *doneRef) (bool, error) {
	c.pendMu.Lock()
	switch ref.state {
	case refDone:
		c.pendMu.Unlock()
		return true, nil
	case refFailed:
		c.pendMu.Unlock()
		return true, ref.err
	}
	var ok bool
	unbind, err := c.dev.bind()
	if err == nil {
		ok, err = c.dev.queryBound(ref.ev)
		unbind()
	}
	if ok {
		c.retireLocked(ref)
	}
	c.pendMu.Unlock()
	if err != nil {
		c.fail(err)
		return true, c.Err()
	}
	return ok, nil
}

// retireLocked marks ref and every issue before it complete and recycles
// their events. pendMu is held.
func (c *Comm) retireLocked(ref *doneRef) {
	i := 0
	for i < len(c.pending) && c.pending[i] != ref {
		i++
	}
	if i == len(c.pending) {
		return
	}
	for _, r := range c.pending[:i+1] {
		r.state = refDone
		c.free = append(c.free, r.ev)
		r.ev = 0
		if r.stopCtx != nil {
			r.stopCtx()
		}
	}
	n := copy(c.pending, c.pending[i+1:])
	clear(c.pending[n:])
	c.pending = c.pending[:n]
}

// Handle is an issued call on a Comm.
type Handle struct {
	c   *Comm
	ref *doneRef
	err error // set when the call was refused at issue
}

var _ comm.Handle = (*Handle)(nil)

// Done reports without blocking whether the call has completed (or failed).
func (h *Handle) Done() bool {
	if h.err != nil {
		return true
	}
	done, _ := h.c.poll(h.ref)
	return done
}

// Wait blocks until the call completes, the communicator fails (its error:
// a lost peer, an asynchronous NCCL error, an abort) or ctx ends (ctx's
// error; the call goes on). It polls the call's done event: a short spin for
// small calls, then sleeps growing to 50 µs, which bounds how late a
// completion is seen (a benchmark's times include it) at a few per cent of
// a core.
func (h *Handle) Wait(ctx context.Context) error {
	if h.err != nil {
		return h.err
	}
	var timer *time.Timer
	sleep := 5 * time.Microsecond
	for i := 0; ; i++ {
		if done, err := h.c.poll(h.ref); done {
			return err
		}
		if i < 64 {
			runtime.Gosched()
			continue
		}
		if timer == nil {
			timer = time.NewTimer(sleep)
			defer timer.Stop()
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.c.failed:
		case <-timer.C:
		}
		sleep = min(2*sleep, 50*time.Microsecond)
	}
}

// StreamWait makes stream s wait, on the device, for h's call to complete,
// without blocking the CPU: the overlap executor's wait → compute edge when
// the compute runs on a GPU stream. A completed call needs no wait.
func StreamWait(h comm.Handle, s Stream) error {
	nh, ok := h.(*Handle)
	if !ok {
		return fmt.Errorf("%w: StreamWait needs a handle from an nccl.Comm, got %T", comm.ErrInvalidArgument, h)
	}
	if nh.err != nil {
		return nh.err
	}
	c := nh.c
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	switch nh.ref.state {
	case refDone:
		return nil
	case refFailed:
		return nh.ref.err
	}
	return c.dev.StreamWait(s, nh.ref.ev)
}

// failedHandle is a call refused at issue.
func failedHandle(c *Comm, err error) *Handle { return &Handle{c: c, err: err} }

type streamKey struct{}

// WithStream returns a context whose calls wait for the work queued on s
// (instead of Config.ComputeStream) before they start.
func WithStream(ctx context.Context, s Stream) context.Context {
	return context.WithValue(ctx, streamKey{}, s)
}

func (c *Comm) computeStream(ctx context.Context) Stream {
	if s, ok := ctx.Value(streamKey{}).(Stream); ok {
		return s
	}
	return c.cfg.ComputeStream
}
