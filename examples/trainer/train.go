package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/stepgraph"
	"github.com/rs/zerolog"
)

// options are the trainer's flags, separated from flag parsing so tests can
// run the same training in-process over an in-memory network.
type options struct {
	steps int
	mode  string // "dp", "sharded" or "hsdp"
	// shardSize is hsdp's shard degree S: parameters are sharded over
	// groups of S consecutive ranks and replicated over the N/S groups.
	// 0: 2 (1 when running alone).
	shardSize int
	// subgroup connects a communicator over the given world ranks (in
	// that order) for process group name; hsdp needs it for its shard
	// and replica groups. main makes it from rank.Group and NewComm,
	// tests over their in-memory network.
	subgroup      func(ctx context.Context, name string, ranks []int) (overlap.Comm, error)
	deterministic bool
	bucketCap     int64
	noBucketing   bool
	noOverlap     bool
	reshard       bool
	chunk         bool
	// chunkAccumulate sums the two chunks' gradients before one collective
	// (early accumulation); off, each chunk's gradient has its own.
	chunkAccumulate bool
	// chunkForce splits every region even where the cost model says that
	// exposes more communication (per-chunk reduction always does: its
	// numerics need every region split).
	chunkForce bool
	dumpGraph  string
	// prefetch is overlap.Config.PrefetchStarts: how many starts ahead of
	// its plan position a collective may be issued (negative: unbounded).
	prefetch int
	grouped  bool
	trace    string
	batch    int
	size     string // "default" or "small"
	workers  int
	// checkpoint is --checkpoint DIR (empty: no checkpoints, no resume);
	// checkpointEvery is --checkpoint-every N (0: only on the signal).
	checkpoint      string
	checkpointEvery int
	// checkpointAsked delivers the checkpoint signal (nil: none is
	// caught); polled once per step, so no goroutine owns it.
	checkpointAsked <-chan os.Signal
	// reportStep, when set, is told every finished step (rank.ReportStep:
	// what gorun's --inject ...:after-steps=N fires on).
	reportStep func(step int)
	// faultTolerant is --fault-tolerant (ft.go); stepSleep pads every
	// step of it (--step-sleep: tests and benchmarks give replacements
	// time to arrive).
	faultTolerant bool
	stepSleep     time.Duration
	crash         string
}

func defaultOptions() options {
	return options{steps: 50, mode: "dp", batch: 16, size: "default", chunkAccumulate: true, prefetch: 0}
}

func (o options) validate(n int) error {
	chunks := 1
	if o.chunk {
		chunks = 2
	}
	switch {
	case o.steps < 1:
		return fmt.Errorf("trainer: --steps %d, need at least 1", o.steps)
	case o.mode != "dp" && o.mode != "sharded" && o.mode != "hsdp":
		return fmt.Errorf("trainer: --mode %q, want dp, sharded or hsdp", o.mode)
	case o.mode == "hsdp" && (o.shardSize < 0 || o.shardSize > 0 && n%o.shardSize != 0):
		return fmt.Errorf("trainer: --shard-size %d with %d ranks: hsdp needs a shard size that divides the rank count", o.shardSize, n)
	case o.mode == "hsdp" && o.chunk && !o.chunkAccumulate:
		// Per-chunk reduction is bitwise the reference only when the
		// chunk is the top of the summation tree; hsdp's replica
		// all-reduce runs once on the chunks' sum, one level too high.
		return fmt.Errorf("trainer: --mode hsdp with per-chunk reduction (--chunk-accumulate=false) is not supported: the replica all-reduce runs on the sum of the chunks")
	case o.mode == "hsdp" && o.subgroup == nil:
		return fmt.Errorf("trainer: hsdp needs subgroup communicators, and none can be made here")
	case o.size != "default" && o.size != "small":
		return fmt.Errorf("trainer: --model %q, want default or small", o.size)
	case o.checkpointEvery < 0:
		return fmt.Errorf("trainer: --checkpoint-every %d is negative", o.checkpointEvery)
	case o.checkpointEvery > 0 && o.checkpoint == "":
		return fmt.Errorf("trainer: --checkpoint-every %d needs --checkpoint DIR", o.checkpointEvery)
	case o.bucketCap < 0:
		return fmt.Errorf("trainer: --bucket-cap %d is negative", o.bucketCap)
	case o.batch < 1 || o.batch&(o.batch-1) != 0 || n&(n-1) != 0 || o.batch%(n*chunks) != 0:
		return fmt.Errorf("trainer: global batch %d over %d ranks and %d chunks: batch and ranks must be powers of two and ranks×chunks must divide the batch (the bitwise rank-count independence needs it)", o.batch, n, chunks)
	}
	return nil
}

func (o options) modelConfig() model.Config {
	cfg := model.DefaultConfig()
	if o.size == "small" {
		cfg.Vocab, cfg.SeqLen, cfg.Dim, cfg.Heads, cfg.Layers, cfg.Hidden = 16, 8, 16, 2, 2, 32
	}
	return cfg
}

// result is what a run produced, for tests and the summary line.
type result struct {
	losses []float32
	total  overlap.StepMetrics
	// peakEstimate is the plan's estimate of total.PeakBytes.
	peakEstimate int64
	params       uint64 // model.Fingerprint of the final parameters (full, unsharded)
}

// trainer is one rank's state.
type trainer struct {
	o    options
	cm   overlap.Comm
	log  zerolog.Logger
	m    *model.Model
	lay  *model.Layout
	ws   *model.Workspace
	opt  *model.Optimizer
	data model.Dataset
	N, k int
	// S is the shard degree and sk this rank's shard index: N and k
	// sharded, the shard group's size and this rank's place in it (hsdp),
	// 1 and 0 in dp. shardGroup names the process group of the parameter
	// gathers and gradient reduce-scatters; hsdp adds "replica", over
	// which the reduce-scattered gradient shards are all-reduced.
	S, sk      int
	shardGroup string
	hsdp       bool
	comms      map[string]overlap.Comm
	R          int
	chunks     int // 2 with --chunk: buffers exist for both chunks
	n          int // local samples
	sharded    bool
	// chunkMajor: chunk c of every rank is the c-th half of the global
	// batch (per-chunk reduction); otherwise each rank holds one
	// contiguous slice (see model.SampleRange).
	chunkMajor bool

	authored *stepgraph.Graph // the step as written, before the passes
	graph    *stepgraph.Graph // after the passes: what runs
	passDone []string
	runner   *overlap.GraphRunner
	// peakEstimate is the plan's estimate of the collective memory the
	// runner measures (StepMetrics.PeakBytes).
	peakEstimate int64

	regionIdx map[string]int
	own       [][]float32 // parameters this rank owns: all (dp) or its shards
	state     []*model.OptState
	full      [][]float32   // gathered parameters (sharded)
	fullBwd   [][]float32   // gathered again for backward (sharded, --reshard)
	grads     [][][]float32 // [chunk][region] per-chunk gradient partial sums
	gradWhole [][]float32   // [region] the rank's gradient (reduced in place in dp)
	gsh       [][][]float32 // [chunk][region] reduce-scattered shards (sharded)
	gshWhole  [][]float32   // [region] this rank's reduced gradient shard (sharded)
	loss      []float32     // one local loss sum per chunk
	lossWhole [1]float32    // the loss sum, all-reduced in place
	in        []int32
	tg        []int32
}

func newTrainer(o options, cm overlap.Comm, log zerolog.Logger) (*trainer, error) {
	N, k := cm.Size(), cm.Rank()
	if err := o.validate(N); err != nil {
		return nil, err
	}
	m, err := model.New(o.modelConfig())
	if err != nil {
		return nil, err
	}
	opt, err := model.NewOptimizer(model.DefaultOptimizerConfig())
	if err != nil {
		return nil, err
	}
	t := &trainer{o: o, cm: cm, log: log, m: m, lay: m.Layout(), opt: opt, data: model.NewDataset(m.Config()),
		N: N, k: k, R: m.NumRegions(), chunks: 1, sharded: o.mode != "dp", hsdp: o.mode == "hsdp",
		S: 1, shardGroup: world, comms: map[string]overlap.Comm{world: cm}, regionIdx: map[string]int{}}
	switch {
	case t.hsdp:
		if err := t.connectHSDP(context.Background()); err != nil {
			return nil, err
		}
	case t.sharded:
		t.S, t.sk = N, k
	}
	if o.chunk {
		t.chunks = 2
		t.chunkMajor = !o.chunkAccumulate
	}
	for r, reg := range t.lay.Regions {
		t.regionIdx[reg.Name] = r
	}
	t.n = o.batch / N
	if t.ws, err = m.NewWorkspace(t.n); err != nil {
		return nil, err
	}
	t.ws.SetWorkers(o.workers)
	shards := 1
	if t.sharded {
		shards = t.S
		if t.own, err = m.InitShards(t.S, t.sk); err != nil {
			return nil, err
		}
		// Allocated when first gathered, dropped after their last reader.
		t.full = make([][]float32, t.R)
		t.fullBwd = make([][]float32, t.R)
		t.gshWhole = t.lay.AllocShards(t.S)
	} else {
		t.own = m.Init()
	}
	t.state = make([]*model.OptState, t.R)
	for r := range t.state {
		t.state[r] = opt.NewState(len(t.own[r]))
	}
	t.gradWhole = t.lay.Alloc(shards)
	for c := 0; c < t.chunks; c++ {
		t.grads = append(t.grads, t.lay.Alloc(shards))
		if t.sharded {
			t.gsh = append(t.gsh, t.lay.AllocShards(t.S))
		}
	}
	t.loss = make([]float32, t.chunks)
	T := m.Config().SeqLen
	t.in, t.tg = make([]int32, t.n*T), make([]int32, t.n*T)

	if t.authored, err = t.buildGraph(); err != nil {
		return nil, fmt.Errorf("trainer: the step graph: %w", err)
	}
	if t.graph, t.passDone, err = t.passes(t.authored); err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	ocfg := overlap.DefaultConfig()
	ocfg.Logger = log
	ocfg.Trace = o.trace != ""
	switch {
	case o.noOverlap:
		ocfg.Mode = overlap.Serial
	case o.grouped:
		ocfg.Mode = overlap.Grouped
	}
	ocfg.PrefetchStarts = o.prefetch
	if t.runner, err = overlap.NewGraphRunner(t.graph, t.comms, ocfg); err != nil {
		return nil, err
	}
	t.runner.SetRelease(t.release)
	if t.peakEstimate, _, err = stepgraph.PeakCollectiveBytes(t.graph); err != nil {
		return nil, err
	}
	return t, nil
}

func f32(s []float32) comm.Buffer { return comm.Float32s(s) }

// floats is the float32 memory of graph tensor name.
func (t *trainer) floats(name string) ([]float32, error) {
	b, err := t.tensor(name)
	if err != nil {
		return nil, err
	}
	return comm.AsFloat32(b), nil
}

// kernel runs the trainer's compute nodes: forward, loss, backward and
// optimizer of one region, on the samples of the node's chunk. Which memory
// a node uses comes from the tensors it names, so what the passes rewired
// (a re-gathered parameter, a chunk's gradient) is what runs.
func (t *trainer) kernel(step int) overlap.Kernel {
	return func(_ context.Context, nd *stepgraph.Node) error {
		name, lo, hi := nd.Name, 0, t.n
		c := -1
		if nd.Chunk != nil {
			name, c = nd.Chunk.Of, nd.Chunk.Index
			cs := t.n / nd.Chunk.Count
			lo, hi = c*cs, (c+1)*cs
		}
		if name == "loss" {
			l, err := t.ws.LossSum(lo, hi)
			if err != nil {
				return err
			}
			out, err := t.floats(nd.Writes[0])
			if err != nil {
				return err
			}
			out[0] = l
			return nil
		}
		kind, region, _ := strings.Cut(name, ".")
		r, ok := t.regionIdx[region]
		if !ok {
			return fmt.Errorf("trainer: compute %q: no region %q", nd.Name, region)
		}
		var params []float32
		for _, rd := range nd.Reads {
			if strings.HasPrefix(rd, "p.") {
				p, err := t.floats(rd)
				if err != nil {
					return err
				}
				params = p
			}
		}
		switch kind {
		case "fwd":
			return t.ws.Forward(r, params, lo, hi)
		case "bwd":
			g := t.gradWhole[r]
			if c >= 0 {
				g = t.grads[c][r]
			}
			return t.ws.Backward(r, params, g, lo, hi)
		case "opt":
			// The gradient the graph reduced (and, chunked, summed) into the
			// whole buffer; divide by the global batch, update what this
			// rank owns.
			g := t.gradWhole[r]
			if t.sharded {
				g = t.gshWhole[r]
			}
			if err := model.Mean(g, t.o.batch); err != nil {
				return err
			}
			return t.opt.Update(step, t.own[r], g, t.state[r])
		}
		return fmt.Errorf("trainer: compute %q is not one of the trainer's", nd.Name)
	}
}

// step runs one training step through the graph runner and returns the
// global mean loss.
func (t *trainer) step(ctx context.Context, step int) (float32, overlap.StepMetrics, error) {
	T := t.m.Config().SeqLen
	// Rank-major unless per-chunk reduction needs the chunk at the top of
	// the sample tree (model.SampleRange explains both).
	parts := 1
	if t.chunkMajor {
		parts = 2
	}
	per := t.n / parts
	for c := 0; c < parts; c++ {
		lo, hi, err := model.SampleRange(t.o.batch, t.N, t.k, parts, c, t.chunkMajor)
		if err != nil {
			return 0, overlap.StepMetrics{}, err
		}
		if err := t.data.Batch(step, t.o.batch, lo, hi, t.in[c*per*T:(c+1)*per*T], t.tg[c*per*T:(c+1)*per*T]); err != nil {
			return 0, overlap.StepMetrics{}, err
		}
	}
	if err := t.ws.SetBatch(t.in, t.tg); err != nil {
		return 0, overlap.StepMetrics{}, err
	}
	// Steps are numbered as the printed step lines.
	met, err := t.runner.Step(ctx, step+1, t.tensor, t.kernel(step+1))
	if err != nil {
		return 0, met, err
	}
	return t.lossWhole[0] / float32(t.o.batch), met, nil
}

// connectHSDP makes the two communicators of hybrid sharding: the shard
// group of S consecutive ranks (k/S·S …) and the replica group of the ranks
// at the same place in every shard group (k mod S, + S, …). Consecutive
// shard groups are what keeps the deterministic sums bitwise those of the
// reference: the shard reduce-scatter sums a contiguous run of ranks'
// samples and the replica all-reduce sums those runs in order, the same
// tree the flat reduction builds over all ranks.
func (t *trainer) connectHSDP(ctx context.Context) error {
	S := t.o.shardSize
	if S == 0 {
		S = min(2, t.N)
	}
	t.S, t.sk, t.shardGroup = S, t.k%S, "shard"
	var shard, replica []int
	for i := range S {
		shard = append(shard, t.k/S*S+i)
	}
	for i := t.k % S; i < t.N; i += S {
		replica = append(replica, i)
	}
	for _, g := range []struct {
		name  string
		ranks []int
	}{{"shard", shard}, {"replica", replica}} {
		c, err := t.o.subgroup(ctx, g.name, g.ranks)
		if err != nil {
			return fmt.Errorf("trainer: hsdp %s group %v: %w", g.name, g.ranks, err)
		}
		t.comms[g.name] = c
	}
	return nil
}

// fingerprint gathers the full parameters (sharded) and hashes them.
func (t *trainer) fingerprint(ctx context.Context) (uint64, error) {
	var bufs [][]float32
	for r, reg := range t.lay.Regions {
		p := t.own[r]
		if t.sharded {
			full := t.gathered(t.full, r)
			if err := t.comms[t.shardGroup].AllGather(ctx, f32(t.own[r]), f32(full)).Wait(ctx); err != nil {
				return 0, err
			}
			p = full
		}
		bufs = append(bufs, p[:reg.Size])
	}
	return model.Fingerprint(bufs...), nil
}

// run trains for o.steps steps; rank 0 prints to out.
func run(ctx context.Context, o options, cm overlap.Comm, log zerolog.Logger, out io.Writer) (*result, error) {
	t, err := newTrainer(o, cm, log)
	if err != nil {
		return nil, err
	}
	defer t.runner.Close()
	lead := cm.Rank() == 0
	if lead && o.dumpGraph != "" {
		if err := dumpGraph(o.dumpGraph, t.authored); err != nil {
			return nil, err
		}
	}
	if lead {
		fmt.Fprintf(out, "trainer: %s; mode %s, %d ranks, global batch %d, %s\n", t.m, o.mode, t.N, o.batch, describe(o, t))
	}
	res := &result{}
	first := 0
	if o.checkpoint != "" {
		if first, err = t.resume(ctx); err != nil {
			return nil, err
		}
		if lead && first > 0 {
			fmt.Fprintf(out, "resumed from step %d (%s)\n", first, filepath.Join(o.checkpoint, checkpointFile))
		}
	}
	for s := first; s < o.steps; s++ {
		loss, met, err := t.step(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("trainer: step %d: %w", s+1, err)
		}
		res.losses = append(res.losses, loss)
		if o.checkpoint != "" {
			why, err := t.maybeCheckpoint(ctx, s+1)
			if err != nil {
				return nil, fmt.Errorf("trainer: checkpoint after step %d: %w", s+1, err)
			}
			if lead && why != "" {
				fmt.Fprintf(out, "checkpoint after step %d (%s)\n", s+1, why)
			}
		}
		if o.reportStep != nil {
			// After the checkpoint: a fault gorun fires on this report
			// finds the step's checkpoint written.
			o.reportStep(s + 1)
		}
		if s > first || o.steps == 1 {
			res.total.Add(met) // the first step warms caches and connections
		}
		log.Debug().Int("step", s+1).Str("metrics", met.String()).Msg("step done")
		if lead {
			fmt.Fprintf(out, "step %d loss %s time %.2fms\n", s+1, strconv.FormatFloat(float64(loss), 'g', -1, 32), float64(met.Time.Microseconds())/1e3)
		}
	}
	res.peakEstimate = t.peakEstimate
	if res.params, err = t.fingerprint(ctx); err != nil {
		return nil, err
	}
	if o.trace != "" {
		if err := writeTraces(ctx, cm, t.runner.Executor().Timeline(), o.trace); err != nil {
			return nil, err
		}
	}
	if lead {
		tot, steps := res.total, max(o.steps-first-1, 1)
		avg := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(steps) }
		fmt.Fprintf(out, "summary: %d steps, mean step %.2fms (%s), compute %.2fms, comm %.2fms, exposed comm %.2fms, exposed-communication fraction %.3f, %d collectives/step, peak collective memory %d bytes (plan estimate %d), params %016x\n",
			o.steps, avg(tot.Time), measuredSteps(first, o.steps), avg(tot.Compute), avg(tot.Comm), avg(tot.Exposed), tot.ExposedFraction(), tot.Collectives/steps, tot.PeakBytes, t.peakEstimate, res.params)
	}
	return res, nil
}

// measuredSteps names the steps the summary's means are taken over, 1-based:
// every step run after the first of this run (first is the 0-based step it
// resumed at), which warms caches and connections; a one-step run measures
// its only step.
func measuredSteps(first, steps int) string {
	switch lo := first + 2; {
	case steps == 1 && first == 0:
		return "step 1"
	case lo > steps:
		return fmt.Sprintf("no step measured: step %d warms up", first+1)
	case lo == steps:
		return fmt.Sprintf("step %d; step %d warms up", lo, first+1)
	default:
		return fmt.Sprintf("steps %d-%d; step %d warms up", lo, steps, first+1)
	}
}

// maybeCheckpoint writes a checkpoint after step (1-based) when
// --checkpoint-every says so or any rank has caught the checkpoint signal:
// the ranks agree on the latter with an all-reduce (max) of one element, so
// that they all write at the same step. It returns why it wrote one ("":
// it did not).
func (t *trainer) maybeCheckpoint(ctx context.Context, step int) (string, error) {
	asked := []int64{0}
	select {
	case <-t.o.checkpointAsked:
		asked[0] = 1
	default:
	}
	if err := t.cm.AllReduce(ctx, comm.Int64s(asked), comm.Int64s(asked), comm.Max).Wait(ctx); err != nil {
		return "", err
	}
	every := t.o.checkpointEvery > 0 && step%t.o.checkpointEvery == 0
	if !every && asked[0] == 0 {
		return "", nil
	}
	if err := t.saveCheckpoint(ctx, step); err != nil {
		return "", err
	}
	if asked[0] != 0 {
		return "signal", nil
	}
	return "every " + strconv.Itoa(t.o.checkpointEvery), nil
}

func describe(o options, t *trainer) string {
	p := t.runner.Executor().Plan()
	nb := 0
	for _, g := range p.Groups {
		nb += len(g.Buckets)
	}
	passes := "none"
	if len(t.passDone) > 0 {
		passes = strings.Join(t.passDone, ", ")
	}
	return fmt.Sprintf("%d nodes, %d buckets/step, plan %016x, passes: %s; deterministic=%v overlap=%v", len(t.graph.Nodes), nb, p.Hash(), passes, o.deterministic, !o.noOverlap)
}

var errTrace = errors.New("trainer: trace")

// dumpGraph writes the step graph as written, before the passes, in the
// JSON schema of stepgraph (SCHEMA.md): what `gorun plan` reads.
func dumpGraph(file string, g *stepgraph.Graph) error {
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("trainer: --dump-graph: %w", err)
	}
	if err := stepgraph.Save(f, g); err != nil {
		_ = f.Close()
		return fmt.Errorf("trainer: --dump-graph %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("trainer: --dump-graph: %w", err)
	}
	return nil
}
