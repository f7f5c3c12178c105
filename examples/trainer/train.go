package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/rs/zerolog"
)

// options are the trainer's flags, separated from flag parsing so tests can
// run the same training in-process over an in-memory network.
type options struct {
	steps         int
	mode          string // "dp" or "sharded"
	deterministic bool
	bucketCap     int64
	noBucketing   bool
	noOverlap     bool
	reshard       bool
	chunk         bool
	grouped       bool
	trace         string
	batch         int
	size          string // "default" or "small"
	workers       int
}

func defaultOptions() options {
	return options{steps: 50, mode: "dp", batch: 16, size: "default"}
}

func (o options) validate(n int) error {
	chunks := 1
	if o.chunk {
		chunks = 2
	}
	switch {
	case o.steps < 1:
		return fmt.Errorf("trainer: --steps %d, need at least 1", o.steps)
	case o.mode != "dp" && o.mode != "sharded":
		return fmt.Errorf("trainer: --mode %q, want dp or sharded", o.mode)
	case o.size != "default" && o.size != "small":
		return fmt.Errorf("trainer: --model %q, want default or small", o.size)
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
	params uint64 // model.Fingerprint of the final parameters (full, unsharded)
}

// trainer is one rank's state.
type trainer struct {
	o       options
	cm      overlap.Comm
	log     zerolog.Logger
	m       *model.Model
	lay     *model.Layout
	ws      *model.Workspace
	opt     *model.Optimizer
	data    model.Dataset
	ex      *overlap.Executor
	N, k    int
	R       int
	chunks  int
	n, cs   int // local samples, samples per chunk
	sharded bool

	own   [][]float32 // parameters this rank owns: all (dp) or its shards
	state []*model.OptState
	full  [][]float32   // gathered parameters (sharded)
	grads [][][]float32 // [chunk][region] local gradient partial sums
	gsh   [][][]float32 // [chunk][region] reduce-scattered shards (sharded)
	loss  []float32     // one local loss sum per chunk, all-reduced in place
	in    []int32
	tg    []int32
}

// sub names the plan region of chunk c of model region name: the region
// itself without chunking.
func (t *trainer) sub(name string, c int) string {
	if t.chunks == 1 {
		return name
	}
	return name + "#" + strconv.Itoa(c)
}

const world = "world"

// plan describes this step's collectives to buckets.Assign, in the order
// they become ready.
func (t *trainer) plan() (*buckets.Plan, error) {
	var regions []string
	for _, r := range t.lay.Regions {
		// Forward order lists the later chunk first, so that backward (which
		// Assign orders in reverse) issues chunk 0 before chunk 1.
		for c := t.chunks - 1; c >= 0; c-- {
			regions = append(regions, t.sub(r.Name, c))
		}
	}
	item := func(tensor, out string, bytes int64, op buckets.Op, dir buckets.Direction, region string) buckets.Item {
		return buckets.Item{Tensor: tensor, Out: out, Bytes: bytes, Group: world, Op: op, DType: "f32", Direction: dir, Region: region}
	}
	var items []buckets.Item
	if t.sharded {
		// Forward: the gather of region r+1 is issued in region r (one
		// ahead, as FSDP prefetches), region 0's with region 0.
		first := t.sub(t.lay.Regions[0].Name, t.chunks-1)
		for r, reg := range t.lay.Regions {
			at := first
			if r > 0 {
				at = t.sub(t.lay.Regions[r-1].Name, t.chunks-1)
			}
			items = append(items, item(reg.Name+".shard", reg.Name+".full", int64(reg.ShardSize(t.N))*4, buckets.AllGather, buckets.Forward, at))
		}
		// Backward: with reshard, region r is gathered again, issued in
		// region r+1 (the last region's with itself), before that region's
		// gradients so the gather is not queued behind them.
		for r := t.R - 1; r >= 0; r-- {
			reg := t.lay.Regions[r]
			if t.o.reshard {
				for _, q := range []int{r, r - 1} {
					if q < 0 || (q == r && r != t.R-1) {
						continue
					}
					g := t.lay.Regions[q]
					items = append(items, item(g.Name+".shard@bwd", g.Name+".full@bwd", int64(g.ShardSize(t.N))*4, buckets.AllGather, buckets.Backward, t.sub(reg.Name, 0)))
				}
			}
			for c := 0; c < t.chunks; c++ {
				items = append(items, item(gradName(reg.Name, c), gradName(reg.Name, c)+".shard", int64(reg.PaddedSize(t.N))*4, buckets.ReduceScatter, buckets.Backward, t.sub(reg.Name, c)))
			}
		}
	} else {
		for r := t.R - 1; r >= 0; r-- {
			reg := t.lay.Regions[r]
			for c := 0; c < t.chunks; c++ {
				for _, ten := range reg.Tensors {
					items = append(items, item(gradName(ten.Name, c), gradName(ten.Name, c), int64(ten.Len)*4, buckets.AllReduce, buckets.Backward, t.sub(reg.Name, c)))
				}
			}
		}
	}
	items = append(items, item("loss", "loss", int64(t.chunks)*4, buckets.AllReduce, buckets.None, ""))
	cfg := buckets.DefaultConfig()
	cfg.CapBytes = t.o.bucketCap
	if t.o.noBucketing {
		cfg.CapBytes = 1 // every tensor its own collective
	}
	return buckets.Assign(items, regions, cfg)
}

func gradName(name string, c int) string { return name + ".grad#" + strconv.Itoa(c) }

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
		N: N, k: k, R: m.NumRegions(), chunks: 1, sharded: o.mode == "sharded"}
	if o.chunk {
		t.chunks = 2
	}
	t.n = o.batch / N
	t.cs = t.n / t.chunks
	if t.ws, err = m.NewWorkspace(t.n); err != nil {
		return nil, err
	}
	t.ws.SetWorkers(o.workers)
	if t.sharded {
		if t.own, err = m.InitShards(N, k); err != nil {
			return nil, err
		}
		t.full = t.lay.Alloc(N)
	} else {
		t.own = m.Init()
	}
	t.state = make([]*model.OptState, t.R)
	for r := range t.state {
		t.state[r] = opt.NewState(len(t.own[r]))
	}
	shards := 1
	if t.sharded {
		shards = N
	}
	for c := 0; c < t.chunks; c++ {
		t.grads = append(t.grads, t.lay.Alloc(shards))
		if t.sharded {
			t.gsh = append(t.gsh, t.lay.AllocShards(N))
		}
	}
	t.loss = make([]float32, t.chunks)
	T := m.Config().SeqLen
	t.in, t.tg = make([]int32, t.n*T), make([]int32, t.n*T)

	p, err := t.plan()
	if err != nil {
		return nil, err
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
	if t.ex, err = overlap.New(p, map[string]overlap.Comm{world: cm}, ocfg); err != nil {
		return nil, err
	}
	return t, nil
}

func f32(s []float32) comm.Buffer { return comm.Float32s(s) }

// step runs one training step and returns the global mean loss.
func (t *trainer) step(ctx context.Context, step int) (float32, overlap.StepMetrics, error) {
	ex := t.ex
	if err := ex.Begin(step + 1); err != nil { // numbered as the printed step lines
		return 0, overlap.StepMetrics{}, err
	}
	T := t.m.Config().SeqLen
	for c := 0; c < t.chunks; c++ {
		// Chunk-major sample assignment keeps each chunk's cross-rank sum a
		// node of the global pairwise tree (see model.SampleRange).
		lo, hi, err := model.SampleRange(t.o.batch, t.N, t.k, t.chunks, c, t.chunks > 1)
		if err != nil {
			return 0, overlap.StepMetrics{}, err
		}
		if err := t.data.Batch(step, t.o.batch, lo, hi, t.in[c*t.cs*T:(c+1)*t.cs*T], t.tg[c*t.cs*T:(c+1)*t.cs*T]); err != nil {
			return 0, overlap.StepMetrics{}, err
		}
	}
	if err := t.ws.SetBatch(t.in, t.tg); err != nil {
		return 0, overlap.StepMetrics{}, err
	}
	params := func(r int) []float32 {
		if t.sharded {
			return t.full[r]
		}
		return t.own[r]
	}
	gather := func(r int, suffix string) error {
		reg := t.lay.Regions[r]
		return ex.Ready(ctx, reg.Name+".shard"+suffix, f32(t.own[r]), f32(t.full[r]))
	}
	// Forward.
	for r := 0; r < t.R; r++ {
		reg := t.lay.Regions[r]
		if t.sharded {
			if r == 0 {
				if err := gather(0, ""); err != nil {
					return 0, overlap.StepMetrics{}, err
				}
			}
			if r+1 < t.R {
				if err := gather(r+1, ""); err != nil {
					return 0, overlap.StepMetrics{}, err
				}
			}
			if err := ex.Wait(ctx, reg.Name+".full"); err != nil {
				return 0, overlap.StepMetrics{}, err
			}
		}
		for c := 0; c < t.chunks; c++ {
			err := ex.Compute(ctx, "forward "+t.sub(reg.Name, c), t.sub(reg.Name, c), func() error {
				return t.ws.Forward(r, params(r), c*t.cs, (c+1)*t.cs)
			})
			if err != nil {
				return 0, overlap.StepMetrics{}, err
			}
		}
	}
	for c := 0; c < t.chunks; c++ {
		l, err := t.ws.LossSum(c*t.cs, (c+1)*t.cs)
		if err != nil {
			return 0, overlap.StepMetrics{}, err
		}
		t.loss[c] = l
	}
	if err := ex.Ready(ctx, "loss", f32(t.loss), f32(t.loss)); err != nil {
		return 0, overlap.StepMetrics{}, err
	}
	// Backward.
	for r := t.R - 1; r >= 0; r-- {
		reg := t.lay.Regions[r]
		if t.sharded && t.o.reshard {
			if r == t.R-1 {
				if err := gather(r, "@bwd"); err != nil {
					return 0, overlap.StepMetrics{}, err
				}
			}
			if r > 0 {
				if err := gather(r-1, "@bwd"); err != nil {
					return 0, overlap.StepMetrics{}, err
				}
			}
			if err := ex.Wait(ctx, reg.Name+".full@bwd"); err != nil {
				return 0, overlap.StepMetrics{}, err
			}
		}
		for c := 0; c < t.chunks; c++ {
			g := t.grads[c][r]
			err := ex.Compute(ctx, "backward "+t.sub(reg.Name, c), t.sub(reg.Name, c), func() error {
				return t.ws.Backward(r, params(r), g, c*t.cs, (c+1)*t.cs)
			})
			if err != nil {
				return 0, overlap.StepMetrics{}, err
			}
			if t.sharded {
				err = ex.Ready(ctx, gradName(reg.Name, c), f32(g), f32(t.gsh[c][r]))
			} else {
				for _, ten := range reg.Tensors {
					v := f32(g[ten.Offset : ten.Offset+ten.Len])
					if err = ex.Ready(ctx, gradName(ten.Name, c), v, v); err != nil {
						break
					}
				}
			}
			if err == nil {
				err = ex.EndRegion(ctx, t.sub(reg.Name, c))
			}
			if err != nil {
				return 0, overlap.StepMetrics{}, err
			}
		}
	}
	// Optimizer, region by region in the order the gradients were
	// reduced, each region waiting for its own gradients right before it
	// reads them: the last reductions hide behind the first updates.
	// Chunks are the top level of the sample tree: combine, then divide by
	// the global batch and update what this rank owns.
	for r := t.R - 1; r >= 0; r-- {
		reg := t.lay.Regions[r]
		for c := 0; c < t.chunks; c++ {
			if t.sharded {
				if err := ex.Wait(ctx, gradName(reg.Name, c)+".shard"); err != nil {
					return 0, overlap.StepMetrics{}, err
				}
				continue
			}
			for _, ten := range reg.Tensors {
				if err := ex.Wait(ctx, gradName(ten.Name, c)); err != nil {
					return 0, overlap.StepMetrics{}, err
				}
			}
		}
		err := ex.Compute(ctx, "optimizer "+reg.Name, reg.Name, func() error {
			var g []float32
			if t.sharded {
				g = t.gsh[0][r]
				if t.chunks == 2 {
					if err := model.TreeSum(g, g, t.gsh[1][r]); err != nil {
						return err
					}
				}
			} else {
				g = t.grads[0][r]
				if t.chunks == 2 {
					if err := model.TreeSum(g, g, t.grads[1][r]); err != nil {
						return err
					}
				}
			}
			if err := model.Mean(g, t.o.batch); err != nil {
				return err
			}
			return t.opt.Update(step+1, t.own[r], g, t.state[r])
		})
		if err != nil {
			return 0, overlap.StepMetrics{}, err
		}
	}
	met, err := ex.Finish(ctx)
	if err != nil {
		return 0, met, err
	}
	return model.TreeSumScalars(t.loss...) / float32(t.o.batch), met, nil
}

// fingerprint gathers the full parameters (sharded) and hashes them.
func (t *trainer) fingerprint(ctx context.Context) (uint64, error) {
	var bufs [][]float32
	for r, reg := range t.lay.Regions {
		p := t.own[r]
		if t.sharded {
			if err := t.cm.AllGather(ctx, f32(t.own[r]), f32(t.full[r])).Wait(ctx); err != nil {
				return 0, err
			}
			p = t.full[r]
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
	defer t.ex.Close()
	lead := cm.Rank() == 0
	if lead {
		fmt.Fprintf(out, "trainer: %s; mode %s, %d ranks, global batch %d, %s\n", t.m, o.mode, t.N, o.batch, describe(o, t.ex))
	}
	res := &result{}
	for s := 0; s < o.steps; s++ {
		loss, met, err := t.step(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("trainer: step %d: %w", s+1, err)
		}
		res.losses = append(res.losses, loss)
		if s > 0 || o.steps == 1 {
			res.total.Add(met) // the first step warms caches and connections
		}
		log.Debug().Int("step", s+1).Str("metrics", met.String()).Msg("step done")
		if lead {
			fmt.Fprintf(out, "step %d loss %s time %.2fms\n", s+1, strconv.FormatFloat(float64(loss), 'g', -1, 32), float64(met.Time.Microseconds())/1e3)
		}
	}
	if res.params, err = t.fingerprint(ctx); err != nil {
		return nil, err
	}
	if o.trace != "" {
		if err := writeTraces(ctx, cm, t.ex.Timeline(), o.trace); err != nil {
			return nil, err
		}
	}
	if lead {
		tot, steps := res.total, max(o.steps-1, 1)
		avg := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(steps) }
		fmt.Fprintf(out, "summary: %d steps, mean step %.2fms, compute %.2fms, comm %.2fms, exposed comm %.2fms, exposed-communication fraction %.3f, %d collectives/step, params %016x\n",
			o.steps, avg(tot.Time), avg(tot.Compute), avg(tot.Comm), avg(tot.Exposed), tot.ExposedFraction(), tot.Collectives/steps, res.params)
	}
	return res, nil
}

func describe(o options, ex *overlap.Executor) string {
	p := ex.Plan()
	nb := 0
	for _, g := range p.Groups {
		nb += len(g.Buckets)
	}
	return fmt.Sprintf("%d buckets/step, plan %016x, deterministic=%v overlap=%v reshard=%v chunk=%v", nb, p.Hash(), o.deterministic, !o.noOverlap, o.reshard, o.chunk)
}

var errTrace = errors.New("trainer: trace")
