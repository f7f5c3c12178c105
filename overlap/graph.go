package overlap

import (
	"context"
	"fmt"
	"slices"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// Kernel runs one compute node of a graph (the program's forward, backward
// or optimizer code for it). Builtin nodes (split, concat, sum) never reach
// it: GraphRunner runs those itself.
type Kernel func(ctx context.Context, n *stepgraph.Node) error

// Tensors maps a tensor name to its buffer. The runner asks for every
// member input and output of every start and for the operands of builtins;
// the same name must give the same memory for the whole step.
type Tensors func(name string) (comm.Buffer, error)

// GraphRunner executes a (bucketed) step graph step after step over an
// Executor: compute in plan order; each start issued once the node that
// makes its last input has run (the compute that writes it, or the wait of
// the collective that delivers it) and the prefetch bounds allow it, and at
// its plan position at the latest; each wait taken right before the first
// compute that reads one of its outputs (as late as data allows), the rest
// at the end of the step.
//
// Prefetch bounds (Config.PrefetchStarts, Config.MaxInFlightBytes) say how
// far ahead of its plan position a start may go out: with none, a
// parameter gather whose input exists at step start goes out at step start,
// and its gathered buffer is held from then on. The plan's positions are
// themselves a schedule (the author's, or Reshard's re-gathers one block
// before their reader), so PrefetchStarts 0 runs exactly that schedule.
//
// A start whose input is another collective's output (hybrid sharding: a
// reduce-scatter on the shard group, then an all-reduce of its result on
// the replica group) is issued only after that collective's wait, which the
// runner takes just before issuing it. Any number of process groups may
// appear, one communicator each. Both backends (Native, Grouped) run the
// same plan.
//
// Memory: the runner follows every collective output from its start to its
// last reader (for a collective reader, to that collective's wait), calls
// the release hook (SetRelease) when one dies so the program can free it,
// and reports the most bytes held at once as StepMetrics.PeakBytes (and as
// a counter on the trace): the run-time counterpart of
// stepgraph.PeakCollectiveBytes.
type GraphRunner struct {
	g   *stepgraph.Graph
	ex  *Executor
	cfg Config
	// after[i] lists the start nodes whose inputs are complete once node i
	// has run; after[-1] those ready when the step begins.
	after map[int][]int
	// waitsBefore[i] lists the outputs compute node i must wait for, one
	// per collective: the executor's wait for one output of a bucket
	// scatters every member before it returns, so the collective's other
	// outputs need no wait of their own (a bucket of 200 gradients read
	// by one optimizer: one wait, not 200, which cost 28 µs of a 450 µs
	// step on 2 ranks over shared memory, notes/step-path.md).
	waitsBefore map[int][]string
	// deps[s] lists, for start node s, the collective outputs among its
	// inputs: they are waited for right before s is issued.
	deps map[int][]string
	// ord[s] is start node s's position among the starts (plan order);
	// bytes[s] its fused input bytes.
	ord   map[int]int
	bytes map[int]int64
	// Memory bookkeeping of collective outputs, by index (outIx; the
	// step's state is then slices, not maps keyed by name, which cost
	// most of a 200-member bucket's bookkeeping): name and size, the
	// outputs of each start in member order, the compute node after
	// which an output dies, or the start whose wait it dies at.
	outIx    map[string]int32
	outName  []string
	outSize  []int64
	outsOf   map[int][]int32
	outStart map[string]int // output → its start node
	// bucketOf[s] is start node s's bucket in the executor: the runner
	// hands members in by place (Executor.readyAt), not by name.
	bucketOf     map[int]*bucket
	diesAfter    map[int][]int32
	diesAtWaitOf map[int][]int32
	startsBefore []int // startsBefore[i]: number of starts at plan positions < i

	release func(tensor string)
	// bound: tensors whose buffers the program bound (Bind); boundAt[s]
	// their buffers per member of start s (input, output; nil: ask
	// Tensors), rebuilt by Bind, so a step looks nothing up by name.
	bound   map[string]comm.Buffer
	boundAt map[int][]memberBufs
	// st is the step's state, its maps kept from step to step: made
	// afresh, the live map grew and rehashed through 200 outputs every
	// step (BenchmarkGraphRunnerStep).
	st stepState
}

// SetRelease registers f, called (from the goroutine running Step) when a
// collective output has been read for the last time this step, so the
// program can free or reuse its memory; the runner asks for the tensor again
// (Tensors) next step. Outputs nobody in the graph reads (results of the
// step) are not released. Call it before the first Step.
func (gr *GraphRunner) SetRelease(f func(tensor string)) { gr.release = f }

// NewGraphRunner validates g, extracts its plan (stepgraph.Plan) and
// prepares an Executor over comms.
func NewGraphRunner(g *stepgraph.Graph, comms map[string]Comm, cfg Config) (*GraphRunner, error) {
	plan, err := stepgraph.Plan(g)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	ex, err := New(plan, comms, cfg)
	if err != nil {
		return nil, err
	}
	gr := &GraphRunner{g: g, ex: ex, cfg: cfg, after: map[int][]int{}, waitsBefore: map[int][]string{}, deps: map[int][]string{},
		ord: map[int]int{}, bytes: map[int]int64{}, outIx: map[string]int32{}, outsOf: map[int][]int32{}, outStart: map[string]int{}, bucketOf: map[int]*bucket{},
		diesAfter: map[int][]int32{}, diesAtWaitOf: map[int][]int32{}, startsBefore: make([]int, len(g.Nodes)+1)}
	writer := map[string]int{}
	outOf := map[string]bool{}
	startAt := map[string]int{}
	waitedAt := map[string]int{} // collective output → its wait node
	lastRead := map[string]int{} // collective output → last reader node
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		gr.startsBefore[i+1] = gr.startsBefore[i]
		switch nd.Kind {
		case stepgraph.Wait:
			if s, ok := startAt[nd.Of]; ok {
				for _, m := range g.Nodes[s].Members {
					waitedAt[m.Out] = i
				}
			}
		case stepgraph.Compute:
			for _, r := range nd.Reads {
				if outOf[r] {
					gr.waitsBefore[i] = append(gr.waitsBefore[i], r)
					// Waited once is enough, for r and every other
					// output of its collective.
					for _, m := range g.Nodes[gr.outStart[r]].Members {
						outOf[m.Out] = false
					}
				}
				if _, ok := gr.outIx[r]; ok {
					lastRead[r] = i
				}
			}
			for _, w := range nd.Writes {
				writer[w] = i
			}
		case stepgraph.Start:
			startAt[nd.Name] = i
			for _, b := range ex.byGroup[nd.Group].buckets {
				if b.b.Name == nd.Name {
					gr.bucketOf[i] = b
				}
			}
			if gr.bucketOf[i] == nil || len(gr.bucketOf[i].b.Members) != len(nd.Members) {
				ex.Close()
				return nil, fmt.Errorf("%w: start %q has no bucket of its members in the plan", ErrPlan, nd.Name)
			}
			gr.ord[i] = gr.startsBefore[i]
			gr.startsBefore[i+1]++
			cm := comms[nd.Group] // New checked it exists
			// Issued after the last node that makes an input: the compute
			// that writes it, or the wait of the collective that delivers
			// it (Validate has checked that this wait precedes the start).
			last := -1
			for _, m := range nd.Members {
				gr.bytes[i] += m.Bytes
				if w, ok := writer[m.In]; ok && w > last {
					last = w
				}
				if w, ok := waitedAt[m.In]; ok {
					gr.deps[i] = append(gr.deps[i], m.In)
					last = max(last, w)
				}
				if _, ok := gr.outIx[m.In]; ok {
					lastRead[m.In] = i
				}
			}
			gr.after[last] = append(gr.after[last], i)
			for _, m := range nd.Members {
				outOf[m.Out] = true
				x, ok := gr.outIx[m.Out]
				if !ok {
					x = int32(len(gr.outName))
					gr.outIx[m.Out] = x
					gr.outName, gr.outSize = append(gr.outName, m.Out), append(gr.outSize, 0)
				}
				gr.outSize[x] = outputBytes(nd.Op, m.Bytes, int64(cm.Size()))
				gr.outsOf[i] = append(gr.outsOf[i], x)
				gr.outStart[m.Out] = i
			}
		}
	}
	for t, r := range lastRead {
		if g.Nodes[r].Kind == stepgraph.Start {
			gr.diesAtWaitOf[r] = append(gr.diesAtWaitOf[r], gr.outIx[t])
		} else {
			gr.diesAfter[r] = append(gr.diesAfter[r], gr.outIx[t])
		}
	}
	return gr, nil
}

// outputBytes is a member's output size on one rank of n.
func outputBytes(op stepgraph.Op, in, n int64) int64 {
	switch op {
	case "all_gather":
		return in * n
	case "reduce_scatter":
		return in / max(n, 1)
	}
	return in
}

// View returns the memory tensor should live in so that bucketing copies
// nothing: its slot in the fused buffer of its bucket, as DDP's
// gradient_as_bucket_view gives gradients. ok is false when the tensor
// needs no view (it travels alone: its collective runs on the program's
// own buffer) or cannot have one (its bucket is not an all-reduce or
// broadcast, whose members are contiguous and reduced in place), and
// when tensor is not the input of any start. A program that computes the
// tensor into the view, and returns the view from Tensors for both the
// member's input and its output, is neither packed nor scattered
// (StepMetrics.CopiedBytes stays 0); the slot is the tensor's for the
// runner's life and holds the reduced result after the bucket's wait.
// Ask for views before the first Step.
func (gr *GraphRunner) View(tensor string) (comm.Buffer, bool) {
	locs := gr.ex.byIn[tensor]
	if len(locs) == 0 {
		return nil, false
	}
	b := locs[0].b
	if len(b.b.Members) < 2 || (b.b.Op != buckets.AllReduce && b.b.Op != buckets.Broadcast) {
		return nil, false
	}
	v, err := gr.ex.View(tensor)
	if err != nil {
		return nil, false // not reached: the bucket was checked above
	}
	return v, true
}

// memberBufs are a member's bound input and output (nil: not bound).
type memberBufs struct{ in, out comm.Buffer }

// Bind makes buf tensor's buffer for every step from now on: the runner
// hands it to the collectives that read or write tensor without asking
// Tensors for it. It is for buffers that persist from step to step, as
// DDP's gradients living in their bucket do (View's slots, which a
// program binds as both the member's input and its output) or parameter
// shards: looking each up by name every step is the program's cost, twice
// per member, and with 200 gradients of 40 KB on 2 ranks over shared
// memory it was 20-40 µs of a 0.57 ms step (notes/step-path.md). A nil
// buf unbinds tensor (Tensors is asked again). tensor must be a
// collective's input or output. Call it between steps. A released output
// (SetRelease) that is bound stays bound: the program must keep its
// buffer or unbind it.
func (gr *GraphRunner) Bind(tensor string, buf comm.Buffer) error {
	if gr.ex.inStep {
		return fmt.Errorf("%w: Bind(%q) during a step", ErrUsage, tensor)
	}
	known := false
	for i := range gr.g.Nodes {
		nd := &gr.g.Nodes[i]
		if nd.Kind != stepgraph.Start {
			continue
		}
		for _, m := range nd.Members {
			known = known || m.In == tensor || m.Out == tensor
		}
	}
	if !known {
		return fmt.Errorf("%w: Bind(%q): no collective of the graph reads or writes it", ErrUsage, tensor)
	}
	if gr.bound == nil {
		gr.bound = map[string]comm.Buffer{}
	}
	if buf == nil {
		delete(gr.bound, tensor)
	} else {
		gr.bound[tensor] = buf
	}
	gr.boundAt = map[int][]memberBufs{}
	for i := range gr.g.Nodes {
		nd := &gr.g.Nodes[i]
		if nd.Kind != stepgraph.Start {
			continue
		}
		var bs []memberBufs
		for k, m := range nd.Members {
			in, out := gr.bound[m.In], gr.bound[m.Out]
			if in == nil && out == nil {
				continue
			}
			if bs == nil {
				bs = make([]memberBufs, len(nd.Members))
			}
			bs[k] = memberBufs{in, out}
		}
		if bs != nil {
			gr.boundAt[i] = bs
		}
	}
	return nil
}

// Executor is the executor underneath, for its Timeline and Plan.
func (gr *GraphRunner) Executor() *Executor { return gr.ex }

// Close stops the executor.
func (gr *GraphRunner) Close() error { return gr.ex.Close() }

// stepState is one step's scheduling and memory state.
type stepState struct {
	pending  []int        // ready starts not yet issued, in plan order
	inflight map[int]bool // issued starts whose outputs the runner has not waited for
	inBytes  int64        // their fused bytes
	live     []bool       // collective outputs held, by index
	liveB    int64
	peak     int64
}

// Step runs the graph once: collectives are issued as early as the
// prefetch bounds allow, compute runs in plan order after the waits it
// needs, and collective outputs are freed after their last reader.
func (gr *GraphRunner) Step(ctx context.Context, step int, tensors Tensors, kernel Kernel) (StepMetrics, error) {
	ex := gr.ex
	if err := ex.Begin(step); err != nil {
		return StepMetrics{}, err
	}
	r := gr.newStepRun(ctx, tensors)
	if err := r.run(step, kernel); err != nil {
		ex.inStep = false
		ex.broken = err
		return StepMetrics{}, err
	}
	m, err := ex.Finish(ctx)
	if err != nil {
		return m, err
	}
	r.freeAll()
	m.PeakBytes = gr.st.peak
	return m, nil
}

// stepRun is one Step's call: its context, its tensors, and the runner's
// step state.
type stepRun struct {
	gr      *GraphRunner
	ex      *Executor
	st      *stepState
	ctx     context.Context
	tensors Tensors
	look    Tensors // tensors, with bound buffers first: what builtins read
}

func (gr *GraphRunner) newStepRun(ctx context.Context, tensors Tensors) *stepRun {
	r := &stepRun{gr: gr, ex: gr.ex, st: &gr.st, ctx: ctx, tensors: tensors, look: tensors}
	// Builtin computes find bound tensors as collectives do.
	if len(gr.bound) > 0 {
		r.look = func(name string) (comm.Buffer, error) {
			if b, ok := gr.bound[name]; ok {
				return b, nil
			}
			return tensors(name)
		}
	}
	st := r.st
	if st.live == nil {
		st.inflight, st.live = make(map[int]bool, len(gr.ord)), make([]bool, len(gr.outName))
	}
	clear(st.inflight)
	clear(st.live)
	st.pending, st.inBytes, st.liveB, st.peak = st.pending[:0], 0, 0, 0
	return r
}

// run walks the plan: at each node it first issues the starts that may go,
// then waits make later starts ready, and compute runs after the waits it
// needs, freeing what it read last.
func (r *stepRun) run(step int, kernel Kernel) error {
	gr := r.gr
	r.ready(gr.after[-1])
	for i := range gr.g.Nodes {
		if err := r.pump(i); err != nil {
			return err
		}
		nd := &gr.g.Nodes[i]
		switch nd.Kind {
		case stepgraph.Wait:
			r.ready(gr.after[i])
			continue
		case stepgraph.Start:
			continue // issued by pump, at this position at the latest
		}
		for _, out := range gr.waitsBefore[i] {
			if err := r.wait(out); err != nil {
				return err
			}
		}
		err := r.ex.Compute(r.ctx, nd.Name, nd.Region, func() error {
			if nd.Builtin != "" {
				return builtin(nd, r.look)
			}
			return kernel(r.ctx, nd)
		})
		if err != nil {
			return fmt.Errorf("overlap: step %d: compute %q: %w", step, nd.Name, err)
		}
		for _, t := range gr.diesAfter[i] {
			r.free(t, true)
		}
		r.ready(gr.after[i])
	}
	return r.pump(len(gr.g.Nodes))
}

// record adds the collective memory held now to the timeline.
func (r *stepRun) record() {
	if r.ex.tl != nil {
		r.ex.tl.counter("collective memory", r.ex.cfg.Clock.Now(), map[string]any{"bytes": r.st.liveB})
	}
}

// hold counts collective output x as live.
func (r *stepRun) hold(x int32) {
	st := r.st
	if st.live[x] {
		return
	}
	st.live[x] = true
	st.liveB += r.gr.outSize[x]
	st.peak = max(st.peak, st.liveB)
	r.record()
}

// free drops collective output x, telling the program (hook) when it may
// reuse the memory.
func (r *stepRun) free(x int32, hook bool) {
	st := r.st
	if !st.live[x] {
		return
	}
	st.live[x] = false
	st.liveB -= r.gr.outSize[x]
	r.record()
	if hook && r.gr.release != nil {
		r.gr.release(r.gr.outName[x])
	}
}

// waited marks what the runner has waited for: the start is no longer in
// flight, and outputs whose last reader it was die.
func (r *stepRun) waited(out string) {
	s := r.gr.outStart[out]
	if r.st.inflight[s] {
		delete(r.st.inflight, s)
		r.st.inBytes -= r.gr.bytes[s]
	}
	for _, t := range r.gr.diesAtWaitOf[s] {
		r.free(t, true)
	}
}

func (r *stepRun) wait(out string) error {
	if err := r.ex.Wait(r.ctx, out); err != nil {
		return err
	}
	r.waited(out)
	return nil
}

// issue starts collective si once the collectives it depends on are
// waited: each member's buffers are found (bound, or from tensors) and
// handed to the executor.
func (r *stepRun) issue(si int) error {
	gr := r.gr
	for _, d := range gr.deps[si] {
		if err := r.wait(d); err != nil {
			return err
		}
	}
	nd := &gr.g.Nodes[si]
	outs, bk, bound := gr.outsOf[si], gr.bucketOf[si], gr.boundAt[si]
	for k, m := range nd.Members {
		var in, out comm.Buffer
		if bound != nil {
			in, out = bound[k].in, bound[k].out
		}
		var err error
		if in == nil {
			if in, err = r.tensors(m.In); err != nil {
				return fmt.Errorf("overlap: start %q: %w", nd.Name, err)
			}
		}
		if out == nil {
			if out, err = r.tensors(m.Out); err != nil {
				return fmt.Errorf("overlap: start %q: %w", nd.Name, err)
			}
		}
		r.hold(outs[k])
		if err := r.ex.readyAt(r.ctx, bk, k, in, out); err != nil {
			return err
		}
	}
	r.st.inflight[si] = true
	r.st.inBytes += gr.bytes[si]
	return nil
}

// pump issues pending starts, in plan order, while the plan has reached
// them (pos is the next node to run) or the prefetch bounds allow them out
// early.
func (r *stepRun) pump(pos int) error {
	gr, st := r.gr, r.st
	for len(st.pending) > 0 {
		si := st.pending[0]
		if si >= pos {
			ahead := gr.ord[si] - gr.startsBefore[pos] // 0: the next start the plan reaches
			if gr.cfg.PrefetchStarts >= 0 && ahead >= gr.cfg.PrefetchStarts {
				return nil
			}
			if gr.cfg.MaxInFlightBytes > 0 && st.inBytes > 0 && st.inBytes+gr.bytes[si] > gr.cfg.MaxInFlightBytes {
				return nil
			}
		}
		if err := r.issue(si); err != nil {
			return err
		}
		st.pending = st.pending[1:]
	}
	return nil
}

// ready queues starts whose dependencies are now met.
func (r *stepRun) ready(starts []int) {
	r.st.pending = append(r.st.pending, starts...)
	slices.Sort(r.st.pending)
}

// freeAll ends the step's memory accounting once every collective has
// completed: what a collective read last can go; results of the step stay
// with the program.
func (r *stepRun) freeAll() {
	for s := range r.st.inflight {
		for _, t := range r.gr.diesAtWaitOf[s] {
			r.free(t, true)
		}
	}
	for x, l := range r.st.live {
		if l {
			r.free(int32(x), false)
		}
	}
}

// builtin runs split, concat or sum on host buffers of any dtype (sum on
// float32 only, the dtype chunked gradients have here).
func builtin(nd *stepgraph.Node, tensors Tensors) error {
	host := func(name string) ([]byte, comm.Buffer, error) {
		b, err := tensors(name)
		if err != nil {
			return nil, nil, err
		}
		h, ok := b.Host()
		if !ok {
			return nil, nil, fmt.Errorf("%w: builtin %s: tensor %q not in host memory", ErrUsage, nd.Builtin, name)
		}
		return h, b, nil
	}
	if len(nd.Reads) == 0 || len(nd.Writes) == 0 {
		return fmt.Errorf("%w: builtin %s of node %q needs reads and writes", ErrUsage, nd.Builtin, nd.Name)
	}
	switch nd.Builtin {
	case stepgraph.Split:
		src, _, err := host(nd.Reads[0])
		if err != nil {
			return err
		}
		half := len(src) / len(nd.Writes)
		for i, w := range nd.Writes {
			dst, _, err := host(w)
			if err != nil {
				return err
			}
			copy(dst, src[i*half:(i+1)*half])
		}
	case stepgraph.Concat:
		dst, _, err := host(nd.Writes[0])
		if err != nil {
			return err
		}
		off := 0
		for _, r := range nd.Reads {
			src, _, err := host(r)
			if err != nil {
				return err
			}
			off += copy(dst[off:], src)
		}
	case stepgraph.Sum:
		_, db, err := host(nd.Writes[0])
		if err != nil {
			return err
		}
		if db.DType() != comm.Float32 {
			return fmt.Errorf("%w: builtin sum of %s: only float32", ErrUsage, db.DType())
		}
		d := comm.AsFloat32(db)
		for k, r := range nd.Reads {
			_, sb, err := host(r)
			if err != nil {
				return err
			}
			s := comm.AsFloat32(sb)
			if k == 0 {
				copy(d, s)
				continue
			}
			for j := range d {
				d[j] += s[j]
			}
		}
	default:
		return fmt.Errorf("%w: unknown builtin %q", ErrUsage, nd.Builtin)
	}
	return nil
}
