// Command stepbench measures the step runtime over real processes (run it
// under gorun; scripts/bench-step.sh does). Both measurements go through
// the path a program takes: the step written as a stepgraph.Graph, the
// bucketing passes the trainer runs, and overlap's GraphRunner.
//
//   - synthetic: a transformer-shaped step of L blocks, each with a forward
//     parameter all-gather (placed --prefetch blocks ahead in the graph) and
//     a backward gradient reduce-scatter, compute modelled as a timed sleep
//     (as on an accelerator, where the CPU is free for communication). It
//     measures communication alone (C), compute alone (P), the serial step
//     and the overlapped step, and reports the overlapped step against the
//     ideal max(P, C) and the serial sum, and the exposed communication
//     (time blocked in waits) as a fraction of C. Compute is sized to
//     ratio × C; after backward an optimizer updates block by block, each
//     update waiting for its own gradient right before reading it.
//     --compute cpu replaces the sleeps by fixed arithmetic (compute.go),
//     and every run prints the bound the cores allow next to max(P, C):
//     compute and communication share the job's cores, so no schedule
//     beats the CPU time both need (measured per step with getrusage,
//     summed over ranks) spread over those cores.
//   - bucketing: 200 gradient tensors of 40 KB all-reduced per step, the
//     graph as written (one collective per tensor) against the graph the
//     bucketing passes make of it.
//
// Times are medians over iterations of the slowest rank's step.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/rank"
	"github.com/gorun-hpc/gorun/stepgraph"
	"github.com/rs/zerolog"
)

type opts struct {
	blocks    int
	shard     int // bytes per rank per block
	ratio     float64
	iters     int
	tensors   int
	tensorB   int
	forceTCP  bool
	caps      []int64
	what      string
	trace     string
	exectrace string
	compute   string
	minProcs  int
	prefetch  int
	opt       float64
}

func main() {
	var o opts
	flag.IntVar(&o.blocks, "blocks", 16, "synthetic: transformer blocks")
	flag.IntVar(&o.shard, "shard", 256<<10, "synthetic: parameter bytes per rank per block")
	flag.Float64Var(&o.ratio, "ratio", 1.5, "synthetic: compute time as a multiple of the measured communication time")
	flag.IntVar(&o.iters, "iters", 10, "timed steps per measurement (after 2 warm-up steps)")
	flag.IntVar(&o.tensors, "tensors", 200, "bucketing: gradient tensors per step")
	flag.IntVar(&o.tensorB, "tensor-bytes", 40_000, "bucketing: bytes per tensor")
	capList := flag.String("caps", "0,25000000", "bucketing: bucket caps to try, comma-separated bytes (0: the cost model's; 25 MB is DDP's default)")
	flag.BoolVar(&o.forceTCP, "tcp", false, "TCP even between ranks of one host (no shared memory)")
	flag.StringVar(&o.what, "run", "all", "synthetic, bucketing or all")
	flag.Float64Var(&o.opt, "optimizer", 0.25, "synthetic: optimizer compute per block, as a fraction of its forward (0: none)")
	flag.IntVar(&o.prefetch, "prefetch", 2, "synthetic: forward gathers in flight ahead of compute (FSDP's limit; ≥ 1)")
	flag.StringVar(&o.trace, "trace", "", "synthetic: write rank 0's timeline of the native overlapped runs here (Chrome trace JSON)")
	prof := flag.String("cpuprofile", "", "write rank 0's CPU profile here")
	flag.StringVar(&o.compute, "compute", computeSleep, "synthetic: the modelled compute, sleep (an accelerator's: the CPU idles) or cpu (fixed arithmetic: compute and communication share the cores)")
	flag.IntVar(&o.minProcs, "min-procs", overlap.DefaultConfig().MinProcs, "overlap.Config.MinProcs of every runner (0: GOMAXPROCS as the launcher set it, 1 under gorun)")
	flag.StringVar(&o.exectrace, "exectrace", "", "synthetic: write a Go execution trace of rank 0's extra native overlapped steps here (go tool trace)")
	flag.Parse()
	o.prefetch = max(o.prefetch, 1)
	if o.compute != computeSleep && o.compute != computeCPU {
		fmt.Fprintf(os.Stderr, "stepbench: --compute %q: expected %s or %s\n", o.compute, computeSleep, computeCPU)
		os.Exit(2)
	}
	if o.minProcs < 0 {
		fmt.Fprintf(os.Stderr, "stepbench: --min-procs %d: expected ≥ 0\n", o.minProcs)
		os.Exit(2)
	}
	for _, f := range strings.Split(*capList, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || v < 0 {
			fmt.Fprintf(os.Stderr, "stepbench: bad --caps entry %q\n", f)
			os.Exit(2)
		}
		o.caps = append(o.caps, v)
	}
	if *prof != "" && os.Getenv("GORUN_RANK") == "0" {
		f, err := os.Create(*prof)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	if err := mainErr(o); err != nil {
		fmt.Fprintf(os.Stderr, "stepbench: %v\n", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func mainErr(o opts) error {
	ctx := context.Background()
	ropts := rank.DefaultOptions()
	ropts.Logger = zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	ropts.Endpoint.ForceTCP = o.forceTCP
	ropts.RequireLauncher = true // a step benchmark of one rank measures nothing
	r, err := rank.Init(ctx, ropts)
	if err != nil {
		return err
	}
	err = bench(ctx, r.Comm(), o)
	if err != nil {
		r.Abort(err)
	}
	return errors.Join(err, r.Close())
}

// slowest returns the maximum of d over ranks.
func slowest(ctx context.Context, c *comm.Comm, d time.Duration) (time.Duration, error) {
	return reduced(ctx, c, d, comm.Max)
}

// reduced returns d reduced over ranks with op.
func reduced(ctx context.Context, c *comm.Comm, d time.Duration, op comm.Op) (time.Duration, error) {
	v := []float64{float64(d)}
	if err := c.AllReduce(ctx, comm.Float64s(v), comm.Float64s(v), op).Wait(ctx); err != nil {
		return 0, err
	}
	return time.Duration(v[0]), nil
}

type sample struct {
	step, comm, exposed, compute time.Duration
	// cpu is the CPU time the step cost the job: every thread of every
	// rank, summed (0 where it cannot be read).
	cpu time.Duration
	// mine is this rank's own CPU time per step (its threads only).
	mine        time.Duration
	collectives int
}

// measure runs each of steps 2 warm-up + iters times, alternating between
// them so that load from other processes on a shared machine hits all of
// them alike, and returns per step function the medians of the slowest
// rank's step time and of this rank's comm and exposed times.
func measure(ctx context.Context, c *comm.Comm, iters int, steps ...func(i int) (overlap.StepMetrics, error)) ([]sample, error) {
	st := make([][]time.Duration, len(steps))
	cm := make([][]time.Duration, len(steps))
	ex := make([][]time.Duration, len(steps))
	cp := make([][]time.Duration, len(steps))
	cu := make([][]time.Duration, len(steps))
	mi := make([][]time.Duration, len(steps))
	nc := make([]int, len(steps))
	for i := range iters + 2 {
		for k, step := range steps {
			if err := c.Barrier(ctx).Wait(ctx); err != nil {
				return nil, err
			}
			cpu0 := processCPU()
			m, err := step(i)
			if err != nil {
				return nil, err
			}
			mine := processCPU() - cpu0
			cpu, err := reduced(ctx, c, mine, comm.Sum)
			if err != nil {
				return nil, err
			}
			s, err := slowest(ctx, c, m.Time)
			if err != nil {
				return nil, err
			}
			nc[k] = m.Collectives
			if i >= 2 {
				st[k], cm[k], ex[k], cp[k] = append(st[k], s), append(cm[k], m.Comm), append(ex[k], m.Exposed), append(cp[k], m.Compute)
				cu[k], mi[k] = append(cu[k], cpu), append(mi[k], mine)
			}
		}
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	out := make([]sample, len(steps))
	for k := range steps {
		out[k] = sample{med(st[k]), med(cm[k]), med(ex[k]), med(cp[k]), med(cu[k]), med(mi[k]), nc[k]}
	}
	return out, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1e3) }

func bench(ctx context.Context, c *comm.Comm, o opts) error {
	lead := c.Rank() == 0
	say := func(format string, a ...any) {
		if lead {
			fmt.Printf(format, a...)
		}
	}
	kinds := c.LinkKinds()
	link := "none"
	for _, k := range kinds {
		if k != "" {
			link = k
		}
	}
	if o.what == "all" || o.what == "synthetic" {
		if err := synthetic(ctx, c, o, say, link); err != nil {
			return err
		}
	}
	if o.what == "all" || o.what == "bucketing" {
		if err := bucketing(ctx, c, o, say, link); err != nil {
			return err
		}
	}
	return nil
}

// scheduleBound runs g the way the graph runner does with starts at their
// plan positions (compute in plan order, a group's collectives one at a
// time in issue order, a wait blocking until its collective is done), on
// a clock, with each compute taking compute(node) and each collective
// coll(node): the best step the graph's dependencies allow when compute
// and communication never slow each other down. stepgraph.Simulate does
// the same with a cost model; here every time is a measured one.
func scheduleBound(g *stepgraph.Graph, compute, coll func(*stepgraph.Node) time.Duration) time.Duration {
	var now time.Duration
	free := map[string]time.Duration{} // per group: when its stream is done
	end := map[string]time.Duration{}  // per start: when its collective is done
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		switch nd.Kind {
		case stepgraph.Compute:
			now += compute(nd)
		case stepgraph.Start:
			free[nd.Group] = max(now, free[nd.Group]) + coll(nd)
			end[nd.Name] = free[nd.Group]
		case stepgraph.Wait:
			now = max(now, end[nd.Of])
		}
	}
	return now
}

// jobCores counts the CPUs any rank of the job may run on (the union of
// their affinities): ranks bound to a core each, or unbound and sharing
// them, have those cores between them.
func jobCores(ctx context.Context, c *comm.Comm) (int, error) {
	m := cpuMask()
	if m == nil {
		m = make([]float64, maxCPUs)
	}
	if err := c.AllReduce(ctx, comm.Float64s(m), comm.Float64s(m), comm.Max).Wait(ctx); err != nil {
		return 0, err
	}
	return count(m), nil
}

// count counts a CPU mask's CPUs (at least 1: a mask that could not be
// read stands for one).
func count(m []float64) int {
	n := 0
	for _, v := range m {
		if v > 0 {
			n++
		}
	}
	return max(n, 1)
}

// bucketing all-reduces tensors per step, per tensor against bucketed: the
// step graph as written (one collective per tensor) against the graph the
// bucketing passes make of it, both run by the graph runner.
func bucketing(ctx context.Context, c *comm.Comm, o opts, say func(string, ...any), link string) error {
	authored, err := bucketingGraph(c.Size(), o)
	if err != nil {
		return err
	}
	bufs := make([][]float32, o.tensors)
	for i := range bufs {
		bufs[i] = make([]float32, o.tensorB/4)
	}
	// The cost model from this fabric: α and β fitted to all-reduces
	// measured here, and the rate of the executor's copies, so that the
	// cap and whether a bucket pays at all follow what was measured.
	model, err := measureModel(ctx, c, o.tensors*(o.tensorB/4*4), o.tensors)
	if err != nil {
		return err
	}
	variants := []bucketVariant{{capB: -1}} // as written: one collective per tensor
	for _, capB := range o.caps {
		variants = append(variants, bucketVariant{capB, false}, bucketVariant{capB, true})
	}
	var names []string
	nb := map[string]int{}
	var steps []func(int) (overlap.StepMetrics, error)
	for _, v := range variants {
		name, r, step, err := v.runner(ctx, c, o, authored, model, bufs)
		if err != nil {
			return err
		}
		defer r.Close()
		names = append(names, name)
		nb[name] = len(r.Executor().Plan().Groups[0].Buckets)
		steps = append(steps, step)
	}
	steps = append(steps, rawAllReduces(ctx, c, bufs, true), rawAllReduces(ctx, c, bufs, false))
	res, err := measure(ctx, c, o.iters, steps...)
	if err != nil {
		return err
	}
	pt := res[0].step
	say("bucketing: %d ranks (%s), %d gradient tensors of %d B all-reduced per step\n", c.Size(), link, o.tensors, o.tensorB)
	say("  cost model measured here: α (per extra back-to-back call) = %v, bus bandwidth %.2f GB/s, executor copies %.2f GB/s → cap %d B; a %d B member pays to merge with copies: %v\n",
		model.Latency, model.BusBandwidth/1e9, model.CopyBandwidth/1e9, model.CapBytes(), o.tensorB,
		model.MergePays(buckets.AllReduce, int64(o.tensorB/4*4), c.Size()))
	for k, name := range names {
		line := fmt.Sprintf("  %-40s %4d collectives  %s (rank 0: collectives %s of it)", name, nb[name], ms(res[k].step), ms(res[k].comm))
		if k > 0 {
			line += fmt.Sprintf("  speed-up %.2f×  (goal ≥ 3×)", float64(pt)/float64(res[k].step))
		}
		say("%s\n", line)
	}
	nr := len(names)
	say("  reference without the executor: %d back-to-back all-reduces %s, one fused all-reduce %s: bound %.2f× (the most any bucketing can gain here)\n",
		o.tensors, ms(res[nr].step), ms(res[nr+1].step), float64(res[nr].step)/float64(res[nr+1].step))
	return nil
}

// bucketingGraph is the step as written: one backward writing every
// gradient, one all-reduce per gradient, the optimizer reading them all.
func bucketingGraph(n int, o opts) (*stepgraph.Graph, error) {
	b := stepgraph.NewBuilder().Group("world", n).Region("model")
	var outs, grads []string
	for i := range o.tensors {
		grads = append(grads, fmt.Sprintf("t%d", i))
	}
	b.Compute("backward", buckets.Backward, "model", time.Millisecond, nil, grads)
	for i := range o.tensors {
		b.Start(fmt.Sprintf("ar%d", i), buckets.Backward, "model", buckets.AllReduce, "world", "f32",
			[]stepgraph.Member{{In: fmt.Sprintf("t%d", i), Out: fmt.Sprintf("T%d", i), Bytes: int64(o.tensorB / 4 * 4)}})
		outs = append(outs, fmt.Sprintf("T%d", i))
	}
	for i := range o.tensors {
		b.Wait(fmt.Sprintf("ar%d.w", i), fmt.Sprintf("ar%d", i), "model")
	}
	b.Compute("optimizer", buckets.Optimizer, "model", 0, outs, []string{"updated"})
	return b.Graph()
}

// bucketVariant is one side of the bucketing measurement: the graph as
// written (capB -1), or bucketed by the passes under a cap, its members
// copied into the bucket or (views) living in it.
type bucketVariant struct {
	capB  int64
	views bool
}

// runner plans the variant's graph and returns its name, its runner (the
// caller closes it) and one step of it over bufs.
func (v bucketVariant) runner(ctx context.Context, c *comm.Comm, o opts, authored *stepgraph.Graph, model buckets.Model,
	bufs [][]float32) (string, *overlap.GraphRunner, func(int) (overlap.StepMetrics, error), error) {
	g, name := authored, "one collective per tensor (as written)"
	if v.capB >= 0 {
		bc := buckets.DefaultConfig()
		bc.Model = model
		how := "copies"
		if v.views {
			// Members live in the bucket: merging copies nothing.
			bc.Model.CopyBandwidth = 0
			how = "views"
		}
		bc.CapBytes = v.capB
		name = fmt.Sprintf("passes, cap %d B, %s", bc.Cap(), how)
		var err error
		if g, err = stepgraph.BucketBlocks(authored, bc); err != nil {
			return "", nil, nil, err
		}
		if g, err = stepgraph.BucketOverlap(g, bc); err != nil {
			return "", nil, nil, err
		}
	}
	cfg := overlap.DefaultConfig()
	cfg.MinProcs = o.minProcs
	r, err := overlap.NewGraphRunner(g, map[string]overlap.Comm{"world": c}, cfg)
	if err != nil {
		return "", nil, nil, err
	}
	// The gradients: the program's own buffers, or (views) their slots in
	// the buckets, as DDP's gradient_as_bucket_view. The views persist
	// from step to step, so they are bound once (GraphRunner.Bind): the
	// runner then looks nothing up by name for them, as DDP's hooks hand
	// in the bucket's own gradient.
	// By name, looked up rather than parsed: the lookup runs twice per
	// collective per step, inside the timed step.
	byName := map[string]comm.Buffer{}
	for i, buf := range bufs {
		t, T := fmt.Sprintf("t%d", i), fmt.Sprintf("T%d", i)
		mine := buf
		if vb, ok := r.View(t); ok && v.views {
			mine = comm.AsFloat32(vb)
			for _, name := range []string{t, T} {
				if err := r.Bind(name, vb); err != nil {
					r.Close()
					return "", nil, nil, err
				}
			}
		}
		byName[t] = comm.Float32s(mine)
		byName[T] = comm.Float32s(mine) // reduced in place
	}
	tensors := func(name string) (comm.Buffer, error) {
		if b, ok := byName[name]; ok {
			return b, nil
		}
		return comm.Float32s(nil), nil // "updated"
	}
	kernel := func(context.Context, *stepgraph.Node) error { return nil }
	return name, r, func(i int) (overlap.StepMetrics, error) { return r.Step(ctx, i, tensors, kernel) }, nil
}

// rawAllReduces is the same traffic straight on the communicator, without
// the executor (one all-reduce per tensor, or one fused all-reduce): what
// the executor's packing and bookkeeping cost on top.
func rawAllReduces(ctx context.Context, c *comm.Comm, bufs [][]float32, perTensor bool) func(int) (overlap.StepMetrics, error) {
	var fused []float32
	if len(bufs) > 0 {
		fused = make([]float32, len(bufs)*len(bufs[0]))
	}
	return func(int) (overlap.StepMetrics, error) {
		t0 := time.Now()
		var h comm.Handle
		if perTensor {
			for t := range bufs {
				h = c.AllReduce(ctx, comm.Float32s(bufs[t]), comm.Float32s(bufs[t]), comm.Sum)
			}
		} else {
			h = c.AllReduce(ctx, comm.Float32s(fused), comm.Float32s(fused), comm.Sum)
		}
		err := h.Wait(ctx)
		return overlap.StepMetrics{Time: time.Since(t0)}, err
	}
}

// syntheticGraph writes the synthetic step: per block a forward parameter
// all-gather started prefetch blocks ahead and waited right before the
// block's forward, a backward whose gradient is reduce-scattered at once,
// and an optimizer update per block waiting for its own gradient.
func syntheticGraph(n, L, shardBytes, prefetch int) (*stepgraph.Graph, error) {
	b := stepgraph.NewBuilder().Group("world", n)
	reg := func(l int) string { return fmt.Sprintf("layers.%d", l) }
	for l := range L {
		b.Input(fmt.Sprintf("w%d", l), int64(shardBytes))
	}
	gather := func(l, at int) {
		b.Start(fmt.Sprintf("ag%d", l), buckets.Forward, reg(at), buckets.AllGather, "world", "f32",
			[]stepgraph.Member{{In: fmt.Sprintf("w%d", l), Out: fmt.Sprintf("W%d", l), Bytes: int64(shardBytes)}})
	}
	for l := range min(prefetch, L) {
		gather(l, 0)
	}
	// Nominal costs: only their ratio to communication guides the passes.
	const unit = time.Millisecond
	for l := range L {
		if l+prefetch < L {
			gather(l+prefetch, l)
		}
		b.Wait(fmt.Sprintf("ag%d.w", l), fmt.Sprintf("ag%d", l), reg(l))
		in := "x"
		if l > 0 {
			in = fmt.Sprintf("a%d", l-1)
		}
		if l == 0 {
			b.Input("x", 0)
		}
		b.Compute(fmt.Sprintf("f%d", l), buckets.Forward, reg(l), unit, []string{in, fmt.Sprintf("W%d", l)}, []string{fmt.Sprintf("a%d", l)})
	}
	for l := L - 1; l >= 0; l-- {
		in := fmt.Sprintf("a%d", L-1)
		if l < L-1 {
			in = fmt.Sprintf("d%d", l+1)
		}
		b.Compute(fmt.Sprintf("b%d", l), buckets.Backward, reg(l), 2*unit, []string{in, fmt.Sprintf("W%d", l)}, []string{fmt.Sprintf("d%d", l), fmt.Sprintf("g%d", l)})
		b.Start(fmt.Sprintf("rs%d", l), buckets.Backward, reg(l), buckets.ReduceScatter, "world", "f32",
			[]stepgraph.Member{{In: fmt.Sprintf("g%d", l), Out: fmt.Sprintf("G%d", l), Bytes: int64(shardBytes * n)}})
	}
	for l := L - 1; l >= 0; l-- {
		b.Wait(fmt.Sprintf("rs%d.w", l), fmt.Sprintf("rs%d", l), reg(l))
		b.Compute(fmt.Sprintf("o%d", l), buckets.Optimizer, reg(l), unit/4, []string{fmt.Sprintf("G%d", l)}, []string{fmt.Sprintf("u%d", l)})
	}
	return b.Graph()
}

// plan runs the bucketing passes the trainer runs: block bucketing, then
// overlap-preserving bucketing.
func plan(g *stepgraph.Graph) (*stepgraph.Graph, error) {
	cfg := buckets.DefaultConfig()
	g, err := stepgraph.BucketBlocks(g, cfg)
	if err != nil {
		return nil, err
	}
	return stepgraph.BucketOverlap(g, cfg)
}

// copyRate measures the executor's copies as a step makes them: k
// members of fused/k bytes each, every one in its own buffer, packed into
// one fused buffer and scattered back out, starting from memory the cache
// does not hold (a step's compute and collectives have been through it;
// here a scratch buffer twice the size of this host's 32 MiB L3 is
// written first). Bytes packed plus bytes scattered over the time, median
// of 9. A hot copy of the fused buffer repeated, the rate used before,
// said 38-48 GB/s on this host while a step's pack and scatter of 16 MB
// ran at 12.8 GB/s (notes/step-path.md), so merging with copies looked
// cheaper than it is.
func copyRate(fused, k int) float64 {
	part := fused / k
	srcs := make([][]byte, k)
	for i := range srcs {
		srcs[i] = make([]byte, part)
	}
	dst := make([]byte, part*k)
	scratch := make([]byte, 64<<20)
	var ts []time.Duration
	for r := range 9 {
		for i := 0; i < len(scratch); i += 64 {
			scratch[i] = byte(r)
		}
		t0 := time.Now()
		for i, b := range srcs {
			copy(dst[i*part:], b)
		}
		for i, b := range srcs {
			copy(b, dst[i*part:(i+1)*part])
		}
		ts = append(ts, time.Since(t0))
	}
	slices.Sort(ts)
	return float64(2*part*k) / ts[len(ts)/2].Seconds()
}

// measureModel measures the cost model bucketing needs on c: the bus
// bandwidth fitted (buckets.Fit) to all-reduces from 8 B to fused bytes;
// as α, the time one more call costs in a stream of back-to-back calls
// (k calls of fused/k bytes against one fused call, divided by k-1), which
// is what merging saves and is smaller than a lone call's latency, since
// back-to-back calls overlap their start-up (the fitted latency, or an
// 8-byte call's time, when that difference is not positive); and the rate
// of the executor's pack and scatter (copyRate). Each figure
// is a median of 9; rank 0's are broadcast, so every rank plans with the
// same model and the plans agree.
func measureModel(ctx context.Context, c *comm.Comm, fused, k int) (buckets.Model, error) {
	med := func(f func() error) (time.Duration, error) {
		var ts []time.Duration
		for range 9 {
			if err := c.Barrier(ctx).Wait(ctx); err != nil {
				return 0, err
			}
			t0 := time.Now()
			if err := f(); err != nil {
				return 0, err
			}
			ts = append(ts, time.Since(t0))
		}
		slices.Sort(ts)
		return ts[len(ts)/2], nil
	}
	var samples []buckets.Sample
	for sz := 8; sz <= fused; sz *= 8 {
		buf := comm.Float32s(make([]float32, max(sz/4, 1)))
		t, err := med(func() error { return c.AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx) })
		if err != nil {
			return buckets.Model{}, err
		}
		samples = append(samples, buckets.Sample{Op: buckets.AllReduce, Bytes: int64(buf.Len() * 4), Ranks: c.Size(), Time: t})
	}
	m, err := buckets.Fit(samples)
	if err != nil {
		return m, err
	}
	all := make([]float32, fused/4)
	one, err := med(func() error { return c.AllReduce(ctx, comm.Float32s(all), comm.Float32s(all), comm.Sum).Wait(ctx) })
	if err != nil {
		return m, err
	}
	part := len(all) / k
	many, err := med(func() error {
		var h comm.Handle
		for i := range k {
			b := comm.Float32s(all[i*part : (i+1)*part])
			h = c.AllReduce(ctx, b, b, comm.Sum)
		}
		return h.Wait(ctx)
	})
	if err != nil {
		return m, err
	}
	// Under load the difference can come out at or below zero (the fused
	// call was the one slowed); a zero α would forbid every merge, so the
	// fitted latency of a lone call stands in then.
	if many > one {
		m.Latency = (many - one) / time.Duration(k-1)
	}
	if m.Latency <= 0 {
		m.Latency = samples[0].Time // the fit's intercept can clamp to 0 too: an 8-byte call's time
	}
	m.CopyBandwidth = copyRate(fused, k)
	v := []float64{float64(m.Latency), m.BusBandwidth, m.CopyBandwidth}
	if err := c.Broadcast(ctx, comm.Float64s(v), comm.Float64s(v), 0).Wait(ctx); err != nil {
		return m, err
	}
	m = buckets.Model{Latency: time.Duration(v[0]), BusBandwidth: v[1], CopyBandwidth: v[2]}
	return m, m.Validate()
}
