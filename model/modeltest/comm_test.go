package modeltest_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/model/modeltest"
)

// TestRealCollectivesMatchReference closes the loop between the simulation
// and the communicator: N goroutine ranks train over comm's deterministic
// collectives on the in-memory network — each region's gradient all-reduce
// (or reduce-scatter) started as soon as its backward returns and waited for
// only at the end of the step, parameters all-gathered per region before
// forward and again before backward in sharded mode — and must reproduce the
// one-rank reference bit for bit. If comm's tree and model.TreeSum ever
// disagree, this is the test that says so.
func TestRealCollectivesMatchReference(t *testing.T) {
	cfg := model.DefaultConfig()
	cfg.Vocab, cfg.SeqLen, cfg.Dim, cfg.Heads, cfg.Layers, cfg.Hidden = 16, 8, 16, 2, 2, 32
	const batch, steps = 8, 10
	ocfg := model.DefaultOptimizerConfig()
	ref, err := modeltest.Run(modeltest.Options{Model: cfg, Optimizer: ocfg, Batch: batch, Steps: steps, Ranks: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ranks   int
		sharded bool
	}{{2, false}, {4, false}, {4, true}} {
		t.Run(fmt.Sprintf("ranks=%d/sharded=%v", tc.ranks, tc.sharded), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			comms := startComms(ctx, t, tc.ranks)
			results := make([]*modeltest.Result, tc.ranks)
			errs := make([]error, tc.ranks)
			var wg sync.WaitGroup
			for k := range comms {
				wg.Go(func() {
					results[k], errs[k] = trainRank(ctx, comms[k], cfg, ocfg, batch, steps, tc.sharded)
					if errs[k] != nil {
						comms[k].Abort(errs[k]) // free the peers instead of hanging them
					}
				})
			}
			wg.Wait()
			for k, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", k, err)
				}
			}
			for k, res := range results {
				for i := range ref.Losses {
					if math.Float32bits(ref.Losses[i]) != math.Float32bits(res.Losses[i]) {
						t.Fatalf("rank %d step %d: loss %.9g, reference %.9g", k, i, res.Losses[i], ref.Losses[i])
					}
				}
				if got, want := model.Fingerprint(res.Params...), model.Fingerprint(ref.Params...); got != want {
					t.Errorf("rank %d: parameters %x, reference %x", k, got, want)
				}
			}
		})
	}
}

func startComms(ctx context.Context, t *testing.T, n int) []comm.Communicator {
	t.Helper()
	cfg := comm.LocalConfig()
	cfg.Deterministic = true
	out := make([]comm.Communicator, n)
	for r, c := range commtest.StartComms(ctx, t, n, cfg) {
		out[r] = c
	}
	return out
}

// trainRank is one rank of a minimal trainer: what examples/trainer does,
// without flags, bucketing or timing.
func trainRank(ctx context.Context, c comm.Communicator, cfg model.Config, ocfg model.OptimizerConfig,
	batch, steps int, sharded bool) (*modeltest.Result, error) {
	N, k := c.Size(), c.Rank()
	m, err := model.New(cfg)
	if err != nil {
		return nil, err
	}
	opt, err := model.NewOptimizer(ocfg)
	if err != nil {
		return nil, err
	}
	lay, R, n, T := m.Layout(), m.NumRegions(), batch/N, cfg.SeqLen
	ws, err := m.NewWorkspace(n)
	if err != nil {
		return nil, err
	}
	data := model.NewDataset(cfg)

	// Owned parameters: everything (data parallel) or this rank's shards.
	var own [][]float32
	if sharded {
		if own, err = m.InitShards(N, k); err != nil {
			return nil, err
		}
	} else {
		own = m.Init()
	}
	state := make([]*model.OptState, R)
	for r := range state {
		state[r] = opt.NewState(len(own[r]))
	}
	full := lay.Alloc(N)  // gathered parameters (sharded)
	grads := lay.Alloc(N) // local gradient partial sums, padded for reduce-scatter
	gradShard := lay.AllocShards(N)
	params := func(r int) []float32 {
		if sharded {
			return full[r]
		}
		return own[r]
	}
	gather := func(r int) error {
		if !sharded {
			return nil
		}
		return c.AllGather(ctx, comm.Float32s(own[r]), comm.Float32s(full[r])).Wait(ctx)
	}
	in, tg := make([]int32, n*T), make([]int32, n*T)
	res := &modeltest.Result{}
	for step := 0; step < steps; step++ {
		lo, hi, err := model.SampleRange(batch, N, k, 1, 0, false)
		if err != nil {
			return nil, err
		}
		if err := data.Batch(step, batch, lo, hi, in, tg); err != nil {
			return nil, err
		}
		if err := ws.SetBatch(in, tg); err != nil {
			return nil, err
		}
		for r := 0; r < R; r++ {
			if err := gather(r); err != nil {
				return nil, err
			}
			if err := ws.Forward(r, params(r), 0, n); err != nil {
				return nil, err
			}
		}
		local, err := ws.LossSum(0, n)
		if err != nil {
			return nil, err
		}
		loss := []float32{local}
		handles := []comm.Handle{c.AllReduce(ctx, comm.Float32s(loss), comm.Float32s(loss), comm.Sum)}
		for r := R - 1; r >= 0; r-- {
			if err := gather(r); err != nil { // reshard: gathered again for backward
				return nil, err
			}
			if err := ws.Backward(r, params(r), grads[r], 0, n); err != nil {
				return nil, err
			}
			// Start this region's reduction now; it runs while the next
			// region computes.
			if sharded {
				handles = append(handles, c.ReduceScatter(ctx, comm.Float32s(grads[r]), comm.Float32s(gradShard[r]), comm.Sum))
			} else {
				handles = append(handles, c.AllReduce(ctx, comm.Float32s(grads[r]), comm.Float32s(grads[r]), comm.Sum))
			}
		}
		for _, h := range handles {
			if err := h.Wait(ctx); err != nil {
				return nil, err
			}
		}
		res.Losses = append(res.Losses, loss[0]/float32(batch))
		for r := 0; r < R; r++ {
			g := grads[r][:len(own[r])]
			if sharded {
				g = gradShard[r]
			}
			if err := model.Mean(g, batch); err != nil {
				return nil, err
			}
			if err := opt.Update(step+1, own[r], g, state[r]); err != nil {
				return nil, err
			}
		}
	}
	for r, reg := range lay.Regions {
		if err := gather(r); err != nil {
			return nil, err
		}
		res.Params = append(res.Params, append([]float32(nil), params(r)[:reg.Size]...))
	}
	return res, nil
}
