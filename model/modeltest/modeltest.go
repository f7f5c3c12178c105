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
	s, err := newSim(o)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	for step := 0; step < o.Steps; step++ {
		if err := s.loadBatch(step); err != nil {
			return nil, err
		}
		if err := s.forward(); err != nil {
			return nil, err
		}
		loss, err := s.loss()
		if err != nil {
			return nil, err
		}
		res.Losses = append(res.Losses, loss/float32(o.Batch))
		// Backward in reverse region order; after each region, the
		// cross-rank reduction and the update of that region.
		for r := s.m.NumRegions() - 1; r >= 0; r-- {
			if err := s.backward(r); err != nil {
				return nil, err
			}
			sum, err := s.reduce(r)
			if err != nil {
				return nil, err
			}
			if err := s.update(step, r, sum); err != nil {
				return nil, err
			}
		}
	}
	if res.Params, err = s.params(); err != nil {
		return nil, err
	}
	return res, nil
}

// sim is one simulated run: the model, the optimizer, and every rank.
type sim struct {
	o         Options
	m         *model.Model
	opt       *model.Optimizer
	lay       *model.Layout
	ranks     []*simRank
	n, cs     int // samples per rank, per chunk
	maxPadded int // the largest region's padded size
	crossRank func(dst []float32, parts ...[]float32) error
}

// simRank is one simulated rank's buffers.
type simRank struct {
	ws     *model.Workspace
	params [][]float32 // full (dp) or shard (sharded)
	state  []*model.OptState
	grads  [][]float32 // padded to N shards
	chunk  [][]float32 // per-chunk gradient partial sums of one region
	gather []float32   // gathered region parameters (sharded)
	in, tg []int32
}

// newSim checks the options and sets every rank up with the model's
// initial parameters (its shard of them, in sharded mode).
func newSim(o Options) (*sim, error) {
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
	s := &sim{o: o, m: m, opt: opt, lay: m.Layout(), n: B / N, crossRank: o.crossRank}
	s.cs = s.n / C
	if s.crossRank == nil {
		s.crossRank = model.TreeSum
	}
	T := o.Model.SeqLen
	init := m.Init()
	s.ranks = make([]*simRank, N)
	for k := range s.ranks {
		ws, err := m.NewWorkspace(s.n)
		if err != nil {
			return nil, err
		}
		ws.SetWorkers(o.Workers)
		rk := &simRank{ws: ws, grads: s.lay.Alloc(N), in: make([]int32, s.n*T), tg: make([]int32, s.n*T)}
		for r, reg := range s.lay.Regions {
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
		rk.chunk = make([][]float32, C)
		s.ranks[k] = rk
	}
	for _, reg := range s.lay.Regions {
		s.maxPadded = max(s.maxPadded, reg.PaddedSize(N))
	}
	return s, nil
}

// regionParams returns the parameters rank k computes region r with: its
// own copy, or in sharded mode a fresh all-gather of every rank's shard
// (done again before backward, as reshard-after-forward does).
func (s *sim) regionParams(k, r int) []float32 {
	rk := s.ranks[k]
	if !s.o.Sharded {
		return rk.params[r]
	}
	if rk.gather == nil {
		rk.gather = make([]float32, s.maxPadded)
	}
	N := s.o.Ranks
	reg := s.lay.Regions[r]
	sz := reg.ShardSize(N)
	g := rk.gather[:reg.PaddedSize(N)]
	for j := range s.ranks {
		copy(g[j*sz:(j+1)*sz], s.ranks[j].params[r])
	}
	return g
}

// loadBatch gives every rank its samples of step's global batch, chunk by
// chunk.
func (s *sim) loadBatch(step int) error {
	o, T, cs := s.o, s.o.Model.SeqLen, s.cs
	for k, rk := range s.ranks {
		for c := 0; c < o.Chunks; c++ {
			lo, hi, err := model.SampleRange(o.Batch, o.Ranks, k, o.Chunks, c, o.ChunkMajor)
			if err != nil {
				return err
			}
			if err := o.Data.Batch(step, o.Batch, lo, hi, rk.in[c*cs*T:(c+1)*cs*T], rk.tg[c*cs*T:(c+1)*cs*T]); err != nil {
				return err
			}
		}
		if err := rk.ws.SetBatch(rk.in, rk.tg); err != nil {
			return err
		}
	}
	return nil
}

// forward runs the model forward, region by region, chunk by chunk.
func (s *sim) forward() error {
	for r := 0; r < s.m.NumRegions(); r++ {
		for k, rk := range s.ranks {
			p := s.regionParams(k, r)
			for c := 0; c < s.o.Chunks; c++ {
				if err := rk.ws.Forward(r, p, c*s.cs, (c+1)*s.cs); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// loss is the global batch's summed loss: across ranks, or in chunk-major
// mode per chunk across ranks and then across chunks.
func (s *sim) loss() (float32, error) {
	N, cs := s.o.Ranks, s.cs
	var err error
	if !s.o.ChunkMajor {
		losses := make([]float32, N)
		for k, rk := range s.ranks {
			if losses[k], err = rk.ws.LossSum(0, s.n); err != nil {
				return 0, err
			}
		}
		return model.TreeSumScalars(losses...), nil
	}
	chunkSums := make([]float32, s.o.Chunks)
	for c := range chunkSums {
		losses := make([]float32, N)
		for k, rk := range s.ranks {
			if losses[k], err = rk.ws.LossSum(c*cs, (c+1)*cs); err != nil {
				return 0, err
			}
		}
		chunkSums[c] = model.TreeSumScalars(losses...)
	}
	return model.TreeSumScalars(chunkSums...), nil
}

// backwardChunks runs region r backward per chunk on rank k, into the
// rank's chunk partial sums, each len(g) long.
func (s *sim) backwardChunks(k, r int, p, g []float32) error {
	rk := s.ranks[k]
	for c := 0; c < s.o.Chunks; c++ {
		if len(rk.chunk[c]) < len(g) {
			rk.chunk[c] = make([]float32, s.maxPadded)
		}
		if err := rk.ws.Backward(r, p, rk.chunk[c][:len(g)], c*s.cs, (c+1)*s.cs); err != nil {
			return err
		}
	}
	return nil
}

// backward runs region r backward on every rank: into its gradient, or per
// chunk with the chunks' partial sums combined by TreeSum, or in
// chunk-major mode per chunk with the partial sums kept apart for the
// per-chunk cross-rank reduction.
func (s *sim) backward(r int) error {
	C := s.o.Chunks
	for k, rk := range s.ranks {
		p := s.regionParams(k, r)
		g := rk.grads[r]
		switch {
		case s.o.ChunkMajor:
			if err := s.backwardChunks(k, r, p, g); err != nil {
				return err
			}
		case C == 1:
			if err := rk.ws.Backward(r, p, g, 0, s.n); err != nil {
				return err
			}
		default:
			if err := s.backwardChunks(k, r, p, g); err != nil {
				return err
			}
			parts := make([][]float32, C)
			for c := range parts {
				parts[c] = rk.chunk[c][:len(g)]
			}
			if err := model.TreeSum(g, parts...); err != nil {
				return err
			}
		}
	}
	return nil
}

// reduce is region r's cross-rank reduction, as the mean gradient over the
// global batch.
func (s *sim) reduce(r int) ([]float32, error) {
	N := s.o.Ranks
	sum := make([]float32, s.lay.Regions[r].PaddedSize(N))
	parts := make([][]float32, N)
	if s.o.ChunkMajor {
		// One cross-rank reduction per chunk, then the chunk sums
		// combined. (In sharded mode a trainer would combine its shards
		// of the chunk sums; elementwise that is the same.)
		chunkSums := make([][]float32, s.o.Chunks)
		for c := range chunkSums {
			for k := range s.ranks {
				parts[k] = s.ranks[k].chunk[c][:len(sum)]
			}
			chunkSums[c] = make([]float32, len(sum))
			if err := s.crossRank(chunkSums[c], parts...); err != nil {
				return nil, err
			}
		}
		if err := model.TreeSum(sum, chunkSums...); err != nil {
			return nil, err
		}
	} else {
		for k := range s.ranks {
			parts[k] = s.ranks[k].grads[r]
		}
		if err := s.crossRank(sum, parts...); err != nil {
			return nil, err
		}
	}
	if err := model.Mean(sum, s.o.Batch); err != nil {
		return nil, err
	}
	return sum, nil
}

// update applies step's optimizer update of region r on every rank, from
// the mean gradient (its shard of it, in sharded mode).
func (s *sim) update(step, r int, sum []float32) error {
	reg := s.lay.Regions[r]
	for k, rk := range s.ranks {
		g := sum
		if s.o.Sharded {
			var err error
			if g, err = reg.Shard(sum, s.o.Ranks, k); err != nil {
				return err
			}
		}
		// Update every element, padding included, exactly as a trainer
		// updating its shard would.
		p := rk.params[r]
		if err := s.opt.Update(step+1, p, g[:len(p)], rk.state[r]); err != nil {
			return err
		}
	}
	return nil
}

// params are the final parameters, one exact-size buffer per region:
// reassembled from the shards, or rank 0's after checking that every rank
// holds the same.
func (s *sim) params() ([][]float32, error) {
	N := s.o.Ranks
	out := make([][]float32, s.m.NumRegions())
	for r, reg := range s.lay.Regions {
		full := make([]float32, reg.PaddedSize(N))
		if s.o.Sharded {
			sz := reg.ShardSize(N)
			for k := range s.ranks {
				copy(full[k*sz:(k+1)*sz], s.ranks[k].params[r])
			}
		} else {
			copy(full, s.ranks[0].params[r])
			for k := 1; k < N; k++ {
				if !Equal(s.ranks[k].params[r], s.ranks[0].params[r]) {
					return nil, fmt.Errorf("modeltest: rank %d's %s differs from rank 0's after the all-reduce", k, reg.Name)
				}
			}
		}
		out[r] = full[:reg.Size]
	}
	return out, nil
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
