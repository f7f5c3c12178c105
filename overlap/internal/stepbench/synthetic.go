package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	rtrace "runtime/trace"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// synth is one run of the transformer-shaped step: the planned graph, its
// buffers, a runner per mode, and the per-block compute that the ratios
// size.
type synth struct {
	ctx      context.Context
	c        *comm.Comm
	o        opts
	n, L     int
	shardEl  int
	g        *stepgraph.Graph
	authored int // nodes as written, before the passes
	// Parameter shards and gathered parameters, gradients and their
	// reduced shards, per block.
	w, W, gr, G [][]float32
	bufs        map[string][]float32
	runners     map[overlap.Mode]*overlap.GraphRunner

	fwd, bwd, opt time.Duration // compute per block
	// work runs one block's compute of d: a sleep, or (--compute cpu) d's
	// worth of arithmetic at the rate of a core to itself, the same rate
	// on every rank (rank 0's), so every rank has the same work.
	work      func(time.Duration)
	withComm  bool // false: the runners' steps do nothing (compute sizing)
	noCompute bool // communication alone: the runner's compute does nothing
	units     float64
	sleeps    int
}

// synthFigures are what the report prints.
type synthFigures struct {
	startProcs int
	C, sizedC  time.Duration // communication alone, in the loop and as sized
	P          time.Duration // compute alone
	over       time.Duration // a sleep's overshoot
	tAG, tRS   time.Duration // one all-gather and one reduce-scatter alone
	commOnly   sample
	alone      sample
	serial     sample
	ov         sample // overlapped, native
	grouped    sample
}

// synthetic runs the transformer-shaped step.
func synthetic(ctx context.Context, c *comm.Comm, o opts, say func(string, ...any), link string) error {
	f := synthFigures{startProcs: runtime.GOMAXPROCS(0)}
	s, err := newSynth(ctx, c, o)
	if err != nil {
		return err
	}
	defer s.close()
	if f.sizedC, f.over, err = s.sizeCompute(); err != nil {
		return err
	}
	if f.tAG, f.tRS, err = s.collectivesAlone(); err != nil {
		return err
	}
	s.withComm = true
	// Communication alone and compute alone again, interleaved with the
	// steps they are compared with, so that load from other processes on
	// a shared machine hits every figure of the ratios alike (the ones
	// above only sized the compute).
	all, err := measure(ctx, c, o.iters, s.commStep, s.computeStep, s.stepOf(overlap.Serial), s.stepOf(overlap.Native), s.stepOf(overlap.Grouped))
	if err != nil {
		return err
	}
	f.commOnly, f.alone, f.serial, f.ov, f.grouped = all[0], all[1], all[2], all[3], all[4]
	f.C, f.P = f.commOnly.step, f.alone.step
	if err := s.writeTraces(); err != nil {
		return err
	}
	return s.report(f, say, link)
}

// newSynth builds the step graph, plans it with the passes the trainer
// runs, and makes its buffers and a graph runner per mode: the path a
// program takes, not a schedule written for the benchmark.
func newSynth(ctx context.Context, c *comm.Comm, o opts) (*synth, error) {
	s := &synth{ctx: ctx, c: c, o: o, n: c.Size(), L: o.blocks, work: sleep, withComm: true,
		runners: map[overlap.Mode]*overlap.GraphRunner{}, bufs: map[string][]float32{}}
	es := 4
	s.shardEl = max(o.shard/es/s.n*s.n, 1) // keep the gradient divisible by n
	g, err := syntheticGraph(s.n, s.L, s.shardEl*es, o.prefetch)
	if err != nil {
		return nil, err
	}
	s.authored = len(g.Nodes)
	if s.g, err = plan(g); err != nil {
		return nil, err
	}
	n, L, el := s.n, s.L, s.shardEl
	s.w, s.W, s.gr, s.G = make([][]float32, L), make([][]float32, L), make([][]float32, L), make([][]float32, L)
	for l := range L {
		s.w[l], s.W[l] = make([]float32, el), make([]float32, el*n)
		s.gr[l], s.G[l] = make([]float32, el*n), make([]float32, el)
		s.bufs[fmt.Sprintf("w%d", l)], s.bufs[fmt.Sprintf("W%d", l)] = s.w[l], s.W[l]
		s.bufs[fmt.Sprintf("g%d", l)], s.bufs[fmt.Sprintf("G%d", l)] = s.gr[l], s.G[l]
	}
	if o.compute == computeCPU {
		r := []float64{spinRate()}
		if err := c.Broadcast(ctx, comm.Float64s(r), comm.Float64s(r), 0).Wait(ctx); err != nil {
			return nil, err
		}
		s.work = func(d time.Duration) { spin(int(float64(d) * r[0])) }
	}
	// Per block: forward 1 unit, backward 2, optimizer o.opt.
	s.units, s.sleeps = 3+o.opt, 2
	if o.opt > 0 {
		s.sleeps = 3
	}
	for _, mode := range []overlap.Mode{overlap.Native, overlap.Grouped, overlap.Serial} {
		cfg := overlap.DefaultConfig()
		cfg.Mode = mode
		cfg.MinProcs = o.minProcs
		cfg.PrefetchStarts = 0 // the graph places each gather --prefetch blocks ahead
		cfg.Trace = mode == overlap.Native && o.trace != "" && c.Rank() == 0
		r, err := overlap.NewGraphRunner(s.g, map[string]overlap.Comm{"world": c}, cfg)
		if err != nil {
			s.close()
			return nil, err
		}
		s.runners[mode] = r
	}
	return s, nil
}

func (s *synth) close() {
	for _, r := range s.runners {
		r.Close()
	}
}

func (s *synth) tensors(name string) (comm.Buffer, error) {
	return comm.Float32s(s.bufs[strings.TrimSuffix(name, "@bwd")]), nil // activations: empty, the sleeps hold none
}

func (s *synth) kernel(_ context.Context, nd *stepgraph.Node) error {
	if s.noCompute {
		return nil
	}
	switch nd.Dir {
	case buckets.Forward:
		s.work(s.fwd)
	case buckets.Backward:
		s.work(s.bwd)
	case buckets.Optimizer:
		s.work(s.opt)
	}
	return nil
}

// stepOf is one step of the runner of mode.
func (s *synth) stepOf(mode overlap.Mode) func(int) (overlap.StepMetrics, error) {
	return func(i int) (overlap.StepMetrics, error) {
		if !s.withComm {
			return overlap.StepMetrics{}, nil
		}
		return s.runners[mode].Step(s.ctx, i, s.tensors, s.kernel)
	}
}

// commStep is communication alone: the serial runner, its compute doing
// nothing.
func (s *synth) commStep(i int) (overlap.StepMetrics, error) {
	s.noCompute = true
	defer func() { s.noCompute = false }()
	return s.runners[overlap.Serial].Step(s.ctx, i, s.tensors, s.kernel)
}

// computeStep is compute alone, run on every rank at once, as in the
// step, so that ranks sharing cores slow each other down as they will
// there.
func (s *synth) computeStep(int) (overlap.StepMetrics, error) {
	t0 := time.Now()
	for _, d := range []time.Duration{s.fwd, s.bwd, s.opt} {
		for range s.L {
			s.work(d)
		}
	}
	return overlap.StepMetrics{Time: time.Since(t0)}, nil
}

func (s *synth) computeAlone() (sample, error) {
	m, err := measure(s.ctx, s.c, s.o.iters, s.computeStep)
	if err != nil {
		return sample{}, err
	}
	return m[0], nil
}

func (s *synth) setUnit(u time.Duration) {
	s.fwd, s.bwd, s.opt = u, 2*u, time.Duration(float64(u)*s.o.opt)
}

// sizeCompute sizes the compute to ratio × C, C measured under the
// conditions of the loop the ratios come from, and returns that C and a
// sleep's overshoot. Those conditions differ from a cold start: once an
// executor's compute blocks (the sleeps), it widens GOMAXPROCS on a
// one-CPU rank (overlap/procs.go), and with two Ps on one core the
// communicator's worker and sender goroutines run on threads that take
// turns on the core, so communication alone takes longer there than at
// start-up with one P (np 2, 1 MiB shards: shared memory 4.6 → 6.0 ms,
// TCP 7.3 → 9.8 ms, notes/step-path.md). Sized from the cold figure, P
// came out 1.05-1.25 × the loop's C instead of --ratio ×. So: a first
// guess of C as things stand, then one short pass of the loop's own steps
// with compute sized from it (which settles GOMAXPROCS as the loop has
// it), whose communication alone sizes the compute.
func (s *synth) sizeCompute() (sizedC, over time.Duration, err error) {
	o, L := s.o, float64(s.L)
	first, err := measure(s.ctx, s.c, max(o.iters/3, 3), s.commStep)
	if err != nil {
		return 0, 0, err
	}
	s.setUnit(time.Duration(float64(first[0].step) * o.ratio / (L * s.units)))
	settle, err := measure(s.ctx, s.c, max(o.iters/3, 3), s.commStep, s.computeStep, s.stepOf(overlap.Serial), s.stepOf(overlap.Native), s.stepOf(overlap.Grouped))
	if err != nil {
		return 0, 0, err
	}
	sizedC = settle[0].step
	// A sleep overshoots by a roughly fixed wake-up latency, which on a
	// loaded machine is not small next to a sub-millisecond block:
	// measure it once and correct for it. Fixed arithmetic takes longer
	// than a core's rate says when ranks share cores: scale it by what
	// was measured.
	target := time.Duration(float64(sizedC) * o.ratio)
	s.withComm = false
	s.setUnit(time.Duration(float64(target) / (L * s.units)))
	alone0, err := s.computeAlone()
	if err != nil {
		return 0, 0, err
	}
	P0 := alone0.step
	over = (P0 - time.Duration(L*s.units*float64(s.fwd))) / time.Duration(s.sleeps*s.L) // per sleep
	if o.compute == computeCPU {
		s.setUnit(max(time.Duration(float64(s.fwd)*float64(target)/float64(P0)), 10*time.Microsecond))
	} else {
		s.setUnit(max(time.Duration(float64(target-time.Duration(s.sleeps*s.L)*over)/(L*s.units)), 50*time.Microsecond))
	}
	alone, err := s.computeAlone()
	if err != nil || o.compute != computeCPU {
		return sizedC, over, err
	}
	// Sharing the cores makes the first scaling inexact (the ranks did
	// not run the first guess at the speed they run the second): once
	// more.
	s.setUnit(max(time.Duration(float64(s.fwd)*float64(target)/float64(alone.step)), 10*time.Microsecond))
	_, err = s.computeAlone()
	return sizedC, over, err
}

// collectivesAlone times one all-gather and one reduce-scatter alone, for
// the schedule bound: the graph's dependencies (the first gather before
// any compute, forward gathers that take longer than the forward they
// hide behind, the last reduce-scatter after the last backward) cost time
// that max(P, C) does not count.
func (s *synth) collectivesAlone() (tAG, tRS time.Duration, err error) {
	alone1 := func(f func() comm.Handle) (time.Duration, error) {
		m, err := measure(s.ctx, s.c, s.o.iters, func(int) (overlap.StepMetrics, error) {
			t0 := time.Now()
			err := f().Wait(s.ctx)
			return overlap.StepMetrics{Time: time.Since(t0)}, err
		})
		if err != nil {
			return 0, err
		}
		return m[0].step, nil
	}
	c, ctx := s.c, s.ctx
	if tAG, err = alone1(func() comm.Handle { return c.AllGather(ctx, comm.Float32s(s.w[0]), comm.Float32s(s.W[0])) }); err != nil {
		return 0, 0, err
	}
	tRS, err = alone1(func() comm.Handle {
		return c.ReduceScatter(ctx, comm.Float32s(s.gr[0]), comm.Float32s(s.G[0]), comm.Sum)
	})
	return tAG, tRS, err
}

// writeTraces writes the native runner's timeline (--trace) and a Go
// execution trace of three native steps (--exectrace), on rank 0.
func (s *synth) writeTraces() error {
	if tl := s.runners[overlap.Native].Executor().Timeline(); tl != nil {
		f, err := os.Create(s.o.trace)
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
	if s.o.exectrace == "" {
		return nil
	}
	var f *os.File
	if s.c.Rank() == 0 {
		var err error
		if f, err = os.Create(s.o.exectrace); err != nil {
			return err
		}
		if err := rtrace.Start(f); err != nil {
			_ = f.Close()
			return err
		}
	}
	_, err := measure(s.ctx, s.c, 3, s.stepOf(overlap.Native))
	if f != nil {
		rtrace.Stop()
		_ = f.Close()
	}
	return err
}

// scheduled is the schedule bound for the measured figures. Compute: the
// measured P, spread over the blocks as the work is. Collectives: C,
// spread in the proportion of their times alone (back to back they take
// longer than one at a time after a barrier, and the step runs them back
// to back), so that the bound is never below max(P, C) and its excess is
// what the dependencies cost. It also returns that proportion.
func (s *synth) scheduled(f synthFigures) (time.Duration, float64) {
	nominal := float64(s.L) * float64(s.fwd+s.bwd+s.opt)
	share := float64(f.C) / float64(time.Duration(s.L)*(f.tAG+f.tRS))
	per := map[buckets.Direction]time.Duration{buckets.Forward: s.fwd, buckets.Backward: s.bwd, buckets.Optimizer: s.opt}
	sched := scheduleBound(s.g, func(nd *stepgraph.Node) time.Duration {
		return time.Duration(float64(per[nd.Dir]) * float64(f.P) / nominal)
	}, func(nd *stepgraph.Node) time.Duration {
		if nd.Op == buckets.AllGather {
			return time.Duration(float64(f.tAG) * share)
		}
		return time.Duration(float64(f.tRS) * share)
	})
	return sched, share
}

// report prints the step's figures and its ratios to the bounds.
func (s *synth) report(f synthFigures, say func(string, ...any), link string) error {
	o, C, P, ov := s.o, f.C, f.P, f.ov
	sched, share := s.scheduled(f)
	ideal := max(P, C)
	say("synthetic step (step graph → blocks + overlap passes → graph runner): %d ranks (%s), %d blocks, %d KiB parameter shard per block per rank, all-gather (%d ahead) + reduce-scatter per block; %d nodes as written, %d after the passes, %d collectives/step\n",
		s.n, link, s.L, s.shardEl*4>>10, o.prefetch, s.authored, len(s.g.Nodes), ov.collectives)
	say("  GOMAXPROCS %d on rank 0 after the steps (%d CPUs it may run on, --min-procs %d; a compute that blocks widens it past the CPUs)\n", runtime.GOMAXPROCS(0), runtime.NumCPU(), o.minProcs)
	say("  communication alone   C = %s  (C and P below measured interleaved with the serial and overlapped steps; the compute was sized from C = %s, measured the same way in a shorter pass; GOMAXPROCS %d at start)\n", ms(C), ms(f.sizedC), f.startProcs)
	if o.compute == computeCPU {
		say("  compute alone         P = %s  (%.2f × C, all ranks at once; arithmetic of %v forward, %v backward, %v optimizer per block at a core's rate)\n", ms(P), float64(P)/float64(C), s.fwd, s.bwd, s.opt)
	} else {
		say("  compute alone         P = %s  (%.2f × C; sleeps of %v forward, %v backward, %v optimizer per block, each overshooting by ≈ %v)\n", ms(P), float64(P)/float64(C), s.fwd, s.bwd, s.opt, f.over)
	}
	say("  serial step             = %s  (C + P = %s)\n", ms(f.serial.step), ms(C+P))
	exp := ov.step - P
	say("  overlapped step (native) = %s  ideal max(P, C) = %s → %.3f × ideal, %.3f × serial\n", ms(ov.step), ms(ideal), float64(ov.step)/float64(ideal), float64(ov.step)/float64(f.serial.step))
	say("  overlapped step (grouped)= %s  → %.3f × ideal\n", ms(f.grouped.step), float64(f.grouped.step)/float64(ideal))
	say("  exposed communication (time blocked in waits, rank 0) = %s = %.1f%% of C  (goal ≤ 10%% when P ≥ C)\n",
		ms(ov.exposed), 100*float64(ov.exposed)/float64(C))
	say("  schedule bound: the graph on a clock, compute taking P and the collectives C (in the proportion of their times alone, all-gather %s, reduce-scatter %s; back to back they took %.2f× that), one at a time in issue order, never slowing each other = %s (%.3f × max(P, C)) → native %.3f × that, grouped %.3f ×\n",
		ms(f.tAG), ms(f.tRS), share, ms(sched), float64(sched)/float64(ideal), float64(ov.step)/float64(sched), float64(f.grouped.step)/float64(sched))
	say("  overlapped step − P = %s = %.1f%% of C; rank 0's step: compute spans %s (vs %s alone), blocked %s, rest %s\n",
		ms(exp), 100*float64(exp)/float64(C), ms(ov.compute), ms(P), ms(ov.exposed), ms(ov.step-ov.compute-ov.exposed))
	if f.alone.cpu > 0 && f.commOnly.cpu > 0 {
		return s.reportCores(f, max(ideal, sched), say)
	}
	return nil
}

// reportCores prints the bound the cores allow. max(P, C) assumes compute
// and communication each run as fast as alone, side by side; they share
// the job's cores, so the step also takes at least the CPU time both
// need, spread over every core the job has.
func (s *synth) reportCores(f synthFigures, bound0 time.Duration, say func(string, ...any)) error {
	cores, err := jobCores(s.ctx, s.c)
	if err != nil {
		return err
	}
	W := f.alone.cpu + f.commOnly.cpu
	// A rank bound to fewer cores than the job has runs its own compute
	// and communication on those: its CPU over its cores bounds its step
	// too.
	own, err := slowest(s.ctx, s.c, (f.alone.mine+f.commOnly.mine)/time.Duration(count(cpuMask())))
	if err != nil {
		return err
	}
	bound := max(bound0, W/time.Duration(cores), own)
	say("  the cores' bound: %d cores for the job; CPU per step (all ranks, all threads) %s computing alone + %s communicating alone = %s, / %d cores = %s; the busiest rank's own CPU over its own cores %s → bound max(P, C, schedule bound, those) = %s\n",
		cores, ms(f.alone.cpu), ms(f.commOnly.cpu), ms(W), cores, ms(W/time.Duration(cores)), ms(own), ms(bound))
	say("  overlapped step (native) = %.3f × the bound, grouped %.3f × (the overlapped step used %s of CPU, %.2f × computing + communicating alone)\n",
		float64(f.ov.step)/float64(bound), float64(f.grouped.step)/float64(bound), ms(f.ov.cpu), float64(f.ov.cpu)/float64(W))
	return nil
}
