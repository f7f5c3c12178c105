package stepgraph

import (
	"fmt"
	"slices"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// Op and Direction are the plan's vocabulary: a graph and the bucket plan
// extracted from it must not be able to disagree about them.
type (
	Op        = buckets.Op
	Direction = buckets.Direction
)

// Kind says what a node does.
type Kind string

// The three kinds of node.
const (
	Compute Kind = "compute"
	Start   Kind = "start"
	Wait    Kind = "wait"
)

// Builtin names the compute that passes insert and an executor runs itself
// (rather than calling back into the trainer). Empty for user compute.
type Builtin string

// Built-in compute inserted by Chunk. With batch-major layouts, Split and
// Concat can be views into one buffer; Sum adds partial results elementwise
// in chunk order (chunk 0 + chunk 1), which is the order a trainer must use
// for bitwise-equal results.
const (
	Split  Builtin = "split"  // reads T, writes T#0, T#1: halves along dim 0
	Concat Builtin = "concat" // reads T#0, T#1, writes T: concatenation along dim 0
	Sum    Builtin = "sum"    // reads T#0, T#1, writes T: elementwise sum
)

// ChunkMode says how a tensor behaves when the region producing or reading
// it is split into chunks along the batch dimension.
type ChunkMode string

// Chunk modes. The default (empty) is Batch for tensors written by compute,
// Replicated for inputs and collective outputs.
const (
	Batch      ChunkMode = "batch"      // split along dim 0, recombined by Concat
	Partial    ChunkMode = "partial"    // each chunk computes a partial sum (e.g. a weight gradient), recombined by Sum
	Replicated ChunkMode = "replicated" // the same for both chunks (e.g. a parameter)
)

// Group declares a process group the plan's collectives run on.
type Group struct {
	Name string `json:"name"`
	// Size is the number of ranks; the cost model needs it.
	Size int `json:"size"`
}

// Tensor declares a tensor's size and role. Tensors that are only written and
// read inside the step need no declaration; declaring their size makes the
// memory estimates of Reshard meaningful.
type Tensor struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes,omitempty"`
	// Input tensors exist before the step (parameters, the batch); nothing
	// in the step may write them.
	Input bool      `json:"input,omitempty"`
	Chunk ChunkMode `json:"chunk,omitempty"`
}

// Member is one tensor of a collective: the start reads In, the wait writes
// Out. After bucketing a start has several members, packed in this order
// into the fused buffer.
type Member struct {
	In  string `json:"in"`
	Out string `json:"out"`
	// Bytes of In, per rank (the shard for an all-gather).
	Bytes int64 `json:"bytes"`
	// From is the name of the start the member had in the graph the author
	// wrote; passes keep it, so the checker can follow a collective through
	// bucketing and chunking. Empty means the node's own name.
	From string `json:"from,omitempty"`
}

// ChunkRef marks a node as one chunk of an author's node.
type ChunkRef struct {
	Of    string `json:"of"`
	Index int    `json:"index"`
	Count int    `json:"count"`
}

// Node is one step of the plan. Which fields matter depends on Kind.
type Node struct {
	Name   string    `json:"name"`
	Kind   Kind      `json:"kind"`
	Dir    Direction `json:"direction,omitempty"`
	Region string    `json:"region,omitempty"`

	// Compute: estimated duration, tensors read and written.
	Cost    time.Duration `json:"cost_ns,omitempty"`
	Reads   []string      `json:"reads,omitempty"`
	Writes  []string      `json:"writes,omitempty"`
	Builtin Builtin       `json:"builtin,omitempty"`
	// Chunk is set on compute that Chunk made from an author's node: the
	// executor runs the author's callback for Of on chunk Index of Count.
	Chunk *ChunkRef `json:"chunk,omitempty"`

	// Start: the collective.
	Op      Op       `json:"op,omitempty"`
	Group   string   `json:"group,omitempty"`
	DType   string   `json:"dtype,omitempty"`
	Members []Member `json:"members,omitempty"`
	// HiddenBy names compute the author knows hides this collective: it
	// must run after the start and before the wait.
	HiddenBy []string `json:"hidden_by,omitempty"`

	// Wait: the start it completes.
	Of string `json:"of,omitempty"`
}

// Bytes is the size of a start's fused input buffer: what the cost model
// charges and the cap bounds.
func (n *Node) Bytes() int64 {
	var b int64
	for _, m := range n.Members {
		b += m.Bytes
	}
	return b
}

// clone deep-copies the slices so a pass's output never aliases its input:
// passes are pure, and callers may keep and compare both graphs.
func (n *Node) clone() Node {
	c := *n
	c.Reads = slices.Clone(n.Reads)
	c.Writes = slices.Clone(n.Writes)
	c.Members = slices.Clone(n.Members)
	c.HiddenBy = slices.Clone(n.HiddenBy)
	if n.Chunk != nil {
		cr := *n.Chunk
		c.Chunk = &cr
	}
	return c
}

// Graph is one step: declarations and the nodes in plan order.
type Graph struct {
	Groups []Group `json:"groups"`
	// Regions lists the blocks in forward order; a forward or backward
	// collective must name one of them (or a path below one).
	Regions []string `json:"regions"`
	Tensors []Tensor `json:"tensors,omitempty"`
	Nodes   []Node   `json:"nodes"`
}

// Clone returns a deep copy; passes never modify their input.
func (g *Graph) Clone() *Graph {
	c := &Graph{
		Groups:  slices.Clone(g.Groups),
		Regions: slices.Clone(g.Regions),
		Tensors: slices.Clone(g.Tensors),
		Nodes:   make([]Node, len(g.Nodes)),
	}
	for i := range g.Nodes {
		c.Nodes[i] = g.Nodes[i].clone()
	}
	return c
}

// groupSize is a linear scan: graphs have a handful of groups.
func (g *Graph) groupSize(name string) int {
	for _, gr := range g.Groups {
		if gr.Name == name {
			return gr.Size
		}
	}
	return 0
}

func (g *Graph) tensor(name string) (Tensor, bool) {
	for _, t := range g.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// Builder assembles a graph in plan order; Graph validates the result, so a
// step can be described without checking every call.
type Builder struct {
	g Graph
}

// NewBuilder starts an empty graph.
func NewBuilder() *Builder { return &Builder{} }

// Group declares a process group of size ranks.
func (b *Builder) Group(name string, size int) *Builder {
	b.g.Groups = append(b.g.Groups, Group{Name: name, Size: size})
	return b
}

// Region declares the next block in forward order.
func (b *Builder) Region(path string) *Builder {
	if !slices.Contains(b.g.Regions, path) {
		b.g.Regions = append(b.g.Regions, path)
	}
	return b
}

// Input declares a tensor that exists before the step.
func (b *Builder) Input(name string, bytes int64) *Builder {
	b.g.Tensors = append(b.g.Tensors, Tensor{Name: name, Bytes: bytes, Input: true})
	return b
}

// Tensor declares the size and chunk mode of a tensor the step produces.
func (b *Builder) Tensor(name string, bytes int64, mode ChunkMode) *Builder {
	b.g.Tensors = append(b.g.Tensors, Tensor{Name: name, Bytes: bytes, Chunk: mode})
	return b
}

// Compute appends user compute. Its region is declared if it is new, so a
// step built in forward order declares its blocks in forward order.
func (b *Builder) Compute(name string, dir Direction, region string, cost time.Duration, reads, writes []string) *Builder {
	// Only forward compute declares blocks: forward order is block order,
	// and declaring from backward would list the blocks reversed.
	if region != "" && dir == buckets.Forward {
		b.Region(region)
	}
	b.g.Nodes = append(b.g.Nodes, Node{Name: name, Kind: Compute, Dir: dir, Region: region, Cost: cost, Reads: reads, Writes: writes})
	return b
}

// Start appends a collective start; hiddenBy may be nil.
func (b *Builder) Start(name string, dir Direction, region string, op Op, group, dtype string, members []Member, hiddenBy ...string) *Builder {
	b.g.Nodes = append(b.g.Nodes, Node{Name: name, Kind: Start, Dir: dir, Region: region, Op: op, Group: group, DType: dtype, Members: members, HiddenBy: hiddenBy})
	return b
}

// Wait appends the wait of start; it takes the start's direction, and
// region unless region is given.
func (b *Builder) Wait(name, start, region string) *Builder {
	var dir Direction
	// From the end: a wait usually follows its start closely.
	for i := len(b.g.Nodes) - 1; i >= 0; i-- {
		if n := &b.g.Nodes[i]; n.Name == start && n.Kind == Start {
			dir = n.Dir
			if region == "" {
				region = n.Region
			}
			break
		}
	}
	b.g.Nodes = append(b.g.Nodes, Node{Name: name, Kind: Wait, Dir: dir, Region: region, Of: start})
	return b
}

// Graph validates and returns the graph built so far.
func (b *Builder) Graph() (*Graph, error) {
	g := b.g.Clone()
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g, nil
}

func (k Kind) String() string { return string(k) }

func dirShort(d Direction) string {
	switch d {
	case buckets.Forward:
		return "fwd"
	case buckets.Backward:
		return "bwd"
	case buckets.Optimizer:
		return "opt"
	}
	return ""
}

func parseDir(s string) (Direction, error) {
	switch s {
	case "fwd", "forward":
		return buckets.Forward, nil
	case "bwd", "backward":
		return buckets.Backward, nil
	case "opt", "optimizer":
		return buckets.Optimizer, nil
	case "", "none":
		return buckets.None, nil
	}
	return "", fmt.Errorf("unknown direction %q", s)
}
