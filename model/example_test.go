package model_test

import (
	"fmt"

	"github.com/gorun-hpc/gorun/model"
)

// One data-parallel training step as rank k of N runs it, with the
// collectives marked where a trainer issues them. Here one rank stands for
// all: model.TreeSum over the ranks' buffers is what the deterministic
// all-reduce computes.
func Example_dataParallelStep() {
	cfg := model.DefaultConfig()
	m, _ := model.New(cfg)
	opt, _ := model.NewOptimizer(model.DefaultOptimizerConfig())
	data := model.NewDataset(cfg)

	const batch, ranks, rank = 4, 1, 0
	n := batch / ranks
	ws, _ := m.NewWorkspace(n)
	params, grads := m.Init(), m.Layout().Alloc(ranks)
	state := make([]*model.OptState, m.NumRegions())
	for r := range state {
		state[r] = opt.NewState(len(params[r]))
	}
	in, tg := make([]int32, n*cfg.SeqLen), make([]int32, n*cfg.SeqLen)

	for step := 1; step <= 2; step++ {
		lo, hi, _ := model.SampleRange(batch, ranks, rank, 1, 0, false)
		_ = data.Batch(step-1, batch, lo, hi, in, tg)
		_ = ws.SetBatch(in, tg)
		for r := 0; r < m.NumRegions(); r++ {
			// Sharded mode: all-gather region r's parameters here.
			_ = ws.Forward(r, params[r], 0, n)
		}
		local, _ := ws.LossSum(0, n) // all-reduce (sum) this scalar too
		for r := m.HeadRegion(); r >= 0; r-- {
			_ = ws.Backward(r, params[r], grads[r], 0, n)
			// Start the all-reduce (sum, deterministic) of grads[r] here,
			// or its reduce-scatter in sharded mode; it overlaps Backward(r-1).
		}
		// Wait for the collectives, then per region:
		for r := range grads {
			_ = model.Mean(grads[r], batch)
			_ = opt.Update(step, params[r], grads[r], state[r])
		}
		fmt.Printf("step %d loss %.2f\n", step, local/batch)
	}
	// Output:
	// step 1 loss 3.49
	// step 2 loss 3.38
}
