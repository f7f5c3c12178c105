package model

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
)

// Model is the network's fixed structure: its Config and parameter Layout.
// It holds no parameters and no activations, so one Model is shared by all
// Workspaces and is safe for concurrent use.
type Model struct {
	cfg    Config
	layout *Layout
}

// New validates cfg and derives the layout.
func New(cfg Config) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Model{cfg: cfg, layout: newLayout(cfg)}, nil
}

// Config returns the configuration the model was built with.
func (m *Model) Config() Config { return m.cfg }

// Layout returns the parameter layout. Callers must not modify it.
func (m *Model) Layout() *Layout { return m.layout }

// NumRegions is Layers + 2: embedding, blocks, head.
func (m *Model) NumRegions() int { return len(m.layout.Regions) }

// EmbedRegion is the index of the embedding region (first in forward order).
func (m *Model) EmbedRegion() int { return 0 }

// BlockRegion is the region index of transformer block i ("layers.<i>").
func (m *Model) BlockRegion(i int) int { return 1 + i }

// HeadRegion is the index of the head region (last in forward order, first in
// backward order); its forward computes the loss.
func (m *Model) HeadRegion() int { return m.cfg.Layers + 1 }

// Init returns freshly initialised parameters, one exact-size buffer per
// region. See InitInto.
func (m *Model) Init() [][]float32 {
	bufs := m.layout.Alloc(1)
	_ = m.InitInto(bufs) // cannot fail: Alloc gives the right sizes
	return bufs
}

// InitInto writes the initial parameters into bufs (one buffer per region, at
// least Region.Size long; elements past Size are zeroed, so padded buffers
// for sharding are fine). The values depend only on Config.Seed, the sizes
// and each tensor's name — not on the order of initialisation or on the
// rank — so every rank computes the same bits.
//
// LayerNorm weights start at 1 and biases at 0; weight matrices and
// embeddings are uniform with standard deviation InitStd, the attention and
// MLP output projections scaled by 1/sqrt(2·Layers).
func (m *Model) InitInto(bufs [][]float32) error {
	if len(bufs) != len(m.layout.Regions) {
		return fmt.Errorf("%w: %d buffers for %d regions", ErrBufferSize, len(bufs), len(m.layout.Regions))
	}
	for i, r := range m.layout.Regions {
		if len(bufs[i]) < r.Size {
			return fmt.Errorf("%w: region %s buffer has %d elements, want at least %d", ErrBufferSize, r.Name, len(bufs[i]), r.Size)
		}
	}
	for i, r := range m.layout.Regions {
		buf := bufs[i]
		zero(buf[r.Size:])
		for _, t := range r.Tensors {
			x := buf[t.Offset : t.Offset+t.Len]
			switch {
			case strings.HasSuffix(t.Name, "ln1.weight"), strings.HasSuffix(t.Name, "ln2.weight"), t.Name == "head.ln.weight":
				for j := range x {
					x[j] = 1
				}
			case strings.HasSuffix(t.Name, ".bias"):
				zero(x)
			default:
				std := float64(m.cfg.InitStd)
				if strings.HasSuffix(t.Name, "attn.proj.weight") || strings.HasSuffix(t.Name, "mlp.fc2.weight") {
					std /= math.Sqrt(2 * float64(max(m.cfg.Layers, 1)))
				}
				h := fnv.New64a()
				h.Write([]byte(t.Name))
				rng := newRNG(m.cfg.Seed ^ h.Sum64())
				a := std * math.Sqrt(3) // uniform on [-a, a] has standard deviation std
				for j := range x {
					x[j] = float32(a * rng.sym())
				}
			}
		}
	}
	return nil
}

// InitShards returns shard k of n of every region's initial parameters
// (ShardSize(n) elements each, zero padding included): what rank k of n
// starts with in sharded mode.
func (m *Model) InitShards(n, k int) ([][]float32, error) {
	if n < 1 || k < 0 || k >= n {
		return nil, fmt.Errorf("%w: shard %d of %d", ErrShard, k, n)
	}
	full := m.layout.Alloc(n)
	if err := m.InitInto(full); err != nil {
		return nil, err
	}
	out := make([][]float32, len(full))
	for r, reg := range m.layout.Regions {
		s, err := reg.Shard(full[r], n, k)
		if err != nil {
			return nil, err
		}
		out[r] = append([]float32(nil), s...)
	}
	return out, nil
}

// String describes the model in one line, for a trainer's start-up log.
func (m *Model) String() string {
	c := m.cfg
	return fmt.Sprintf("transformer: %d layers, dim %d, %d heads, mlp %d (%s), vocab %d, context %d, %d parameters in %d regions",
		c.Layers, c.Dim, c.Heads, c.Hidden, c.Activation, c.Vocab, c.SeqLen, m.layout.Size(), len(m.layout.Regions))
}

// Fingerprint hashes the exact bits of the buffers in order (FNV-1a), so
// runs and ranks can compare parameters or gradients by printing one number.
// Two buffers that differ in any bit, +0 against −0 included, almost surely
// give different fingerprints.
func Fingerprint(bufs ...[]float32) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for _, b := range bufs {
		for _, v := range b {
			u := math.Float32bits(v)
			for i := 0; i < 4; i++ {
				h ^= uint64(byte(u >> (8 * i)))
				h *= prime
			}
		}
		// Separate buffers so that moving an element across a boundary
		// changes the hash.
		h ^= 0xff
		h *= prime
	}
	return h
}

// Workspace holds one rank's activations for a local batch of a fixed number
// of samples, and runs forward and backward on them one region at a time.
//
// A step is: SetBatch; Forward of every region in order (0 … HeadRegion),
// for all samples or for sample ranges (chunks) in any order that respects
// the region order per sample; then Backward of every region in reverse
// order. Forward of the head computes the per-sample losses (LossSum).
// Calls out of this order return ErrOrder.
//
// Not safe for concurrent use (though Forward and Backward may use several
// goroutines internally, see SetWorkers). Memory is allocated once in
// NewWorkspace, except the pairwise-tree buffers, allocated on first use.
type Workspace struct {
	m *Model
	w *work[float32]
}

// NewWorkspace returns a workspace for local batches of n samples. For the
// bitwise rank-count independence, n should be a power of two and the rank's
// samples a contiguous, aligned slice of the global batch (SampleRange).
func (m *Model) NewWorkspace(n int) (*Workspace, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: workspace of %d samples", ErrSampleRange, n)
	}
	// Refuse sizes whose activation buffers could not be allocated (or whose
	// lengths would overflow) with an error rather than a makeslice panic.
	c := m.cfg
	perSample := int64(c.SeqLen) * (int64(c.Layers+2)*int64(8*c.Dim+2*c.Hidden) + int64(c.Heads)*int64(c.SeqLen)*int64(c.Layers) + int64(c.Vocab))
	if int64(n) > (1<<40)/max(perSample, 1) {
		return nil, fmt.Errorf("%w: a workspace of %d samples needs about %d GiB of activations",
			ErrSampleRange, n, int64(n)*perSample*4>>30)
	}
	return &Workspace{m: m, w: newWork[float32](m.cfg, m.layout, n)}, nil
}

// SetWorkers lets Forward and Backward use up to k goroutines (k < 1 means
// 1, the default), each on its own samples, started and waited for within the
// call. The results are bitwise the same for every k: samples are computed by
// the same code wherever they run, and Backward splits its range only into
// nodes of the pairwise tree. Use it when a rank has cores to itself (one
// rank on a multi-core host); with a rank per core it only adds contention.
func (ws *Workspace) SetWorkers(k int) { ws.w.setWorkers(k) }

// Model returns the model the workspace was made for.
func (ws *Workspace) Model() *Model { return ws.m }

// Samples is the number of samples the workspace holds.
func (ws *Workspace) Samples() int { return ws.w.n }

// SetBatch loads the local batch: inputs and targets are [Samples, SeqLen]
// token ids, row-major. It starts a new step: every region must run forward
// again.
func (ws *Workspace) SetBatch(inputs, targets []int32) error {
	return ws.w.setBatch(inputs, targets)
}

// Forward runs region r forward for samples [lo, hi) with the given
// parameters (at least Region.Size elements; padding is ignored). Region r−1
// must have run forward for those samples. The parameters are read only
// during the call, so a gathered buffer may be freed or reused afterwards;
// backward needs the same values again.
//
// Running a region once over [lo, hi) or once per sub-range (chunking along
// the batch) gives identical bits.
func (ws *Workspace) Forward(r int, params []float32, lo, hi int) error {
	return ws.w.forward(r, params, lo, hi)
}

// Backward runs region r backward for samples [lo, hi) and writes into grad
// the sum of the per-sample gradients of r's parameters, added by the
// pairwise tree over sample index: the partial sum at the tree node [lo, hi).
// [lo, hi) must be a node of that tree — its length a power of two and lo a
// multiple of it — or the whole workspace [0, Samples()), which may have any
// size (rank-count independence needs powers of two; a single rank does not).
// grad needs at least Region.Size elements; the rest (shard padding) is set
// to zero. It is overwritten, not accumulated into.
//
// Region r+1 (or, for the head, the forward pass) must be done for the same
// samples. The gradient is final when Backward returns, so the caller may
// start its collective right away while Backward of r−1 runs.
//
// The sum is not divided by anything: per-sample losses are means over
// positions, and the caller divides by the global batch size after the
// cross-rank levels of the tree ([Mean]).
func (ws *Workspace) Backward(r int, params, grad []float32, lo, hi int) error {
	return ws.w.backward(r, params, grad, lo, hi)
}

// LossSum returns the sum of the per-sample losses of [lo, hi) by the same
// pairwise tree as the gradients (same range rules as Backward). Divide the
// global sum by the global batch size for the mean loss.
func (ws *Workspace) LossSum(lo, hi int) (float32, error) {
	return ws.w.lossSum(lo, hi)
}

// Step runs a whole local step without overlap: forward of every region for
// all samples, then backward in reverse order, writing each region's local
// gradient partial sum into grads (as Layout.Alloc returns). It returns the
// local loss sum. It is what a trainer does with communication turned off,
// and the reference the overlapped paths must match.
func (ws *Workspace) Step(params, grads [][]float32) (float32, error) {
	R := len(ws.m.layout.Regions)
	if len(params) != R || len(grads) != R {
		return 0, fmt.Errorf("%w: %d parameter and %d gradient buffers for %d regions", ErrBufferSize, len(params), len(grads), R)
	}
	n := ws.w.n
	for r := 0; r < R; r++ {
		if err := ws.Forward(r, params[r], 0, n); err != nil {
			return 0, err
		}
	}
	for r := R - 1; r >= 0; r-- {
		if err := ws.Backward(r, params[r], grads[r], 0, n); err != nil {
			return 0, err
		}
	}
	return ws.LossSum(0, n)
}

// FLOPs estimates the floating-point operations of one sample through region
// r, forward and backward (multiply and add counted separately; backward of a
// linear layer is twice its forward). It is meant for step-graph cost
// estimates, not for accounting.
func (m *Model) FLOPs(r int) (forward, backward int64) {
	T, D, Hd, V := int64(m.cfg.SeqLen), int64(m.cfg.Dim), int64(m.cfg.Hidden), int64(m.cfg.Vocab)
	switch {
	case r == 0:
		return T * D, T * D
	case r >= 1 && r <= m.cfg.Layers:
		lin := 2 * T * (3*D*D + D*D + 2*D*Hd)
		att := 2 * T * (T + 1) * D // scores and weighted sum, causal half
		return lin + att, 2*lin + 2*att
	case r == m.cfg.Layers+1:
		lin := 2 * T * D * V
		return lin, 2 * lin
	}
	return 0, 0
}
