package model

import "fmt"

// Tensor is one named parameter inside a region's flat buffer.
type Tensor struct {
	// Name is the full dotted name, e.g. "layers.3.attn.qkv.weight".
	Name string
	// Shape is row-major; linear weights are [out, in] as in PyTorch.
	Shape []int
	// Offset is the tensor's first element in its region's buffer.
	Offset int
	// Len is the product of Shape.
	Len int
}

// Region is one unit of forward/backward compute and of communication: the
// embedding, one transformer block, or the head. Its tensors are laid out
// back to back in one flat buffer of Size elements.
type Region struct {
	// Name is "embed", "layers.<i>" or "head"; tensor names start with it.
	Name string
	// Index is the region's position in forward order: 0 is the embedding,
	// 1+i is block i, Layers+1 is the head. Backward runs in reverse order.
	Index int
	// Tensors in buffer order.
	Tensors []Tensor
	// Size is the number of parameters (and gradient elements) in the region.
	Size int
}

// ShardSize is the length of each of n equal shards of the region: Size
// rounded up to a multiple of n, divided by n. n < 1 is treated as 1.
func (r Region) ShardSize(n int) int {
	if n < 1 {
		n = 1
	}
	return (r.Size + n - 1) / n
}

// PaddedSize is n × ShardSize(n): the length of a region buffer that splits
// into n equal shards. The padding elements hold zero parameters and receive
// zero gradients, so optimizers leave them at zero.
func (r Region) PaddedSize(n int) int {
	if n < 1 {
		n = 1
	}
	return r.ShardSize(n) * n
}

// Shard returns shard k of n of a padded region buffer (a view, not a copy).
// buf must have at least PaddedSize(n) elements.
func (r Region) Shard(buf []float32, n, k int) ([]float32, error) {
	if n < 1 || k < 0 || k >= n {
		return nil, fmt.Errorf("%w: shard %d of %d", ErrShard, k, n)
	}
	if len(buf) < r.PaddedSize(n) {
		return nil, fmt.Errorf("%w: region %s has %d elements, want at least %d for %d shards",
			ErrBufferSize, r.Name, len(buf), r.PaddedSize(n), n)
	}
	s := r.ShardSize(n)
	return buf[k*s : (k+1)*s : (k+1)*s], nil
}

// Layout is the fixed arrangement of all parameters of a model: which regions
// exist, in forward order, and where each tensor sits. It is a pure function
// of the Config, so every rank derives the same layout.
type Layout struct {
	// Regions in forward order (see Region.Index).
	Regions []Region
	byName  map[string][2]int // tensor name → region index, tensor index
}

// Region returns the region with the given name.
func (l *Layout) Region(name string) (Region, bool) {
	for _, r := range l.Regions {
		if r.Name == name {
			return r, true
		}
	}
	return Region{}, false
}

// Tensor returns the tensor with the given full name and its region index.
func (l *Layout) Tensor(name string) (Tensor, int, bool) {
	at, ok := l.byName[name]
	if !ok {
		return Tensor{}, 0, false
	}
	return l.Regions[at[0]].Tensors[at[1]], at[0], true
}

// Size is the total number of parameters (without padding).
func (l *Layout) Size() int {
	n := 0
	for _, r := range l.Regions {
		n += r.Size
	}
	return n
}

// Alloc returns one zeroed buffer per region, each of PaddedSize(shards)
// elements (shards = 1 gives exact sizes). Use it for gradients, gathered
// parameters and optimizer state.
func (l *Layout) Alloc(shards int) [][]float32 {
	bufs := make([][]float32, len(l.Regions))
	for i, r := range l.Regions {
		bufs[i] = make([]float32, r.PaddedSize(shards))
	}
	return bufs
}

// AllocShards returns one zeroed buffer per region of ShardSize(shards)
// elements: what one rank holds in sharded mode.
func (l *Layout) AllocShards(shards int) [][]float32 {
	bufs := make([][]float32, len(l.Regions))
	for i, r := range l.Regions {
		bufs[i] = make([]float32, r.ShardSize(shards))
	}
	return bufs
}

// Names of the tensors inside a block, relative to "layers.<i>.", in buffer
// order. The block kernels index the buffer through blockOffsets, which is
// built from the same list, so the two cannot disagree.
const (
	tLN1W = iota
	tLN1B
	tQKVW
	tQKVB
	tProjW
	tProjB
	tLN2W
	tLN2B
	tFC1W
	tFC1B
	tFC2W
	tFC2B
	numBlockTensors
)

// Tensors of the embedding and head regions, in buffer order.
const (
	tTok = iota
	tPos
)
const (
	tLNFW = iota
	tLNFB
	tOutW
	tOutB
)

func newLayout(c Config) *Layout {
	D, V, T, Hd := c.Dim, c.Vocab, c.SeqLen, c.Hidden
	type spec struct {
		name  string
		shape []int
	}
	l := &Layout{byName: map[string][2]int{}}
	add := func(name string, specs []spec) {
		r := Region{Name: name, Index: len(l.Regions)}
		for _, s := range specs {
			n := 1
			for _, d := range s.shape {
				n *= d
			}
			full := name + "." + s.name
			l.byName[full] = [2]int{r.Index, len(r.Tensors)}
			r.Tensors = append(r.Tensors, Tensor{Name: full, Shape: s.shape, Offset: r.Size, Len: n})
			r.Size += n
		}
		l.Regions = append(l.Regions, r)
	}
	add("embed", []spec{
		{"tok.weight", []int{V, D}},
		{"pos.weight", []int{T, D}},
	})
	for i := 0; i < c.Layers; i++ {
		add(fmt.Sprintf("layers.%d", i), []spec{
			tLN1W:  {"ln1.weight", []int{D}},
			tLN1B:  {"ln1.bias", []int{D}},
			tQKVW:  {"attn.qkv.weight", []int{3 * D, D}},
			tQKVB:  {"attn.qkv.bias", []int{3 * D}},
			tProjW: {"attn.proj.weight", []int{D, D}},
			tProjB: {"attn.proj.bias", []int{D}},
			tLN2W:  {"ln2.weight", []int{D}},
			tLN2B:  {"ln2.bias", []int{D}},
			tFC1W:  {"mlp.fc1.weight", []int{Hd, D}},
			tFC1B:  {"mlp.fc1.bias", []int{Hd}},
			tFC2W:  {"mlp.fc2.weight", []int{D, Hd}},
			tFC2B:  {"mlp.fc2.bias", []int{D}},
		})
	}
	add("head", []spec{
		tLNFW: {"ln.weight", []int{D}},
		tLNFB: {"ln.bias", []int{D}},
		tOutW: {"out.weight", []int{V, D}},
		tOutB: {"out.bias", []int{V}},
	})
	return l
}

// view returns tensor t of region r inside buf.
func view[F float](r *Region, buf []F, t int) []F {
	x := r.Tensors[t]
	return buf[x.Offset : x.Offset+x.Len : x.Offset+x.Len]
}
