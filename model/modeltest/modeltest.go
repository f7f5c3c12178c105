package modeltest

import (
	"errors"
	"fmt"
	"math"

	"github.com/gorun-hpc/gorun/model"
)

// Options describes one simulated training run.
type Options struct {
	// Model sizes the network.
	Model model.Config
	// Optimizer updates the parameters.
	Optimizer model.OptimizerConfig
	// Data generates the batches; the zero value means model.NewDataset(Model).
	Data model.Dataset
	// Ranks is the number of simulated ranks; Batch/Ranks samples each, rank k
	// holding the k-th contiguous slice of the global batch.
	Ranks int
	// Batch is the global batch size.
	Batch int
	// Steps is the number of optimizer steps.
	Steps int
	// Sharded keeps 1/Ranks of every region per rank (FSDP-like): parameters
	// are all-gathered before each region's forward and again before its
	// backward, gradients reduce-scattered, and each rank updates its shard.
	// Otherwise every rank holds everything and gradients are all-reduced.
	Sharded bool
	// Chunks splits each rank's samples into that many equal chunks (a power
	// of two); every region runs forward chunk by chunk and backward per chunk,
	// and the chunks' gradient partial sums are combined with TreeSum before
	// the cross-rank reduction. 0 means 1.
	Chunks int
	// ChunkMajor assigns samples to chunks chunk-major (model.SampleRange)
	// and reduces each chunk's gradient and loss across ranks on its own,
	// combining the chunk sums afterwards — as a trainer does when a chunk's
	// collective overlaps the next chunk's compute.
	ChunkMajor bool
	// Workers is passed to every rank's Workspace.SetWorkers.
	Workers int

	// crossRank replaces the cross-rank reduction (tests only: a naive order
	// must break the bitwise equality, or the tests prove nothing).
	crossRank func(dst []float32, parts ...[]float32) error
}

// Result is what a run produced.
type Result struct {
	// Losses holds the mean loss of each step's global batch, before that
	// step's update.
	Losses []float32
	// Params are the final parameters, one exact-size buffer per region
	// (reassembled from the shards in sharded mode).
	Params [][]float32
}

// ErrOptions is wrapped by errors about unusable Options.
var ErrOptions = errors.New("modeltest: bad options")

func isPow2(x int) bool { return x > 0 && x&(x-1) == 0 }

// Run simulates the training run. In data-parallel mode it also checks that
// every rank ends with the same parameters, as the all-reduce promises.
func Run(o Options) (*Result, error) {
	if o.Chunks == 0 {
		o.Chunks = 1
	}
	if o.Data == (model.Dataset{}) {
		o.Data = model.NewDataset(o.Model)
	}
	N, B, C := o.Ranks, o.Batch, o.Chunks
	if !isPow2(N) || !isPow2(B) || !isPow2(C) || B%(N*C) != 0 || o.Steps < 0 {
		return nil, fmt.Errorf("%w: ranks %d, batch %d, chunks %d must be powers of two with ranks×chunks dividing the batch; steps %d",
			ErrOptions, N, B, C, o.Steps)
	}
	m, err := model.New(o.Model)
	if err != nil {
		return nil, err
	}
	opt, err := model.NewOptimizer(o.Optimizer)
	if err != nil {
		return nil, err
	}
	lay := m.Layout()
	R := m.NumRegions()
	n := B / N
	T := o.Model.SeqLen

	type rank struct {
		ws     *model.Workspace
		params [][]float32 // full (dp) or shard (sharded)
		state  []*model.OptState
		grads  [][]float32 // padded to N shards
		chunk  [][]float32 // per-chunk gradient partial sums of one region
		gather []float32   // gathered region parameters (sharded)
		in, tg []int32
	}
	init := m.Init()
	ranks := make([]*rank, N)
	for k := range ranks {
		ws, err := m.NewWorkspace(n)
		if err != nil {
			return nil, err
		}
		ws.SetWorkers(o.Workers)
		rk := &rank{ws: ws, grads: lay.Alloc(N), in: make([]int32, n*T), tg: make([]int32, n*T)}
		for r, reg := range lay.Regions {
			var p []float32
			if o.Sharded {
				full := make([]float32, reg.PaddedSize(N))
				copy(full, init[r])
				sh, err := reg.Shard(full, N, k)
				if err != nil {
					return nil, err
				}
				p = append([]float32(nil), sh...)
			} else {
				p = append([]float32(nil), init[r]...)
			}
			rk.params = append(rk.params, p)
			rk.state = append(rk.state, opt.NewState(len(p)))
		}
		for c := 0; c < C; c++ {
			rk.chunk = append(rk.chunk, nil)
		}
		ranks[k] = rk
	}
	maxPadded := 0
	for _, reg := range lay.Regions {
		maxPadded = max(maxPadded, reg.PaddedSize(N))
	}

	// regionParams returns the parameters rank k computes region r with: its
	// own copy, or in sharded mode a fresh all-gather of every rank's shard
	// (done again before backward, as reshard-after-forward does).
	regionParams := func(k, r int) []float32 {
		rk := ranks[k]
		if !o.Sharded {
			return rk.params[r]
		}
		if rk.gather == nil {
			rk.gather = make([]float32, maxPadded)
		}
		reg := lay.Regions[r]
		s := reg.ShardSize(N)
		g := rk.gather[:reg.PaddedSize(N)]
		for j := range ranks {
			copy(g[j*s:(j+1)*s], ranks[j].params[r])
		}
		return g
	}

	crossRank := o.crossRank
	if crossRank == nil {
		crossRank = model.TreeSum
	}
	res := &Result{}
	cs := n / C
	for step := 0; step < o.Steps; step++ {
		for k, rk := range ranks {
			for c := 0; c < C; c++ {
				lo, hi, err := model.SampleRange(B, N, k, C, c, o.ChunkMajor)
				if err != nil {
					return nil, err
				}
				if err := o.Data.Batch(step, B, lo, hi, rk.in[c*cs*T:(c+1)*cs*T], rk.tg[c*cs*T:(c+1)*cs*T]); err != nil {
					return nil, err
				}
			}
			if err := rk.ws.SetBatch(rk.in, rk.tg); err != nil {
				return nil, err
			}
		}
		// Forward, region by region, chunk by chunk.
		for r := 0; r < R; r++ {
			for k, rk := range ranks {
				p := regionParams(k, r)
				for c := 0; c < C; c++ {
					if err := rk.ws.Forward(r, p, c*cs, (c+1)*cs); err != nil {
						return nil, err
					}
				}
			}
		}
		var loss float32
		if o.ChunkMajor {
			// Per chunk across ranks, then across chunks.
			chunkSums := make([]float32, C)
			for c := range chunkSums {
				losses := make([]float32, N)
				for k, rk := range ranks {
					if losses[k], err = rk.ws.LossSum(c*cs, (c+1)*cs); err != nil {
						return nil, err
					}
				}
				chunkSums[c] = model.TreeSumScalars(losses...)
			}
			loss = model.TreeSumScalars(chunkSums...)
		} else {
			losses := make([]float32, N)
			for k, rk := range ranks {
				if losses[k], err = rk.ws.LossSum(0, n); err != nil {
					return nil, err
				}
			}
			loss = model.TreeSumScalars(losses...)
		}
		res.Losses = append(res.Losses, loss/float32(B))

		// Backward in reverse region order; after each region, the
		// cross-rank reduction and the update of that region.
		for r := R - 1; r >= 0; r-- {
			reg := lay.Regions[r]
			for k, rk := range ranks {
				p := regionParams(k, r)
				g := rk.grads[r]
				if o.ChunkMajor {
					// Keep the chunk partial sums apart for the per-chunk
					// cross-rank reduction below.
					for c := 0; c < C; c++ {
						if len(rk.chunk[c]) < len(g) {
							rk.chunk[c] = make([]float32, maxPadded)
						}
						if err := rk.ws.Backward(r, p, rk.chunk[c][:len(g)], c*cs, (c+1)*cs); err != nil {
							return nil, err
						}
					}
					continue
				}
				if C == 1 {
					if err := rk.ws.Backward(r, p, g, 0, n); err != nil {
						return nil, err
					}
					continue
				}
				for c := 0; c < C; c++ {
					if len(rk.chunk[c]) < len(g) {
						rk.chunk[c] = make([]float32, maxPadded)
					}
					if err := rk.ws.Backward(r, p, rk.chunk[c][:len(g)], c*cs, (c+1)*cs); err != nil {
						return nil, err
					}
				}
				parts := make([][]float32, C)
				for c := range parts {
					parts[c] = rk.chunk[c][:len(g)]
				}
				if err := model.TreeSum(g, parts...); err != nil {
					return nil, err
				}
			}
			sum := make([]float32, reg.PaddedSize(N))
			parts := make([][]float32, N)
			if o.ChunkMajor {
				// One cross-rank reduction per chunk, then the chunk sums
				// combined. (In sharded mode a trainer would combine its
				// shards of the chunk sums; elementwise that is the same.)
				chunkSums := make([][]float32, C)
				for c := range chunkSums {
					for k := range ranks {
						parts[k] = ranks[k].chunk[c][:len(sum)]
					}
					chunkSums[c] = make([]float32, len(sum))
					if err := crossRank(chunkSums[c], parts...); err != nil {
						return nil, err
					}
				}
				if err := model.TreeSum(sum, chunkSums...); err != nil {
					return nil, err
				}
			} else {
				for k := range ranks {
					parts[k] = ranks[k].grads[r]
				}
				if err := crossRank(sum, parts...); err != nil {
					return nil, err
				}
			}
			if err := model.Mean(sum, B); err != nil {
				return nil, err
			}
			for k, rk := range ranks {
				g := sum
				if o.Sharded {
					if g, err = reg.Shard(sum, N, k); err != nil {
						return nil, err
					}
				}
				// Update every element, padding included, exactly as a
				// trainer updating its shard would.
				p := rk.params[r]
				if err := opt.Update(step+1, p, g[:len(p)], rk.state[r]); err != nil {
					return nil, err
				}
			}
		}
	}

	res.Params = make([][]float32, R)
	for r, reg := range lay.Regions {
		full := make([]float32, reg.PaddedSize(N))
		if o.Sharded {
			s := reg.ShardSize(N)
			for k := range ranks {
				copy(full[k*s:(k+1)*s], ranks[k].params[r])
			}
		} else {
			copy(full, ranks[0].params[r])
			for k := 1; k < N; k++ {
				if !Equal(ranks[k].params[r], ranks[0].params[r]) {
					return nil, fmt.Errorf("modeltest: rank %d's %s differs from rank 0's after the all-reduce", k, reg.Name)
				}
			}
		}
		res.Params[r] = full[:reg.Size]
	}
	return res, nil
}

// Equal reports whether a and b hold the same bits (so NaN equals NaN and
// +0 differs from −0).
func Equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
