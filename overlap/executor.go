package overlap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/rs/zerolog"
)

// Executor runs one bucket plan step after step. It is driven by one
// goroutine (see the package comment), which also calls Close, after its
// last step.
//
// Concurrency: besides the driver there is one watcher goroutine per
// group, owned by wg and ended by Close. The driver hands a watcher each
// issued bucket over the group's watch channel; the watcher writes only
// that bucket's doneAt and doneErr and then closes its recorded channel,
// and the driver reads those fields only after receiving from recorded
// (Finish). That close is the one synchronisation between them, which is
// why the rest of the executor needs no mutex.
type Executor struct {
	plan *buckets.Plan
	hash uint64
	cfg  Config
	log  zerolog.Logger
	tl   *Timeline

	groups  []*group
	byGroup map[string]*group
	// filler decides, as tensors arrive, which buckets may start (the
	// bookkeeping buckets owns); the executor packs, issues and scatters.
	filler *buckets.Filler
	// byIn maps an input tensor to its locations, in group then issue
	// order; a tensor that travels twice fills its first free location.
	byIn  map[string][]memberLoc
	byOut map[string]*bucket
	// byRegion lists the buckets issued in each region, for EndRegion.
	byRegion map[string][]*bucket

	// Per-step state, touched only by the driving goroutine.
	step     int
	inStep   bool
	broken   error // a failed step: watchers may still hold its buckets
	begin    time.Time
	exposed  time.Duration
	pendingG []*bucket // Grouped: startable buckets not yet handed over
	compute  time.Duration
	mem      *fusedMem

	// procs: this executor holds a raise of GOMAXPROCS (Config.MinProcs),
	// released by Close. wide: it also holds a widening past the CPUs,
	// since its compute blocks (procs.go); watch measures that per step.
	procs bool
	wide  bool
	watch blockedWatch

	ctx      context.Context // the watchers' context, cancelled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
	closeErr error
}

// memberLoc is one place a tensor travels: member i of bucket b. Ready
// finds the tensor's next open place through these without scanning the
// bucket's members (a bucket of 200 gradients made Ready quadratic: 0.55
// of the graph runner's 1.0 µs per tensor, BenchmarkGraphRunnerStep).
type memberLoc struct {
	b *bucket
	i int
}

// group is one process group's buckets and its completion watcher.
type group struct {
	name    string
	idx     int // position in the plan's groups (and ex.groups)
	cm      Comm
	buckets []*bucket

	hashSend, hashRecv []int64
	hashH              Handle
	hashChecked        bool

	// On a device group (the communicator is a DeviceComm) the fused
	// buffers come from pool, the hash travels through hashDev, and last
	// is the latest call or copy the executor queued on the
	// communicator's stream.
	dev     DeviceComm
	pool    *devPool
	hashDev [2]comm.Buffer // send, recv
	last    Handle

	// watch carries the group's issued buckets to its watcher, in issue
	// order. It has a slot for every bucket of the group, and a bucket is
	// issued at most once a step, so the driver never blocks on a
	// watcher that is still parked on an earlier collective.
	watch chan *bucket
}

// bucket is one planned collective and its per-step state.
type bucket struct {
	b   buckets.Bucket
	g   *group
	idx int
	dt  comm.DType
	es  int64
	n   int64 // group size

	// send and recv are the fused buffers, allocated when the bucket first
	// needs them in a step (a member packed, a flush) and dropped after its
	// wait has scattered them, so a step holds only the buckets in flight;
	// a bucket of one member runs on the member's own buffers and never
	// has them. A View pins them for the executor's life.
	send, recv       []byte
	dsend, drecv     fusedDev      // a device group's fused buffers (buf nil: none)
	views            []comm.Buffer // View's slots on a device group, per member
	sendLen, recvLen int64
	inPlace, pinned  bool
	mem              *fusedMem
	ins, outs        []comm.Buffer // per member, this step
	have             []bool        // packed this step (flushed members are not)

	started, waited bool
	partial         bool // flushed with members missing
	// direct: a bucket of one member runs on the member's own buffers,
	// whose layout is the fused one, so nothing is packed or scattered.
	direct   bool
	h        Handle
	issued   time.Time
	waitedAt time.Time
	doneAt   time.Time     // written by the watcher before recorded closes
	doneErr  error         // likewise
	recorded chan struct{} // closed by the watcher
	// timed: the handle knows when it completed (CompletionTimer), so no
	// watcher waits on it; waitBucket reads the time after the driver's
	// own wait.
	timed bool
}

// New prepares plan for execution over comms (one communicator per group of
// the plan, by name). The fused buffers are allocated here, once.
func New(plan *buckets.Plan, comms map[string]Comm, cfg Config) (*Executor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Backend == nil {
		cfg.Backend = SequentialGroups{}
	}
	if plan == nil {
		return nil, fmt.Errorf("%w: nil plan", ErrPlan)
	}
	if err := plan.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	// FlushPartial is applied to a copy of the plan, not checked at each
	// EndRegion: the filler (package buckets) then knows which buckets may
	// start short, and the plan hash every rank compares includes it, so
	// ranks that disagree on it are told so at the first wait.
	if cfg.FlushPartial {
		plan = flushAll(plan)
	}
	ex := &Executor{
		plan: plan, hash: plan.Hash(), cfg: cfg, filler: buckets.NewFiller(plan), byGroup: map[string]*group{},
		byIn: map[string][]memberLoc{}, byOut: map[string]*bucket{}, byRegion: map[string][]*bucket{},
		mem: &fusedMem{},
	}
	rank := -1
	for _, gp := range plan.Groups {
		cm, ok := comms[gp.Group]
		if !ok || cm == nil {
			ex.closeDevices()
			return nil, fmt.Errorf("%w: no communicator for group %q", ErrPlan, gp.Group)
		}
		if rank < 0 {
			rank = cm.Rank()
		}
		g := &group{name: gp.Group, idx: len(ex.groups), cm: cm, hashSend: make([]int64, 1), hashRecv: make([]int64, cm.Size())}
		// Listed before its buckets are made, so that closeDevices frees
		// its device memory should a later bucket or group be refused.
		ex.groups = append(ex.groups, g)
		if dc, ok := cm.(DeviceComm); ok {
			if err := g.openDevice(dc); err != nil {
				ex.closeDevices()
				return nil, err
			}
		}
		for i, pb := range gp.Buckets {
			b, err := newBucket(pb, g, i)
			if err != nil {
				ex.closeDevices()
				return nil, err
			}
			b.mem = ex.mem
			g.buckets = append(g.buckets, b)
			for mi, m := range pb.Members {
				ex.byIn[m.Tensor] = append(ex.byIn[m.Tensor], memberLoc{b, mi})
				ex.byOut[m.Out] = b
			}
			ex.byRegion[pb.Region] = append(ex.byRegion[pb.Region], b)
		}
		ex.byGroup[g.name] = g
	}
	ex.log = cfg.Logger.With().Int("rank", rank).Logger()
	if cfg.Trace {
		ex.tl = newTimeline(max(rank, 0), cfg.TraceLimit)
	}
	// The watchers' context is the executor's, not a step's: a watcher
	// outlives every step, and only Close may stop it waiting.
	ex.ctx, ex.cancel = context.WithCancel(context.Background())
	for _, g := range ex.groups {
		g.watch = make(chan *bucket, len(g.buckets)+1)
		ex.wg.Go(func() { ex.watcher(g) })
	}
	ex.procs = raiseProcs(cfg.MinProcs)
	return ex, nil
}

// fusedMem counts the bytes of fused buffers in use, for
// StepMetrics.FusedPeakBytes, and keeps the dropped ones for reuse: the
// executor holds the most that was ever in use at once, not every bucket's.
// Only the driving goroutine touches it.
type fusedMem struct {
	cur, peak int64
	free      [][]byte
	// copied counts this step's bytes packed and scattered
	// (StepMetrics.CopiedBytes).
	copied int64
}

// get returns a buffer of n bytes (contents undefined: packing, the
// collective or a flush writes every byte that is read). It takes the
// smallest free buffer that fits (best fit), so that a small bucket does
// not take the large buffer a later large bucket of the step needs; steps
// repeat the same sizes, so after the first step get rarely allocates.
// The peak counts the bytes asked for, not the capacity held, as that is
// what a plan's bucket sizes determine.
func (m *fusedMem) get(n int64) []byte {
	m.cur += n
	m.peak = max(m.peak, m.cur)
	best := -1
	for i, b := range m.free {
		if int64(cap(b)) >= n && (best < 0 || cap(b) < cap(m.free[best])) {
			best = i
		}
	}
	if best < 0 {
		return make([]byte, n)
	}
	b := m.free[best]
	m.free[best] = m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	return b[:n]
}

func (m *fusedMem) put(b []byte) {
	m.cur -= int64(len(b))
	m.free = append(m.free, b)
}

// ensure gives b its fused buffers if it has none: host bytes, or device
// memory from the group's pool on a device group.
func (b *bucket) ensure() error {
	if p := b.g.pool; p != nil {
		if b.dsend.buf != nil {
			return nil
		}
		var err error
		if b.dsend, err = p.get(b.mem, b.dt, b.sendLen); err != nil {
			return fmt.Errorf("overlap: bucket %q: fused buffer: %w", b.b.Name, err)
		}
		b.drecv = b.dsend
		if !b.inPlace {
			if b.drecv, err = p.get(b.mem, b.dt, b.recvLen); err != nil {
				p.put(b.mem, b.dsend)
				b.dsend = fusedDev{}
				return fmt.Errorf("overlap: bucket %q: fused buffer: %w", b.b.Name, err)
			}
		}
		return nil
	}
	if b.send != nil {
		return nil
	}
	b.send = b.mem.get(b.sendLen)
	b.recv = b.send
	if !b.inPlace {
		b.recv = b.mem.get(b.recvLen)
	}
	return nil
}

// drop hands b's fused buffers back for other buckets to use. On a device
// group the scatter queued before it may still read them; the next user
// is a bucket of the same group, whose pack queues behind that scatter on
// the same stream.
func (b *bucket) drop() {
	if b.pinned {
		return
	}
	if p := b.g.pool; p != nil {
		if b.dsend.buf == nil {
			return
		}
		p.put(b.mem, b.dsend)
		if !b.inPlace {
			p.put(b.mem, b.drecv)
		}
		b.dsend, b.drecv = fusedDev{}, fusedDev{}
		return
	}
	if b.send == nil {
		return
	}
	b.mem.put(b.send)
	if !b.inPlace {
		b.mem.put(b.recv)
	}
	b.send, b.recv = nil, nil
}

func newBucket(pb buckets.Bucket, g *group, idx int) (*bucket, error) {
	dt, err := dtypeOf(pb.DType)
	if err != nil {
		return nil, fmt.Errorf("%w: bucket %q: %w", ErrPlan, pb.Name, err)
	}
	n := int64(g.cm.Size())
	b := &bucket{b: pb, g: g, idx: idx, dt: dt, es: int64(dt.Size()), n: n,
		ins: make([]comm.Buffer, len(pb.Members)), outs: make([]comm.Buffer, len(pb.Members)),
		have: make([]bool, len(pb.Members))}
	switch pb.Op {
	case buckets.AllReduce, buckets.Broadcast:
		b.sendLen, b.recvLen, b.inPlace = pb.Bytes, pb.Bytes, true
	case buckets.AllGather:
		b.sendLen, b.recvLen = pb.Bytes, pb.Bytes*n
	case buckets.ReduceScatter, buckets.AllToAll:
		for _, m := range pb.Members {
			if m.Bytes%(n*b.es) != 0 {
				return nil, fmt.Errorf("%w: bucket %q: %s member %q has %d bytes, not a multiple of %d ranks × %d-byte elements (pad it)",
					ErrPlan, pb.Name, pb.Op, m.Tensor, m.Bytes, n, b.es)
			}
		}
		if pb.Op == buckets.AllToAll {
			// Every rank sends block p to rank p and receives one block
			// from each: the fused buffers are the size of the input.
			b.sendLen, b.recvLen = pb.Bytes, pb.Bytes
			break
		}
		b.sendLen, b.recvLen = pb.Bytes, pb.Bytes/n
	default:
		return nil, fmt.Errorf("%w: bucket %q: op %q is not bucketed by this executor", ErrPlan, pb.Name, pb.Op)
	}
	return b, nil
}

// dtypeOf maps the plan's dtype names to comm's.
func dtypeOf(s string) (comm.DType, error) {
	switch s {
	case "f32":
		return comm.Float32, nil
	case "f64":
		return comm.Float64, nil
	case "bf16":
		return comm.BFloat16, nil
	case "f16":
		return comm.Float16, nil
	case "i32":
		return comm.Int32, nil
	case "i64":
		return comm.Int64, nil
	case "u8":
		return comm.Uint8, nil
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

// Plan returns the plan being executed. Callers must not modify it.
func (ex *Executor) Plan() *buckets.Plan { return ex.plan }

// Timeline returns the recorded timeline, or nil when Config.Trace is off.
// Read it between steps.
func (ex *Executor) Timeline() *Timeline { return ex.tl }

// watcher records when each of g's collectives completes, for handles that
// cannot say themselves (no CompletionTimer; see issued). Collectives on a
// group complete in issue order, so waiting for them in that order records
// every completion as it happens (within scheduling noise).
//
// Waiting here, and not only in the driver's wait, is what gives the
// timeline and StepMetrics.Comm true completion times: the driver may wait
// for a bucket long after it finished (compute hid it), and its wait time
// says nothing of when the network was done. On Close the context is
// cancelled, so a watcher parked on a collective that will never complete
// (a failed step) still returns.
func (ex *Executor) watcher(g *group) {
	for b := range g.watch {
		err := b.h.Wait(ex.ctx)
		b.doneAt, b.doneErr = ex.cfg.Clock.Now(), err
		if ct, ok := b.h.(CompletionTimer); ok {
			b.doneAt = ct.CompletedAt()
		}
		close(b.recorded)
	}
}

// CompletionTimer is implemented by handles that know when their call
// completed (a GPU backend's event timestamps, a test's fake clock); the
// executor then uses that instead of the time its watcher woke up.
type CompletionTimer interface{ CompletedAt() time.Time }

// Close stops the watchers and frees the device groups' fused buffers.
// Call it from the driving goroutine between steps (a step in flight still
// hands buckets to them), also after a failed one, and before closing a
// device group's communicator (the buffers are freed once its stream has
// run what was queued on them). It does not wait for host collectives
// still in flight (their communicator's Close or Abort does). Idempotent;
// it returns what freeing device memory reported.
func (ex *Executor) Close() error {
	ex.once.Do(func() {
		ex.cancel()
		for _, g := range ex.groups {
			close(g.watch)
		}
		ex.wg.Wait()
		ex.closeErr = ex.closeDevices()
		if ex.wide {
			narrowProcs()
		}
		if ex.procs {
			releaseProcs()
		}
	})
	return ex.closeErr
}

// Begin starts step s. The previous step must have finished.
func (ex *Executor) Begin(step int) error {
	if ex.inStep {
		return fmt.Errorf("%w: Begin(%d) while step %d is running (call Finish)", ErrUsage, step, ex.step)
	}
	if ex.broken != nil {
		return fmt.Errorf("%w: Begin(%d) after step %d failed (%v): close the executor and its communicators", ErrUsage, step, ex.step, ex.broken)
	}
	// The peak restarts from what is held now (View's pinned buffers),
	// so FusedPeakBytes is per step, not a high-water mark of the run.
	ex.step, ex.inStep = step, true
	ex.begin = ex.cfg.Clock.Now()
	ex.exposed, ex.compute = 0, 0
	ex.mem.peak = ex.mem.cur
	ex.mem.copied = 0
	ex.pendingG = ex.pendingG[:0]
	ex.filler.Reset()
	// Watch the compute only while the CPUs keep GOMAXPROCS under
	// MinProcs, or to narrow it back once widened.
	ex.watch = blockedWatch{on: ex.procs && (ex.wide || runtime.GOMAXPROCS(0) < ex.cfg.MinProcs)}
	for _, g := range ex.groups {
		g.hashH, g.hashChecked = nil, false
		for _, b := range g.buckets {
			b.reset()
		}
	}
	return nil
}

func (b *bucket) reset() {
	for i := range b.have {
		b.have[i], b.ins[i], b.outs[i] = false, nil, nil
	}
	b.started, b.waited, b.partial, b.direct, b.timed, b.h = false, false, false, false, false, nil
	b.doneAt, b.doneErr, b.recorded = time.Time{}, nil, nil
}

// adjustProcs widens GOMAXPROCS past the CPUs after a step whose compute
// blocked for widenShare of its time or more, and narrows it back after
// one under narrowShare (procs.go says why).
func (ex *Executor) adjustProcs() {
	w := ex.watch
	if !w.on || w.wall <= 0 {
		return
	}
	share := float64(w.blocked) / float64(w.wall)
	switch {
	case !ex.wide && share >= widenShare:
		widenProcs(ex.cfg.MinProcs)
		ex.wide = true
		ex.log.Debug().Int("step", ex.step).Float64("blocked", share).Int("gomaxprocs", runtime.GOMAXPROCS(0)).Msg("compute blocks: widened GOMAXPROCS past the CPUs")
	case ex.wide && share < narrowShare:
		narrowProcs()
		ex.wide = false
		ex.log.Debug().Int("step", ex.step).Float64("blocked", share).Int("gomaxprocs", runtime.GOMAXPROCS(0)).Msg("compute runs on the CPU: narrowed GOMAXPROCS to the CPUs")
	}
}

// Compute runs fn as the compute named name (in region) and records it on
// the timeline. In Grouped mode the bucket set that became startable before
// it is issued first, so that fn hides it.
func (ex *Executor) Compute(ctx context.Context, name, region string, fn func() error) error {
	if err := ex.flushGroup(ctx); err != nil {
		return err
	}
	t0 := ex.cfg.Clock.Now()
	err := ex.watch.run(fn)
	t1 := ex.cfg.Clock.Now()
	ex.compute += t1.Sub(t0)
	if ex.tl != nil {
		ex.tl.complete(tidCompute, name, "compute", t0, t1, map[string]any{"step": ex.step, "region": region})
	}
	return err
}

// Ready hands in tensor: in is copied into its bucket's fused buffer (or,
// in a bucket of one member, handed to the collective as it is), out is
// where the result is scattered before the bucket's wait returns (it may be
// in itself). Neither may change until that wait, or Finish, returns —
// the contract of DDP's gradient hooks. When the
// bucket's last member arrives and every earlier bucket of its group has
// started, the bucket's collective starts — and so do later buckets that
// were only waiting for it.
func (ex *Executor) Ready(ctx context.Context, tensor string, in, out comm.Buffer) error {
	if !ex.inStep {
		return fmt.Errorf("%w: Ready(%q) outside a step (call Begin)", ErrUsage, tensor)
	}
	locs, ok := ex.byIn[tensor]
	if !ok {
		return fmt.Errorf("%w: tensor %q is in no bucket of the plan", ErrUsage, tensor)
	}
	// A tensor may travel more than once a step (a forward all-gather
	// gathered again in backward): it fills its first location, in group
	// then issue order, that is still open and does not have it yet. A
	// location whose bucket already started (flushed at EndRegion without
	// this tensor) is closed to it for the rest of the step.
	var b *bucket
	mi := -1
	for _, l := range locs {
		if l.b.started {
			continue // flushed without this tensor: too late for it
		}
		if !l.b.have[l.i] {
			b, mi = l.b, l.i
			break
		}
	}
	if b == nil {
		return fmt.Errorf("%w: tensor %q handed in more often than the plan sends it this step", ErrUsage, tensor)
	}
	return ex.readyAt(ctx, b, mi, in, out)
}

// readyAt is Ready for member mi of b, the place Ready would choose for
// its tensor (GraphRunner knows it from the graph: a start node is one
// bucket, a member one place, so it saves Ready's lookup by name).
func (ex *Executor) readyAt(ctx context.Context, b *bucket, mi int, in, out comm.Buffer) error {
	if !ex.inStep {
		return fmt.Errorf("%w: Ready(%q) outside a step (call Begin)", ErrUsage, b.b.Members[mi].Tensor)
	}
	if b.started || b.have[mi] {
		return fmt.Errorf("%w: tensor %q handed in more often than the plan sends it this step", ErrUsage, b.b.Members[mi].Tensor)
	}
	// Pack now, not when the bucket starts: each member's copy is paid as
	// it arrives, between the program's computations, instead of all at
	// once delaying the collective when the last member arrives.
	if err := b.pack(ctx, mi, in, out); err != nil {
		return err
	}
	b.have[mi], b.ins[mi], b.outs[mi] = true, in, out
	// The filler (package buckets) owns the order rule: a bucket starts
	// only when it is full and every earlier bucket of its group has
	// started, so every rank issues a group's collectives in one order
	// whatever order its tensors arrived in. It returns every bucket that
	// became startable, this one and later ones that waited for it.
	sts, err := ex.filler.ReadyAt(b.g.idx, b.idx, mi)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return ex.startAll(ctx, sts)
}

// startAll starts what the filler says may start, in its order, with the
// slots of members flushed without being produced zeroed.
func (ex *Executor) startAll(ctx context.Context, sts []buckets.Startable) error {
	for _, st := range sts {
		b := ex.byGroup[st.Group].buckets[st.Index]
		if len(st.Absent) > 0 {
			if err := ex.zeroAbsent(ctx, b); err != nil {
				return err
			}
		}
		if err := ex.start(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// flushAll returns a copy of p with every bucket flushable.
func flushAll(p *buckets.Plan) *buckets.Plan {
	q := &buckets.Plan{Groups: make([]buckets.GroupPlan, len(p.Groups))}
	for gi, g := range p.Groups {
		q.Groups[gi] = buckets.GroupPlan{Group: g.Group, Buckets: append([]buckets.Bucket(nil), g.Buckets...)}
		for bi := range q.Groups[gi].Buckets {
			q.Groups[gi].Buckets[bi].Flush = true
		}
	}
	return q
}

// pack copies member mi's input into the fused send buffer (on a device
// group, a copy queued on the communicator's stream behind the compute
// stream's work, so it reads what the kernels wrote).
func (b *bucket) pack(ctx context.Context, mi int, in, out comm.Buffer) error {
	m := b.b.Members[mi]
	want := m.Bytes
	switch b.b.Op {
	case buckets.AllGather:
		want = m.Bytes * b.n
	case buckets.ReduceScatter:
		want = m.Bytes / b.n
	}
	if dc := b.g.dev; dc != nil {
		if err := deviceOf(in, b.dt, m.Bytes, b.b.Name, m.Tensor, "input"); err != nil {
			return err
		}
		if err := deviceOf(out, b.dt, want, b.b.Name, m.Out, "output"); err != nil {
			return err
		}
		if len(b.b.Members) == 1 || (b.views != nil && in == b.views[mi]) {
			return nil // runs directly on in and out, or written into View
		}
		if err := b.ensure(); err != nil {
			return err
		}
		segs := devSegs(b.packSegs(mi), b.dsend.buf, in, true)
		b.mem.copied += segBytes(segs)
		h := dc.CopyDevice(ctx, segs)
		b.g.last = h
		if h.Done() {
			// A refused copy (the communicator failed) is done at once:
			// say so here rather than at the wait. A copy that merely
			// ran already returns nil.
			return h.Wait(ctx)
		}
		return nil
	}
	src, err := hostOf(in, b.dt, m.Bytes, b.b.Name, m.Tensor, "input")
	if err != nil {
		return err
	}
	if _, err := hostOf(out, b.dt, want, b.b.Name, m.Out, "output"); err != nil {
		return err
	}
	if len(b.b.Members) == 1 {
		return nil // runs directly on in and out (see bucket.direct)
	}
	if err := b.ensure(); err != nil {
		return err
	}
	// Pointer identity, not a flag: a program may hand View's slot for
	// some tensors and its own buffers for others, and only the first
	// element's address tells which it did this time.
	if m.Bytes > 0 && b.b.Op != buckets.ReduceScatter && b.b.Op != buckets.AllToAll && &src[0] == &b.send[m.Offset] {
		return nil // the caller wrote into View: nothing to pack
	}
	for _, s := range b.packSegs(mi) {
		copy(b.send[s.fused:s.fused+s.n], src[s.member:s.member+s.n])
		b.mem.copied += s.n
	}
	return nil
}

// View returns tensor's slot in its bucket's fused buffer, for programs that
// compute a tensor directly into it (DDP's gradient_as_bucket_view): handed
// to Ready as both input and output, it is neither packed nor scattered,
// which saves two copies per tensor per step. Only for in-place buckets
// (all_reduce, broadcast), whose slots are contiguous; the slot stays the
// tensor's for the executor's life and holds the result after its wait.
func (ex *Executor) View(tensor string) (comm.Buffer, error) {
	locs, ok := ex.byIn[tensor]
	if !ok {
		return nil, fmt.Errorf("%w: View(%q): tensor is in no bucket of the plan", ErrUsage, tensor)
	}
	b, i := locs[0].b, locs[0].i
	if b.b.Op != buckets.AllReduce && b.b.Op != buckets.Broadcast {
		return nil, fmt.Errorf("%w: View(%q): bucket %q is %s, whose slots are not contiguous", ErrUsage, tensor, b.b.Name, b.b.Op)
	}
	m := b.b.Members[i]
	if err := b.ensure(); err != nil {
		return nil, err
	}
	b.pinned = true // the program writes here every step
	if dc := b.g.dev; dc != nil {
		if b.views == nil {
			b.views = make([]comm.Buffer, len(b.b.Members))
		}
		if b.views[i] == nil {
			v, err := dc.ViewDevice(b.dsend.buf, b.dt, m.Offset, m.Bytes)
			if err != nil {
				return nil, err
			}
			b.views[i] = v
		}
		// pack and unpack know the slot by this very buffer
		return b.views[i], nil
	}
	return comm.Bytes(b.dt, b.send[m.Offset:m.Offset+m.Bytes:m.Offset+m.Bytes])
}

// unpack scatters member mi's result to its output, undoing pack's layout
// (unpackSegs). Host groups only: a device group queues the same copies on
// its stream (waitBucket).
func (b *bucket) unpack(mi int) {
	if !b.have[mi] {
		return // flushed without it: nobody asked for the result
	}
	if b.direct {
		return
	}
	m := b.b.Members[mi]
	dst, _ := b.outs[mi].Host()
	if b.b.Op != buckets.AllGather && b.b.Op != buckets.ReduceScatter && b.b.Op != buckets.AllToAll &&
		m.Bytes > 0 && &dst[0] == &b.recv[m.Offset] {
		return // a View: the result is already there
	}
	for _, s := range b.unpackSegs(mi) {
		copy(dst[s.member:s.member+s.n], b.recv[s.fused:s.fused+s.n])
		b.mem.copied += s.n
	}
}

func hostOf(buf comm.Buffer, dt comm.DType, bytes int64, bucket, tensor, what string) ([]byte, error) {
	if buf == nil {
		return nil, fmt.Errorf("%w: bucket %q: tensor %q: nil %s buffer", ErrUsage, bucket, tensor, what)
	}
	h, ok := buf.Host()
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: bucket %q: tensor %q: %s is not in host memory", ErrUsage, bucket, tensor, what)
	case buf.DType() != dt:
		return nil, fmt.Errorf("%w: bucket %q: tensor %q: %s is %s, plan says %s", ErrUsage, bucket, tensor, what, buf.DType(), dt)
	case int64(len(h)) < bytes:
		return nil, fmt.Errorf("%w: bucket %q: tensor %q: %s has %d bytes, plan needs %d", ErrUsage, bucket, tensor, what, len(h), bytes)
	}
	return h[:bytes], nil
}

// start issues b (or queues it for the next bucket set in Grouped mode).
// The first start of a step on a group also starts that group's plan-hash
// all-gather (Config.CheckPlan): issued before any bucket, it is the first
// collective every rank of the group runs this step, so ranks with other
// plans or a step apart meet in it, and each learns of the mismatch at its
// first wait (checkHash), before it uses any result.
func (ex *Executor) start(ctx context.Context, b *bucket) error {
	g := b.g
	if ex.cfg.CheckPlan && g.hashH == nil {
		g.hashSend[0] = int64(stepHash(ex.hash, ex.step))
		var send, recv comm.Buffer = comm.Int64s(g.hashSend), comm.Int64s(g.hashRecv)
		if g.dev != nil {
			// The previous step's exchange has completed (Finish waited
			// for it), so a synchronous upload cannot race it.
			h, _ := send.Host()
			if err := g.dev.UploadDevice(g.hashDev[0], h); err != nil {
				return fmt.Errorf("overlap: step %d: plan check on group %s: %w", ex.step, g.name, err)
			}
			send, recv = g.hashDev[0], g.hashDev[1]
		}
		g.hashH = g.cm.AllGather(ctx, send, recv)
		g.last = g.hashH
	}
	b.started = true
	// A fresh channel each step: the watcher closes it once, and Finish
	// must not read a close from the previous step.
	b.recorded = make(chan struct{})
	// Grouped mode only queues: the set goes out as one GroupBackend call
	// at the next Compute, Wait or Finish (flushGroup), as NCCL's group
	// semantics want. Native issues now, and Serial also waits now (the
	// no-overlap baseline the other modes are measured against).
	if ex.cfg.Mode == Grouped {
		ex.pendingG = append(ex.pendingG, b)
		return nil
	}
	c, err := ex.call(b)
	if err != nil {
		return err
	}
	b.issued = ex.cfg.Clock.Now()
	b.h = c.Issue(ctx, g.cm)
	g.last = b.h
	ex.issued(b)
	if ex.cfg.Mode == Serial {
		return ex.waitBucket(ctx, b)
	}
	return nil
}

// call is b's collective: on the member's own buffers when the bucket has
// one member (nothing to pack or scatter), else on its fused buffers. A
// one-member bucket flushed without its member (have[0] false) takes the
// fused path, whose zeroed buffer stands in for the tensor the program
// never handed in.
func (ex *Executor) call(b *bucket) (Call, error) {
	c := Call{Bucket: b.b.Name, Op: b.b.Op, Reduce: comm.Sum}
	m := b.b.Members[0]
	if dc := b.g.dev; dc != nil {
		if len(b.b.Members) == 1 && b.have[0] {
			b.direct = true
			var err error
			if c.Send, err = dc.ViewDevice(b.ins[0], b.dt, 0, m.Bytes); err != nil {
				return c, err
			}
			c.Recv, err = dc.ViewDevice(b.outs[0], b.dt, 0, b.recvLen)
			return c, err
		}
		if err := b.ensure(); err != nil {
			return c, err
		}
		c.Send, c.Recv = b.dsend.buf, b.drecv.buf
		return c, nil
	}
	if len(b.b.Members) == 1 && b.have[0] {
		b.direct = true
		in, _ := b.ins[0].Host()
		out, _ := b.outs[0].Host()
		c.Send, _ = comm.Bytes(b.dt, in[:m.Bytes])
		c.Recv, _ = comm.Bytes(b.dt, out[:b.recvLen])
		return c, nil
	}
	if err := b.ensure(); err != nil {
		return c, err
	}
	c.Send, _ = comm.Bytes(b.dt, b.send)
	c.Recv, _ = comm.Bytes(b.dt, b.recv)
	return c, nil
}

// issued hands b to its group's watcher, which records its completion:
// watchers wait in issue order, which is completion order on one group.
//
// A handle that knows its completion time (CompletionTimer: comm's calls
// do) skips the watcher. A watcher parked on every collective costs a
// goroutine wake-up per collective on top of the driver's, and on comm
// it also defeats the inline wait (a waiter whose context is not the
// call's cannot run the call itself, so the call's completion must close
// a channel and wake it).
func (ex *Executor) issued(b *bucket) {
	if _, ok := b.h.(CompletionTimer); ok {
		b.timed = true
		close(b.recorded) // doneAt comes from the handle, in waitBucket
	} else {
		b.g.watch <- b
	}
	ex.log.Debug().Int("step", ex.step).Str("bucket", b.b.Name).Str("group", b.g.name).
		Int64("bytes", b.b.Bytes).Bool("partial", b.partial).Msg("collective started")
}

// flushGroup hands the pending bucket set to the backend (Grouped mode).
func (ex *Executor) flushGroup(ctx context.Context) error {
	if len(ex.pendingG) == 0 {
		return nil
	}
	// A set may span groups; each group's calls go in one grouped call, in
	// issue order.
	for _, g := range ex.groups {
		var set []Call
		var bs []*bucket
		for _, b := range ex.pendingG {
			if b.g == g {
				c, err := ex.call(b)
				if err != nil {
					return err
				}
				set = append(set, c)
				bs = append(bs, b)
			}
		}
		if len(set) == 0 {
			continue
		}
		now := ex.cfg.Clock.Now()
		hs := ex.cfg.Backend.IssueGroup(ctx, g.cm, set)
		if len(hs) != len(set) {
			return fmt.Errorf("%w: group backend returned %d handles for %d calls", ErrPlan, len(hs), len(set))
		}
		for i, b := range bs {
			b.issued, b.h = now, hs[i]
			g.last = b.h
			ex.issued(b)
		}
	}
	ex.pendingG = ex.pendingG[:0]
	return nil
}

// stepHash mixes the plan hash with the step, so ranks that are a step apart
// disagree too.
func stepHash(plan uint64, step int) uint64 {
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], plan)
	binary.LittleEndian.PutUint64(b[8:], uint64(step))
	h.Write(b[:])
	return h.Sum64()
}

// checkHash waits for g's plan-hash exchange and compares. It runs once
// per group and step (hashChecked), at the first wait on the group: every
// rank issued the hash all-gather before any bucket, so it completes
// whatever the buckets do, even when mismatched plans made the buckets'
// sizes disagree. The error names every rank whose hash differs from
// this rank's, which is what an operator needs to find the odd one out.
//
// On a device group a wait must not block the CPU, so the check runs there
// only when the exchange has already completed, and otherwise at Finish
// (final): a mismatch is then reported at the end of the step, before its
// results are handed on, instead of before the first wait.
func (ex *Executor) checkHash(ctx context.Context, g *group, final bool) error {
	if g.hashH == nil || g.hashChecked {
		return nil
	}
	if g.dev != nil && !final && !g.hashH.Done() {
		return nil
	}
	if err := g.hashH.Wait(ctx); err != nil {
		return fmt.Errorf("overlap: step %d: plan check on group %s: %w", ex.step, g.name, err)
	}
	if g.dev != nil {
		h, _ := comm.Int64s(g.hashRecv).Host()
		if err := g.dev.DownloadDevice(h, g.hashDev[1]); err != nil {
			return fmt.Errorf("overlap: step %d: plan check on group %s: %w", ex.step, g.name, err)
		}
	}
	g.hashChecked = true
	me := g.cm.Rank()
	var others []int
	for r, h := range g.hashRecv {
		if h != g.hashRecv[me] {
			others = append(others, r)
		}
	}
	if len(others) == 0 {
		return nil
	}
	hs := make([]uint64, len(g.hashRecv))
	for r, h := range g.hashRecv {
		hs[r] = uint64(h)
	}
	return &PlanMismatchError{Step: ex.step, Group: g.name, Hashes: hs, Rank: me, Others: others}
}

// Wait blocks until the collective producing out (a member's Out tensor)
// has completed and every member of its bucket has been scattered back. The
// time blocked is exposed communication.
func (ex *Executor) Wait(ctx context.Context, out string) error {
	b, ok := ex.byOut[out]
	if !ok {
		return fmt.Errorf("%w: Wait(%q): no bucket of the plan writes it", ErrUsage, out)
	}
	if err := ex.flushGroup(ctx); err != nil {
		return err
	}
	if !b.started {
		return ex.incomplete(b, fmt.Sprintf("Wait(%q)", out))
	}
	return ex.waitBucket(ctx, b)
}

// incomplete explains why b has not started: the members it still lacks,
// or, when it is full, the earliest bucket before it on its group that
// holds it back (the filler's in-order rule), so that the error names the
// tensor the program forgot and not a bucket that merely waited.
func (ex *Executor) incomplete(b *bucket, why string) error {
	var miss []string
	for i, h := range b.have {
		if !h {
			miss = append(miss, b.b.Members[i].Tensor)
		}
	}
	if len(miss) == 0 {
		// Full, but an earlier bucket of the group is not.
		for _, p := range b.g.buckets[:b.idx] {
			if !p.started {
				return ex.incomplete(p, why)
			}
		}
		return fmt.Errorf("%w: %s: bucket %q not started", ErrUsage, why, b.b.Name)
	}
	return &IncompleteError{Step: ex.step, Group: b.g.name, Bucket: b.b.Name, Region: b.b.Region, Missing: miss}
}

// waitBucket waits for b (already issued) and scatters it. The plan check
// comes first: a mismatch must be reported as such, not as whatever the
// mismatched collective did. The time blocked here is the step's exposed
// communication; the fused buffers go back to the free list as soon as the
// members are scattered, which is what bounds FusedPeakBytes.
func (ex *Executor) waitBucket(ctx context.Context, b *bucket) error {
	if b.waited {
		return nil
	}
	if b.g.dev != nil {
		return ex.waitDevice(ctx, b)
	}
	t0 := ex.cfg.Clock.Now()
	herr := ex.checkHash(ctx, b.g, false)
	var err error
	if herr == nil {
		err = b.h.Wait(ctx)
	}
	t1 := ex.cfg.Clock.Now()
	ex.exposed += t1.Sub(t0)
	if ex.tl != nil {
		ex.tl.complete(tidCompute, "wait "+b.b.Name, "wait", t0, t1, map[string]any{"step": ex.step, "bucket": b.b.Name})
	}
	if herr != nil {
		return herr
	}
	if err != nil {
		return fmt.Errorf("overlap: step %d: bucket %q on group %s: %w", ex.step, b.b.Name, b.g.name, err)
	}
	if b.timed {
		b.doneAt = b.h.(CompletionTimer).CompletedAt()
	}
	for i := range b.b.Members {
		b.unpack(i)
	}
	b.drop()
	b.waited, b.waitedAt = true, t1
	return nil
}

// waitDevice is waitBucket on a device group: the scatter is queued on the
// communicator's stream behind the collective, and the compute stream is
// made to wait for it there (the wait → compute edge on a GPU), so the CPU
// goes on queuing kernels. Exposed time is then only the CPU's (queuing);
// what the device waited is not seen here. Serial mode also blocks the CPU
// until the scatter is done: its no-overlap baseline.
func (ex *Executor) waitDevice(ctx context.Context, b *bucket) error {
	g := b.g
	t0 := ex.cfg.Clock.Now()
	err := ex.checkHash(ctx, g, ex.cfg.Mode == Serial)
	if err != nil {
		return err
	}
	h := b.h
	if !b.direct {
		var segs []Segment
		for i := range b.b.Members {
			if !b.have[i] || (b.views != nil && b.outs[i] == b.views[i]) {
				continue // flushed (nobody wants it), or a View (already there)
			}
			segs = append(segs, devSegs(b.unpackSegs(i), b.drecv.buf, b.outs[i], false)...)
		}
		if len(segs) > 0 {
			b.mem.copied += segBytes(segs)
			h = g.dev.CopyDevice(ctx, segs)
			g.last = h
		}
	}
	err = g.dev.WaitOnDevice(ctx, h)
	if err == nil && ex.cfg.Mode == Serial {
		err = h.Wait(ctx)
	}
	t1 := ex.cfg.Clock.Now()
	ex.exposed += t1.Sub(t0)
	if ex.tl != nil {
		ex.tl.complete(tidCompute, "wait "+b.b.Name, "wait", t0, t1, map[string]any{"step": ex.step, "bucket": b.b.Name, "device": true})
	}
	if err != nil {
		return fmt.Errorf("overlap: step %d: bucket %q on group %s: %w", ex.step, b.b.Name, g.name, err)
	}
	b.drop()
	b.waited, b.waitedAt = true, t1
	return nil
}

// EndRegion says the program has produced everything region will produce
// this step. Buckets of region still missing members are an
// *IncompleteError, unless the plan marks them Flush (or Config.FlushPartial
// is set): those start now with the missing slots zeroed, their results
// dropped.
func (ex *Executor) EndRegion(ctx context.Context, region string) error {
	sts, err := ex.filler.EndRegion(region)
	if err != nil {
		for _, b := range ex.byRegion[region] {
			if !b.started && !b.full() {
				return ex.incomplete(b, "EndRegion("+region+")")
			}
		}
		return fmt.Errorf("%w: %w", ErrIncomplete, err)
	}
	return ex.startAll(ctx, sts)
}

func (b *bucket) full() bool {
	for _, h := range b.have {
		if !h {
			return false
		}
	}
	return true
}

// zeroAbsent zeroes the slots of members not handed in this step, so that
// a flushed bucket's collective still has every rank's full buffer (all
// ranks must call it with the same size) and a sum over the missing slots
// adds nothing. Their results are never scattered (unpack skips them).
func (ex *Executor) zeroAbsent(ctx context.Context, b *bucket) error {
	if err := b.ensure(); err != nil {
		return err
	}
	var zs []Segment
	for i, m := range b.b.Members {
		if b.have[i] {
			continue
		}
		for _, s := range b.packSegs(i) {
			if b.g.dev != nil {
				zs = append(zs, Segment{Dst: b.dsend.buf, DstOff: s.fused, Bytes: s.n})
			} else {
				clear(b.send[s.fused : s.fused+s.n])
			}
		}
		ex.log.Debug().Int("step", ex.step).Str("bucket", b.b.Name).Str("tensor", m.Tensor).Msg("flushed without member")
	}
	b.partial = true
	if len(zs) > 0 {
		b.g.last = b.g.dev.CopyDevice(ctx, zs)
		if b.g.last.Done() {
			return b.g.last.Wait(ctx) // refused: the communicator failed
		}
	}
	return nil
}

// Finish ends the step: every bucket must have started (or be flushed, see
// FlushPartial); every collective is waited for and scattered, and the
// step's metrics are returned.
//
// A failed Finish breaks the executor (Begin refuses): collectives of the
// failed step may still be in flight on buffers the executor would reuse
// next step, and ranks may now be at different points of the plan, so
// the only safe way on is to close the executor and its communicators.
func (ex *Executor) Finish(ctx context.Context) (StepMetrics, error) {
	m, err := ex.finish(ctx)
	if err != nil {
		ex.broken = err
	}
	return m, err
}

func (ex *Executor) finish(ctx context.Context) (StepMetrics, error) {
	if !ex.inStep {
		return StepMetrics{}, fmt.Errorf("%w: Finish outside a step", ErrUsage)
	}
	ex.inStep = false
	ex.adjustProcs()
	// Flushable buckets still missing members are flushed at the end of
	// the step, as if their regions had ended.
	for _, g := range ex.groups {
		for _, b := range g.buckets {
			if !b.started && b.b.Flush {
				if err := ex.EndRegion(ctx, b.b.Region); err != nil {
					return StepMetrics{}, err
				}
			}
		}
	}
	if err := ex.flushGroup(ctx); err != nil {
		return StepMetrics{}, err
	}
	var incomplete error
	for _, g := range ex.groups {
		// Block once, on the group's last collective: the ones before it
		// complete first (issue order), so the loop below finds them done
		// instead of parking on each in turn.
		for i := len(g.buckets) - 1; i >= 0; i-- {
			if b := g.buckets[i]; b.started {
				if err := ex.waitBucket(ctx, b); err != nil {
					return StepMetrics{}, err
				}
				break
			}
		}
		for _, b := range g.buckets {
			if b.started {
				if err := ex.waitBucket(ctx, b); err != nil {
					return StepMetrics{}, err
				}
			} else if incomplete == nil {
				incomplete = ex.incomplete(b, "Finish")
			}
		}
	}
	// Device groups whose plan exchange had not completed by their first
	// wait are checked now, before the step's results are handed on.
	for _, g := range ex.groups {
		if g.dev != nil {
			if err := ex.checkHash(ctx, g, true); err != nil {
				return StepMetrics{}, err
			}
		}
	}
	if incomplete != nil {
		return StepMetrics{}, incomplete
	}
	m := StepMetrics{Step: ex.step, Exposed: ex.exposed, Compute: ex.compute, FusedPeakBytes: ex.mem.peak, CopiedBytes: ex.mem.copied}
	for _, g := range ex.groups {
		var prev time.Time
		for _, b := range g.buckets {
			if !b.started {
				continue
			}
			select {
			case <-b.recorded:
			case <-ctx.Done():
				return StepMetrics{}, ctx.Err()
			}
			// Every started bucket's own wait above succeeded (or Finish
			// returned), so context.Canceled here is the watcher being
			// stopped, not the collective failing; anything else is a
			// failure the watcher saw and the driver must report.
			if b.doneErr != nil && !errors.Is(b.doneErr, context.Canceled) {
				return StepMetrics{}, b.doneErr
			}
			// The collective occupies its group's stream from when it was
			// issued or the previous one finished, whichever is later.
			s := b.issued
			if prev.After(s) {
				s = prev
			}
			done := b.doneAt
			if done.Before(s) {
				done = s
			}
			m.Comm += done.Sub(s)
			m.Collectives++
			m.Bytes += b.b.Bytes
			prev = done
			if ex.tl != nil {
				ex.tl.complete(ex.tl.commTID(g.name), b.b.Name, "comm", s, done, map[string]any{
					"step": ex.step, "bytes": b.b.Bytes, "members": len(b.b.Members), "op": string(b.b.Op)})
				ex.tl.async(b.b.Name, "start→wait", b.issued, b.waitedAt, map[string]any{"step": ex.step})
			}
		}
	}
	end := ex.cfg.Clock.Now()
	m.Time = end.Sub(ex.begin)
	if ex.tl != nil {
		ex.tl.complete(tidStep, fmt.Sprintf("step %d", ex.step), "step", ex.begin, end, nil)
	}
	return m, nil
}
