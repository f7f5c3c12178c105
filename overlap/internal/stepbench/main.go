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
	"runtime"
	"runtime/pprof"
	rtrace "runtime/trace"
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

// synthetic runs the transformer-shaped step.
func synthetic(ctx context.Context, c *comm.Comm, o opts, say func(string, ...any), link string) error {
	startProcs := runtime.GOMAXPROCS(0)
	n, L := c.Size(), o.blocks
	es := 4
	shardEl := o.shard / es / n * n // keep the gradient divisible by n
	if shardEl < 1 {
		shardEl = 1
	}
	regions := make([]string, L)
	for l := range L {
		regions[l] = fmt.Sprintf("layers.%d", l)
	}
	// The step as a graph, planned by the passes the trainer runs and
	// executed by the graph runner: the path a program takes, not a
	// schedule written for the benchmark.
	g, err := syntheticGraph(n, L, shardEl*es, o.prefetch)
	if err != nil {
		return err
	}
	authored := len(g.Nodes)
	if g, err = plan(g); err != nil {
		return err
	}
	w := make([][]float32, L)
	W := make([][]float32, L)
	gr := make([][]float32, L)
	G := make([][]float32, L)
	bufs := map[string][]float32{}
	for l := range L {
		w[l], W[l] = make([]float32, shardEl), make([]float32, shardEl*n)
		gr[l], G[l] = make([]float32, shardEl*n), make([]float32, shardEl)
		bufs[fmt.Sprintf("w%d", l)], bufs[fmt.Sprintf("W%d", l)] = w[l], W[l]
		bufs[fmt.Sprintf("g%d", l)], bufs[fmt.Sprintf("G%d", l)] = gr[l], G[l]
	}
	tensors := func(name string) (comm.Buffer, error) {
		return comm.Float32s(bufs[strings.TrimSuffix(name, "@bwd")]), nil // activations: empty, the sleeps hold none
	}
	var fwd, bwd, opt time.Duration // per block
	// work runs one block's compute of d: a sleep, or (--compute cpu)
	// d's worth of arithmetic at the rate of a core to itself, the same
	// rate on every rank (rank 0's), so every rank has the same work.
	work := sleep
	if o.compute == computeCPU {
		r := []float64{spinRate()}
		if err := c.Broadcast(ctx, comm.Float64s(r), comm.Float64s(r), 0).Wait(ctx); err != nil {
			return err
		}
		work = func(d time.Duration) { spin(int(float64(d) * r[0])) }
	}
	withComm := true
	noCompute := false // communication alone: the runner's compute does nothing
	kernel := func(_ context.Context, nd *stepgraph.Node) error {
		if noCompute {
			return nil
		}
		switch nd.Dir {
		case buckets.Forward:
			work(fwd)
		case buckets.Backward:
			work(bwd)
		case buckets.Optimizer:
			work(opt)
		}
		return nil
	}
	runners := map[overlap.Mode]*overlap.GraphRunner{}
	for _, mode := range []overlap.Mode{overlap.Native, overlap.Grouped, overlap.Serial} {
		cfg := overlap.DefaultConfig()
		cfg.Mode = mode
		cfg.MinProcs = o.minProcs
		cfg.PrefetchStarts = 0 // the graph places each gather --prefetch blocks ahead
		cfg.Trace = mode == overlap.Native && o.trace != "" && c.Rank() == 0
		r, err := overlap.NewGraphRunner(g, map[string]overlap.Comm{"world": c}, cfg)
		if err != nil {
			return err
		}
		defer r.Close()
		runners[mode] = r
	}
	step := func(mode overlap.Mode, i int) (overlap.StepMetrics, error) {
		if !withComm {
			return overlap.StepMetrics{}, nil
		}
		return runners[mode].Step(ctx, i, tensors, kernel)
	}
	stepOf := func(mode overlap.Mode) func(int) (overlap.StepMetrics, error) {
		return func(i int) (overlap.StepMetrics, error) { return step(mode, i) }
	}
	// Communication alone: the serial runner, its compute doing nothing.
	commStep := func(i int) (overlap.StepMetrics, error) {
		noCompute = true
		defer func() { noCompute = false }()
		return runners[overlap.Serial].Step(ctx, i, tensors, kernel)
	}
	// Compute alone runs on every rank at once, as in the step, so that
	// ranks sharing cores slow each other down as they will there.
	computeStep := func(int) (overlap.StepMetrics, error) {
		t0 := time.Now()
		for range L {
			work(fwd)
		}
		for range L {
			work(bwd)
		}
		for range L {
			work(opt)
		}
		return overlap.StepMetrics{Time: time.Since(t0)}, nil
	}
	computeAlone := func() (sample, error) {
		s, err := measure(ctx, c, o.iters, computeStep)
		if err != nil {
			return sample{}, err
		}
		return s[0], nil
	}
	// Per block: forward 1 unit, backward 2, optimizer o.opt.
	units := 3 + o.opt
	sleeps := 2
	if o.opt > 0 {
		sleeps = 3
	}
	setUnit := func(u time.Duration) {
		fwd, bwd, opt = u, 2*u, time.Duration(float64(u)*o.opt)
	}
	// Size the compute to ratio × C, C measured under the conditions of
	// the loop below that the ratios come from. Those differ from a cold
	// start: once an executor's compute blocks (the sleeps), it widens
	// GOMAXPROCS on a one-CPU rank (overlap/procs.go), and with two Ps on
	// one core the communicator's worker and sender goroutines run on
	// threads that take turns on the core, so communication alone takes
	// longer there than at start-up with one P (np 2, 1 MiB shards:
	// shared memory 4.6 → 6.0 ms, TCP 7.3 → 9.8 ms, notes/step-path.md).
	// Sized from the cold figure, P came out 1.05-1.25 × the loop's C
	// instead of --ratio ×. So: a first guess of C as things stand, then
	// one short pass of the loop's own steps with compute sized from it
	// (which settles GOMAXPROCS as the loop has it), whose communication
	// alone sizes the compute.
	first, err := measure(ctx, c, max(o.iters/3, 3), commStep)
	if err != nil {
		return err
	}
	setUnit(time.Duration(float64(first[0].step) * o.ratio / (float64(L) * units)))
	settle, err := measure(ctx, c, max(o.iters/3, 3), commStep, computeStep, stepOf(overlap.Serial), stepOf(overlap.Native), stepOf(overlap.Grouped))
	if err != nil {
		return err
	}
	C := settle[0].step
	sizedC := C
	// A sleep overshoots by a roughly fixed wake-up latency, which on a
	// loaded machine is not small next to a sub-millisecond block:
	// measure it once and correct for it. Fixed arithmetic takes longer
	// than a core's rate says when ranks share cores: scale it by what
	// was measured.
	target := time.Duration(float64(C) * o.ratio)
	withComm = false
	setUnit(time.Duration(float64(target) / (float64(L) * units)))
	alone0, err := computeAlone()
	if err != nil {
		return err
	}
	P0 := alone0.step
	over := (P0 - time.Duration(float64(L)*units*float64(fwd))) / time.Duration(sleeps*L) // per sleep
	if o.compute == computeCPU {
		setUnit(max(time.Duration(float64(fwd)*float64(target)/float64(P0)), 10*time.Microsecond))
	} else {
		setUnit(max(time.Duration(float64(target-time.Duration(sleeps*L)*over)/(float64(L)*units)), 50*time.Microsecond))
	}
	alone, err := computeAlone()
	if err != nil {
		return err
	}
	if o.compute == computeCPU {
		// Sharing the cores makes the first scaling inexact (the ranks
		// did not run the first guess at the speed they run the second):
		// once more.
		setUnit(max(time.Duration(float64(fwd)*float64(target)/float64(alone.step)), 10*time.Microsecond))
		if alone, err = computeAlone(); err != nil {
			return err
		}
	}
	P := alone.step
	// Each collective alone, for the schedule bound: the graph's
	// dependencies (the first gather before any compute, forward
	// gathers that take longer than the forward they hide behind, the
	// last reduce-scatter after the last backward) cost time that
	// max(P, C) does not count.
	alone1 := func(f func() comm.Handle) (time.Duration, error) {
		s, err := measure(ctx, c, o.iters, func(int) (overlap.StepMetrics, error) {
			t0 := time.Now()
			err := f().Wait(ctx)
			return overlap.StepMetrics{Time: time.Since(t0)}, err
		})
		if err != nil {
			return 0, err
		}
		return s[0].step, nil
	}
	tAG, err := alone1(func() comm.Handle { return c.AllGather(ctx, comm.Float32s(w[0]), comm.Float32s(W[0])) })
	if err != nil {
		return err
	}
	tRS, err := alone1(func() comm.Handle { return c.ReduceScatter(ctx, comm.Float32s(gr[0]), comm.Float32s(G[0]), comm.Sum) })
	if err != nil {
		return err
	}
	withComm = true
	// Communication alone and compute alone again, interleaved with the
	// steps they are compared with, so that load from other processes on
	// a shared machine hits every figure of the ratios alike (the ones
	// above only sized the compute).
	all, err := measure(ctx, c, o.iters, commStep, computeStep, stepOf(overlap.Serial), stepOf(overlap.Native), stepOf(overlap.Grouped))
	if err != nil {
		return err
	}
	commOnly, alone := all[:1], all[1]
	C, P = commOnly[0].step, alone.step
	serial, ov, grouped := all[2], all[3], all[4]
	// Compute: the measured P, spread over the blocks as the work is.
	// Collectives: C, spread in the proportion of their times alone (back
	// to back they take longer than one at a time after a barrier, and
	// the step runs them back to back), so that the bound is never below
	// max(P, C) and its excess is what the dependencies cost.
	nominal := float64(L) * float64(fwd+bwd+opt)
	share := float64(C) / float64(time.Duration(L)*(tAG+tRS))
	sched := scheduleBound(g, func(nd *stepgraph.Node) time.Duration {
		d := map[buckets.Direction]time.Duration{buckets.Forward: fwd, buckets.Backward: bwd, buckets.Optimizer: opt}[nd.Dir]
		return time.Duration(float64(d) * float64(P) / nominal)
	}, func(nd *stepgraph.Node) time.Duration {
		if nd.Op == buckets.AllGather {
			return time.Duration(float64(tAG) * share)
		}
		return time.Duration(float64(tRS) * share)
	})
	if tl := runners[overlap.Native].Executor().Timeline(); tl != nil {
		f, err := os.Create(o.trace)
		if err != nil {
			return err
		}
		if _, err := tl.WriteTo(f); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if o.exectrace != "" {
		var f *os.File
		if c.Rank() == 0 {
			if f, err = os.Create(o.exectrace); err != nil {
				return err
			}
			if err := rtrace.Start(f); err != nil {
				return err
			}
		}
		_, err := measure(ctx, c, 3, stepOf(overlap.Native))
		if f != nil {
			rtrace.Stop()
			_ = f.Close()
		}
		if err != nil {
			return err
		}
	}
	ideal := max(P, C)
	say("synthetic step (step graph → blocks + overlap passes → graph runner): %d ranks (%s), %d blocks, %d KiB parameter shard per block per rank, all-gather (%d ahead) + reduce-scatter per block; %d nodes as written, %d after the passes, %d collectives/step\n",
		n, link, L, shardEl*es>>10, o.prefetch, authored, len(g.Nodes), ov.collectives)
	say("  GOMAXPROCS %d on rank 0 after the steps (%d CPUs it may run on, --min-procs %d; a compute that blocks widens it past the CPUs)\n", runtime.GOMAXPROCS(0), runtime.NumCPU(), o.minProcs)
	say("  communication alone   C = %s  (C and P below measured interleaved with the serial and overlapped steps; the compute was sized from C = %s, measured the same way in a shorter pass; GOMAXPROCS %d at start)\n", ms(C), ms(sizedC), startProcs)
	if o.compute == computeCPU {
		say("  compute alone         P = %s  (%.2f × C, all ranks at once; arithmetic of %v forward, %v backward, %v optimizer per block at a core's rate)\n", ms(P), float64(P)/float64(C), fwd, bwd, opt)
	} else {
		say("  compute alone         P = %s  (%.2f × C; sleeps of %v forward, %v backward, %v optimizer per block, each overshooting by ≈ %v)\n", ms(P), float64(P)/float64(C), fwd, bwd, opt, over)
	}
	say("  serial step             = %s  (C + P = %s)\n", ms(serial.step), ms(C+P))
	exp := ov.step - P
	say("  overlapped step (native) = %s  ideal max(P, C) = %s → %.3f × ideal, %.3f × serial\n", ms(ov.step), ms(ideal), float64(ov.step)/float64(ideal), float64(ov.step)/float64(serial.step))
	say("  overlapped step (grouped)= %s  → %.3f × ideal\n", ms(grouped.step), float64(grouped.step)/float64(ideal))
	say("  exposed communication (time blocked in waits, rank 0) = %s = %.1f%% of C  (goal ≤ 10%% when P ≥ C)\n",
		ms(ov.exposed), 100*float64(ov.exposed)/float64(C))
	say("  schedule bound: the graph on a clock, compute taking P and the collectives C (in the proportion of their times alone, all-gather %s, reduce-scatter %s; back to back they took %.2f× that), one at a time in issue order, never slowing each other = %s (%.3f × max(P, C)) → native %.3f × that, grouped %.3f ×\n",
		ms(tAG), ms(tRS), share, ms(sched), float64(sched)/float64(ideal), float64(ov.step)/float64(sched), float64(grouped.step)/float64(sched))
	say("  overlapped step − P = %s = %.1f%% of C; rank 0's step: compute spans %s (vs %s alone), blocked %s, rest %s\n",
		ms(exp), 100*float64(exp)/float64(C), ms(ov.compute), ms(P), ms(ov.exposed), ms(ov.step-ov.compute-ov.exposed))
	// The bound the cores allow. max(P, C) assumes compute and
	// communication each run as fast as alone, side by side; they share
	// the job's cores, so the step also takes at least the CPU time both
	// need, spread over every core the job has.
	if alone.cpu > 0 && commOnly[0].cpu > 0 {
		cores, err := jobCores(ctx, c)
		if err != nil {
			return err
		}
		W := alone.cpu + commOnly[0].cpu
		// A rank bound to fewer cores than the job has runs its own
		// compute and communication on those: its CPU over its cores
		// bounds its step too.
		own, err := slowest(ctx, c, (alone.mine+commOnly[0].mine)/time.Duration(count(cpuMask())))
		if err != nil {
			return err
		}
		bound := max(ideal, sched, W/time.Duration(cores), own)
		say("  the cores' bound: %d cores for the job; CPU per step (all ranks, all threads) %s computing alone + %s communicating alone = %s, / %d cores = %s; the busiest rank's own CPU over its own cores %s → bound max(P, C, schedule bound, those) = %s\n",
			cores, ms(alone.cpu), ms(commOnly[0].cpu), ms(W), cores, ms(W/time.Duration(cores)), ms(own), ms(bound))
		say("  overlapped step (native) = %.3f × the bound, grouped %.3f × (the overlapped step used %s of CPU, %.2f × computing + communicating alone)\n",
			float64(ov.step)/float64(bound), float64(grouped.step)/float64(bound), ms(ov.cpu), float64(ov.cpu)/float64(W))
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
	b := stepgraph.NewBuilder().Group("world", c.Size()).Region("model")
	var outs []string
	var names0 []string
	for i := range o.tensors {
		names0 = append(names0, fmt.Sprintf("t%d", i))
	}
	b.Compute("backward", buckets.Backward, "model", time.Millisecond, nil, names0)
	for i := range o.tensors {
		b.Start(fmt.Sprintf("ar%d", i), buckets.Backward, "model", buckets.AllReduce, "world", "f32",
			[]stepgraph.Member{{In: fmt.Sprintf("t%d", i), Out: fmt.Sprintf("T%d", i), Bytes: int64(o.tensorB / 4 * 4)}})
		outs = append(outs, fmt.Sprintf("T%d", i))
	}
	for i := range o.tensors {
		b.Wait(fmt.Sprintf("ar%d.w", i), fmt.Sprintf("ar%d", i), "model")
	}
	b.Compute("optimizer", buckets.Optimizer, "model", 0, outs, []string{"updated"})
	authored, err := b.Graph()
	if err != nil {
		return err
	}
	bufs := make([][]float32, o.tensors)
	for i := range bufs {
		bufs[i] = make([]float32, o.tensorB/4)
	}
	kernel := func(context.Context, *stepgraph.Node) error { return nil }
	// The cost model from this fabric: α and β fitted to all-reduces
	// measured here, and the rate of the executor's copies, so that the
	// cap and whether a bucket pays at all follow what was measured.
	model, err := measureModel(ctx, c, o.tensors*(o.tensorB/4*4), o.tensors)
	if err != nil {
		return err
	}
	var names []string
	nb := map[string]int{}
	var steps []func(int) (overlap.StepMetrics, error)
	type variant struct {
		capB  int64 // -1: as written
		views bool
	}
	variants := []variant{{capB: -1}} // as written: one collective per tensor
	for _, capB := range o.caps {
		variants = append(variants, variant{capB, false}, variant{capB, true})
	}
	for _, v := range variants {
		g := authored
		name := "one collective per tensor (as written)"
		bc := buckets.DefaultConfig()
		bc.Model = model
		if v.views {
			// Members live in the bucket: merging copies nothing.
			bc.Model.CopyBandwidth = 0
		}
		if v.capB >= 0 {
			bc.CapBytes = v.capB
			how := "copies"
			if v.views {
				how = "views"
			}
			name = fmt.Sprintf("passes, cap %d B, %s", bc.Cap(), how)
			if g, err = stepgraph.BucketBlocks(authored, bc); err != nil {
				return err
			}
			if g, err = stepgraph.BucketOverlap(g, bc); err != nil {
				return err
			}
		}
		names = append(names, name)
		cfg := overlap.DefaultConfig()
		cfg.MinProcs = o.minProcs
		r, err := overlap.NewGraphRunner(g, map[string]overlap.Comm{"world": c}, cfg)
		if err != nil {
			return err
		}
		defer r.Close()
		nb[name] = len(r.Executor().Plan().Groups[0].Buckets)
		// The gradients: the program's own buffers, or (views) their
		// slots in the buckets, as DDP's gradient_as_bucket_view.
		// The views persist from step to step, so they are bound once
		// (GraphRunner.Bind): the runner then looks nothing up by name
		// for them, as DDP's hooks hand in the bucket's own gradient.
		mine := make([][]float32, len(bufs))
		for i := range mine {
			mine[i] = bufs[i]
			if vb, ok := r.View(fmt.Sprintf("t%d", i)); ok && v.views {
				mine[i] = comm.AsFloat32(vb)
				for _, name := range []string{fmt.Sprintf("t%d", i), fmt.Sprintf("T%d", i)} {
					if err := r.Bind(name, vb); err != nil {
						return err
					}
				}
			}
		}
		// By name, looked up rather than parsed: the lookup runs twice per
		// collective per step, inside the timed step.
		byName := map[string]comm.Buffer{}
		for i := range mine {
			byName[fmt.Sprintf("t%d", i)] = comm.Float32s(mine[i])
			byName[fmt.Sprintf("T%d", i)] = comm.Float32s(mine[i]) // reduced in place
		}
		tensors := func(name string) (comm.Buffer, error) {
			if b, ok := byName[name]; ok {
				return b, nil
			}
			return comm.Float32s(nil), nil // "updated"
		}
		steps = append(steps, func(i int) (overlap.StepMetrics, error) { return r.Step(ctx, i, tensors, kernel) })
	}
	// The same traffic straight on the communicator, without the executor:
	// what the executor's packing and bookkeeping cost on top.
	fused := make([]float32, o.tensors*(o.tensorB/4))
	raw := func(perTensor bool) func(int) (overlap.StepMetrics, error) {
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
	steps = append(steps, raw(true), raw(false))
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
