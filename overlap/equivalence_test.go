package overlap

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// Equivalence of every pass, proven by executing graphs: a step graph and
// the pass's output run through GraphRunner on 1, 2 and 4 in-process ranks
// with the same random inputs, and every tensor both graphs produce must be
// bitwise equal.
//
// The compute is an interpreter that gives each node a meaning compatible
// with chunking (stepgraph's contract): a Batch tensor is rows of eqWidth
// elements and compute maps it row by row, so running a node on each half
// of the rows and concatenating equals running it once; a Partial output is
// a sum over rows, so the two chunks' partial sums add up to the whole.
// Values are small integers, so every sum is exact in float32 whatever its
// order: equality is bitwise, not approximate.

const (
	eqWidth = 4 // elements per row of a Batch tensor
	eqRows  = 8 // rows of the batch per rank
)

// eqStep describes a transformer-shaped step of blocks blocks: "dp"
// (gradient all-reduce per parameter, two per block), "fsdp" (parameter
// all-gather prefetched one block ahead, gradient reduce-scatter) or
// "hsdp" (fsdp on a shard group of 2, the reduced shard all-reduced on a
// replica group of n/2: a collective reading another's output). It is
// built as the step runs: tensors, forward, backward, optimizer.
func eqStep(mode string, n, blocks int) *stepgraph.Graph {
	e := &eqBuilder{b: stepgraph.NewBuilder(), mode: mode, blocks: blocks, shard: n, dataGroup: "dp", pB: 8 * 4}
	switch mode {
	case "dp", "fsdp":
		e.b.Group("dp", n)
	case "hsdp":
		e.shard, e.dataGroup = 2, "shard"
		e.b.Group("shard", 2).Group("replica", n/2)
	}
	e.tensors()
	e.forward()
	e.backward()
	e.optimizer()
	g, err := e.b.Graph()
	if err != nil {
		panic(err)
	}
	for i := range g.Nodes {
		if g.Nodes[i].Kind == stepgraph.Wait && g.Nodes[i].Region == "" {
			g.Nodes[i].Dir = buckets.Optimizer
		}
	}
	for i := range g.Tensors {
		if g.Tensors[i].Name == "x" {
			g.Tensors[i].Chunk = stepgraph.Batch
		}
	}
	return g
}

// eqBuilder is eqStep's state while it builds.
type eqBuilder struct {
	b         *stepgraph.Builder
	mode      string
	blocks    int
	shard     int    // ranks a parameter is sharded over (n for fsdp)
	dataGroup string // the group the batch is split over
	pB        int64  // a parameter's bytes: 8 floats
}

// eqRegion is block k's region.
func eqRegion(k int) string { return fmt.Sprintf("layers.%d", k) }

// tensors declares the inputs (the batch, each block's two parameters or
// their shards) and every tensor the step writes.
func (e *eqBuilder) tensors() {
	b, pB := e.b, e.pB
	rowB := int64(eqRows * eqWidth * 4)
	b.Input("x", rowB)
	if e.mode == "dp" {
		for k := range e.blocks {
			b.Input(fmt.Sprintf("w%d.a", k), pB).Input(fmt.Sprintf("w%d.b", k), pB)
		}
	} else {
		for k := range e.blocks {
			b.Input(fmt.Sprintf("w%d.a.shard", k), pB/int64(e.shard)).Input(fmt.Sprintf("w%d.b.shard", k), pB/int64(e.shard))
		}
	}
	for k := range e.blocks {
		b.Tensor(fmt.Sprintf("a%d", k), rowB, stepgraph.Batch).Tensor(fmt.Sprintf("d%d", k), rowB, stepgraph.Batch)
		b.Tensor(fmt.Sprintf("u%d", k), pB, stepgraph.Batch)
		b.Tensor(fmt.Sprintf("g%d.a", k), pB, stepgraph.Partial).Tensor(fmt.Sprintf("g%d.b", k), pB, stepgraph.Partial)
	}
	b.Tensor("loss.local", 4, stepgraph.Partial)
}

// gather starts the all-gathers of block k's parameters in region at.
func (e *eqBuilder) gather(k int, at string) {
	for _, p := range []string{"a", "b"} {
		e.b.Start(fmt.Sprintf("ag%d.%s", k, p), buckets.Forward, at, buckets.AllGather, e.dataGroup, "f32",
			[]stepgraph.Member{{In: fmt.Sprintf("w%d.%s.shard", k, p), Out: fmt.Sprintf("W%d.%s", k, p), Bytes: e.pB / int64(e.shard)}})
	}
}

// param names block k's two parameters as compute reads them.
func (e *eqBuilder) param(k int) []string {
	if e.mode == "dp" {
		return []string{fmt.Sprintf("w%d.a", k), fmt.Sprintf("w%d.b", k)}
	}
	return []string{fmt.Sprintf("W%d.a", k), fmt.Sprintf("W%d.b", k)}
}

// forward is the blocks in order (sharded parameters gathered one block
// ahead), then the loss and its all-reduce.
func (e *eqBuilder) forward() {
	b, blocks := e.b, e.blocks
	for k := range blocks {
		if e.mode != "dp" {
			if k == 0 {
				e.gather(0, eqRegion(0))
			}
			if k+1 < blocks {
				e.gather(k+1, eqRegion(k))
			}
			b.Wait(fmt.Sprintf("ag%d.a.w", k), fmt.Sprintf("ag%d.a", k), eqRegion(k))
			b.Wait(fmt.Sprintf("ag%d.b.w", k), fmt.Sprintf("ag%d.b", k), eqRegion(k))
		}
		in := "x"
		if k > 0 {
			in = fmt.Sprintf("a%d", k-1)
		}
		b.Compute(fmt.Sprintf("f%d", k), buckets.Forward, eqRegion(k), 100*time.Microsecond, append([]string{in}, e.param(k)...), []string{fmt.Sprintf("a%d", k)})
	}
	last := eqRegion(blocks - 1)
	b.Compute("loss", buckets.Forward, last, 10*time.Microsecond, []string{fmt.Sprintf("a%d", blocks-1)}, []string{"loss.local"})
	b.Start("ar.loss", buckets.Forward, last, buckets.AllReduce, e.dataGroup, "f32", []stepgraph.Member{{In: "loss.local", Out: "loss", Bytes: 4}})
}

// backward is the blocks in reverse, each starting its gradients'
// all-reduce (dp) or reduce-scatter.
func (e *eqBuilder) backward() {
	b, blocks, pB := e.b, e.blocks, e.pB
	for k := blocks - 1; k >= 0; k-- {
		in := fmt.Sprintf("a%d", blocks-1)
		if k < blocks-1 {
			in = fmt.Sprintf("d%d", k+1)
		}
		writes := []string{fmt.Sprintf("g%d.a", k), fmt.Sprintf("g%d.b", k)}
		b.Compute(fmt.Sprintf("b%d", k), buckets.Backward, eqRegion(k), 200*time.Microsecond, append([]string{in}, e.param(k)...), append(writes, fmt.Sprintf("d%d", k)))
		switch e.mode {
		case "dp":
			for _, p := range []string{"a", "b"} {
				b.Start(fmt.Sprintf("ar%d.%s", k, p), buckets.Backward, eqRegion(k), buckets.AllReduce, "dp", "f32",
					[]stepgraph.Member{{In: fmt.Sprintf("g%d.%s", k, p), Out: fmt.Sprintf("G%d.%s", k, p), Bytes: pB}})
			}
		default:
			for _, p := range []string{"a", "b"} {
				b.Start(fmt.Sprintf("rs%d.%s", k, p), buckets.Backward, eqRegion(k), buckets.ReduceScatter, e.dataGroup, "f32",
					[]stepgraph.Member{{In: fmt.Sprintf("g%d.%s", k, p), Out: fmt.Sprintf("gs%d.%s", k, p), Bytes: pB}})
			}
		}
	}
}

// optimizer waits for each block's reduced gradients (hsdp: reduced
// again on the replica group first) and updates it, then waits for the
// loss.
func (e *eqBuilder) optimizer() {
	b, pB := e.b, e.pB
	for k := e.blocks - 1; k >= 0; k-- {
		var reads []string
		switch e.mode {
		case "dp":
			for _, p := range []string{"a", "b"} {
				b.Wait(fmt.Sprintf("ar%d.%s.w", k, p), fmt.Sprintf("ar%d.%s", k, p), "")
				reads = append(reads, fmt.Sprintf("G%d.%s", k, p))
			}
		case "fsdp":
			for _, p := range []string{"a", "b"} {
				b.Wait(fmt.Sprintf("rs%d.%s.w", k, p), fmt.Sprintf("rs%d.%s", k, p), "")
				reads = append(reads, fmt.Sprintf("gs%d.%s", k, p))
			}
		case "hsdp":
			for _, p := range []string{"a", "b"} {
				b.Wait(fmt.Sprintf("rs%d.%s.w", k, p), fmt.Sprintf("rs%d.%s", k, p), "")
				b.Start(fmt.Sprintf("rar%d.%s", k, p), buckets.Optimizer, "", buckets.AllReduce, "replica", "f32",
					[]stepgraph.Member{{In: fmt.Sprintf("gs%d.%s", k, p), Out: fmt.Sprintf("G%d.%s", k, p), Bytes: pB / 2}})
			}
			for _, p := range []string{"a", "b"} {
				b.Wait(fmt.Sprintf("rar%d.%s.w", k, p), fmt.Sprintf("rar%d.%s", k, p), "")
				reads = append(reads, fmt.Sprintf("G%d.%s", k, p))
			}
		}
		b.Compute(fmt.Sprintf("opt%d", k), buckets.Optimizer, "", 10*time.Microsecond, reads, []string{fmt.Sprintf("u%d", k)})
	}
	b.Wait("ar.loss.w", "ar.loss", "")
}

// eqRank is one rank's memory for one run: every tensor the graph names,
// sized from the graph, inputs filled from the rank's random stream.
type eqRank struct {
	g    *stepgraph.Graph
	bufs map[string][]float32
	mode map[string]stepgraph.ChunkMode
	// made: tensors the graph produces (inputs, compute and collective
	// outputs); a declaration alone makes nothing.
	made map[string]bool
}

func newEqRank(g *stepgraph.Graph, comms map[string]Comm, seed uint64) *eqRank {
	r := &eqRank{g: g, bufs: map[string][]float32{}, mode: map[string]stepgraph.ChunkMode{}, made: map[string]bool{}}
	for _, t := range g.Tensors {
		r.made[t.Name] = t.Input
	}
	for _, n := range g.Nodes {
		for _, w := range n.Writes {
			r.made[w] = true
		}
		for _, m := range n.Members {
			r.made[m.Out] = true
		}
	}
	size := map[string]int64{}
	for _, t := range g.Tensors {
		size[t.Name] = t.Bytes
		r.mode[t.Name] = t.Chunk
	}
	for _, n := range g.Nodes {
		if n.Kind == stepgraph.Start {
			for _, m := range n.Members {
				size[m.Out] = outputBytes(n.Op, m.Bytes, int64(comms[n.Group].Size()))
				if _, ok := size[m.In]; !ok {
					size[m.In] = m.Bytes
				}
			}
		}
	}
	// Outputs of the builtins that chunking inserts (a recombined collective
	// output is declared nowhere): a sum has its operands' size, a concat
	// their total.
	for _, n := range g.Nodes {
		if n.Kind != stepgraph.Compute || n.Builtin == "" {
			continue
		}
		for _, w := range n.Writes {
			if _, ok := size[w]; ok {
				continue
			}
			var b int64
			for _, rd := range n.Reads {
				if n.Builtin == stepgraph.Sum {
					b = size[rd]
				} else {
					b += size[rd]
				}
			}
			size[w] = b
		}
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	// Inputs in a fixed (sorted) order, so every run of a rank draws the
	// same values for the same names whatever the graph's layout.
	var inputs []string
	for _, t := range g.Tensors {
		if t.Input {
			inputs = append(inputs, t.Name)
		}
	}
	slices.Sort(inputs)
	for name, b := range size {
		r.bufs[name] = make([]float32, b/4)
	}
	for _, name := range inputs {
		for i := range r.bufs[name] {
			r.bufs[name][i] = float32(rng.IntN(4))
		}
	}
	return r
}

func (r *eqRank) tensor(name string) (comm.Buffer, error) {
	b, ok := r.bufs[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %q", name)
	}
	return comm.Float32s(b), nil
}

// base strips the chunk suffix: T#1 → T.
func base(name string) string {
	if i := strings.IndexByte(name, '#'); i >= 0 {
		return name[:i]
	}
	return name
}

// modeOf is a tensor's chunk mode as the interpreter sees it: declared on
// the tensor or on its unchunked name.
func (r *eqRank) modeOf(name string) stepgraph.ChunkMode {
	if m := r.mode[name]; m != "" {
		return m
	}
	return r.mode[base(name)]
}

// kernel interprets a compute node (see the top of the file). The author's
// node name seeds its constant, so a node's chunks compute what it would.
func (r *eqRank) kernel(_ context.Context, n *stepgraph.Node) error {
	author := n.Name
	if n.Chunk != nil {
		author = n.Chunk.Of
	}
	h := fnv.New32a()
	h.Write([]byte(author))
	c := float32(h.Sum32() % 3)
	// Row sums of the batch reads, and the replicated reads' values.
	var rows [][]float32
	var repl []float32
	for _, t := range n.Reads {
		v := r.bufs[t]
		switch r.modeOf(t) {
		case stepgraph.Batch:
			if rows == nil || len(v)/eqWidth < len(rows) {
				rows = make([][]float32, len(v)/eqWidth)
				for i := range rows {
					rows[i] = make([]float32, eqWidth)
				}
			}
			for i := range rows {
				for j := range eqWidth {
					rows[i][j] += v[i*eqWidth+j]
				}
			}
		default:
			repl = append(repl, v...)
		}
	}
	p := func(j int) float32 {
		if len(repl) == 0 {
			return 0
		}
		return float32(int(repl[j%len(repl)]) % 3)
	}
	for _, w := range n.Writes {
		out := r.bufs[w]
		switch r.modeOf(w) {
		case stepgraph.Partial:
			// A sum over this node's rows: chunks add up to the whole.
			for j := range out {
				var s float32
				for _, row := range rows {
					s += row[j%eqWidth]
				}
				out[j] = s * (1 + p(j))
			}
		default:
			// Row by row, kept small so sums stay exact.
			for i := range len(out) / eqWidth {
				for j := range eqWidth {
					v := c + p(j)
					if i < len(rows) {
						v += rows[i][j]
					}
					out[i*eqWidth+j] = float32(math.Mod(float64(v), 61))
				}
			}
		}
	}
	return nil
}

// eqComms connects n in-memory ranks with one communicator per group of g
// (groups of g.Groups sized 1, 2 or n: world, or consecutive pairs and
// strided replicas for "shard" and "replica").
func eqComms(ctx context.Context, t *testing.T, g *stepgraph.Graph, n int) []map[string]Comm {
	t.Helper()
	nw := commtest.NewNetwork()
	addrs := make([]string, n)
	eps := make([]comm.Transport, n)
	for r := range n {
		addrs[r] = fmt.Sprintf("r%d:1", r)
		eps[r] = nw.Endpoint(addrs[r])
	}
	members := func(group string, r int) []int {
		switch group {
		case "shard":
			return []int{r &^ 1, r | 1}
		case "replica":
			var out []int
			for q := r & 1; q < n; q += 2 {
				out = append(out, q)
			}
			return out
		}
		out := make([]int, n)
		for q := range n {
			out[q] = q
		}
		return out
	}
	out := make([]map[string]Comm, n)
	errs := make([]error, n)
	var mu sync.Mutex
	var all []*comm.Comm
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			out[r] = map[string]Comm{}
			for _, gr := range g.Groups {
				ms := members(gr.Name, r)
				as := make([]string, len(ms))
				for i, q := range ms {
					as[i] = addrs[q]
				}
				cfg := comm.LocalConfig()
				cfg.Tag, cfg.Deterministic = gr.Name, true
				c, err := comm.New(ctx, comm.NewStaticGroup(slices.Index(ms, r), as, nil), eps[r], cfg)
				if err != nil {
					errs[r] = err
					return
				}
				mu.Lock()
				all = append(all, c)
				mu.Unlock()
				out[r][gr.Name] = c
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range all {
			wg.Go(func() { _ = c.Close() })
		}
		wg.Wait()
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// runEq runs g for two steps on n ranks and returns every rank's tensors.
func runEq(t *testing.T, g *stepgraph.Graph, n int, mode Mode) []map[string][]float32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms := eqComms(ctx, t, g, n)
	out := make([]map[string][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cfg := DefaultConfig()
			cfg.Mode = mode
			gr, err := NewGraphRunner(g, comms[r], cfg)
			if err != nil {
				errs[r] = err
				return
			}
			defer gr.Close()
			er := newEqRank(g, comms[r], uint64(r+1))
			for step := 1; step <= 2; step++ {
				if _, err := gr.Step(ctx, step, er.tensor, er.kernel); err != nil {
					errs[r] = err
					for _, c := range comms[r] {
						c.(*comm.Comm).Abort(err)
					}
					return
				}
			}
			out[r] = map[string][]float32{}
			for name, b := range er.bufs {
				if er.made[name] {
					out[r][name] = b
				}
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// TestPassEquivalence runs each pass's input and output through the graph
// runner and compares every tensor they share, bitwise, on every rank.
func TestPassEquivalence(t *testing.T) {
	model := buckets.Model{Latency: 10 * time.Microsecond, BusBandwidth: 1e9}
	cfg := buckets.Config{Model: model, CapBytes: 64}
	type pass struct {
		name  string
		modes []string // step kinds it applies to
		run   func(*stepgraph.Graph) (*stepgraph.Graph, error)
	}
	chunk := func(accumulate bool) func(*stepgraph.Graph) (*stepgraph.Graph, error) {
		return func(g *stepgraph.Graph) (*stepgraph.Graph, error) {
			out, _, err := stepgraph.ChunkWith(g, stepgraph.ChunkConfig{Pattern: "layers.*", Model: model, Accumulate: accumulate, Always: true})
			return out, err
		}
	}
	passes := []pass{
		{"blocks", []string{"dp", "fsdp", "hsdp"}, func(g *stepgraph.Graph) (*stepgraph.Graph, error) { return stepgraph.BucketBlocks(g, cfg) }},
		{"overlap", []string{"dp", "fsdp", "hsdp"}, func(g *stepgraph.Graph) (*stepgraph.Graph, error) { return stepgraph.BucketOverlap(g, cfg) }},
		{"reshard", []string{"fsdp", "hsdp"}, func(g *stepgraph.Graph) (*stepgraph.Graph, error) {
			out, _, err := stepgraph.Reshard(g, model)
			return out, err
		}},
		{"chunk-per-chunk", []string{"dp", "fsdp", "hsdp"}, chunk(false)},
		{"chunk-accumulate", []string{"dp", "fsdp", "hsdp"}, chunk(true)},
	}
	for _, n := range []int{1, 2, 4} {
		for _, kind := range []string{"dp", "fsdp", "hsdp"} {
			if kind == "hsdp" && n != 4 {
				continue
			}
			g := eqStep(kind, n, 3)
			want := runEq(t, g, n, Native)
			for _, p := range passes {
				if !slices.Contains(p.modes, kind) {
					continue
				}
				t.Run(fmt.Sprintf("np%d/%s/%s", n, kind, p.name), func(t *testing.T) {
					out, err := p.run(g)
					if err != nil {
						t.Fatal(err)
					}
					if stepgraph.Format(out) == stepgraph.Format(g) {
						t.Skipf("%s leaves this step as it is (its guard refused every change): nothing to compare", p.name)
					}
					got := runEq(t, out, n, Native)
					compared := 0
					for r := range n {
						for name, w := range want[r] {
							v, ok := got[r][name]
							if !ok {
								continue // e.g. an activation that now exists only per chunk
							}
							compared++
							for i := range w {
								if math.Float32bits(v[i]) != math.Float32bits(w[i]) {
									t.Fatalf("rank %d: tensor %q[%d] = %v after %s, %v before", r, name, i, v[i], p.name, w[i])
								}
							}
						}
						// The step's results must all be there to compare.
						for k := range 3 {
							if _, ok := got[r][fmt.Sprintf("u%d", k)]; !ok {
								t.Fatalf("rank %d: result u%d missing after %s", r, k, p.name)
							}
						}
						if _, ok := got[r]["loss"]; !ok {
							t.Fatalf("rank %d: loss missing after %s", r, p.name)
						}
					}
					if compared < 10 {
						t.Fatalf("only %d tensors compared", compared)
					}
				})
			}
		}
	}
}

// moeStep is an expert-parallel block: tokens routed, dispatched by
// all_to_all, run through the expert, combined by a second all_to_all
// (stepgraph's chunking example). The expert is row-wise and the same on
// every rank, so the block's output does not depend on which rank a token
// visits: chunking it, which changes that, must not change the output.
func moeStep(n int) *stepgraph.Graph {
	rowB := int64(eqRows * eqWidth * 4)
	b := stepgraph.NewBuilder().Group("ep", n).Region("layers.0").Region("layers.1")
	b.Input("x", rowB)
	for _, t := range []string{"h", "tok", "tokx", "y", "yx", "out", "z"} {
		b.Tensor(t, rowB, stepgraph.Batch)
	}
	b.Compute("attn", buckets.Forward, "layers.0.attn", 100*time.Microsecond, []string{"x"}, []string{"h"})
	b.Compute("route", buckets.Forward, "layers.0.moe", 20*time.Microsecond, []string{"h"}, []string{"tok"})
	b.Start("disp", buckets.Forward, "layers.0.moe", buckets.AllToAll, "ep", "f32", []stepgraph.Member{{In: "tok", Out: "tokx", Bytes: rowB}})
	b.Wait("disp.w", "disp", "")
	b.Compute("expert", buckets.Forward, "layers.0.moe", 100*time.Microsecond, []string{"tokx"}, []string{"y"})
	b.Start("comb", buckets.Forward, "layers.0.moe", buckets.AllToAll, "ep", "f32", []stepgraph.Member{{In: "y", Out: "yx", Bytes: rowB}})
	b.Wait("comb.w", "comb", "")
	b.Compute("mix", buckets.Forward, "layers.0.moe", 10*time.Microsecond, []string{"yx", "h"}, []string{"out"})
	b.Compute("next", buckets.Forward, "layers.1", 100*time.Microsecond, []string{"out"}, []string{"z"})
	g, err := b.Graph()
	if err != nil {
		panic(err)
	}
	for i := range g.Tensors {
		if g.Tensors[i].Name == "x" {
			g.Tensors[i].Chunk = stepgraph.Batch
		}
	}
	return g
}

// TestMoEChunking runs the expert-parallel block whole and chunked (its
// all_to_alls per chunk, and, after block bucketing, both chunks' dispatches
// fused into one all_to_all) on 1, 2 and 4 ranks: the output is the same,
// bit for bit.
func TestMoEChunking(t *testing.T) {
	model := buckets.Model{Latency: 10 * time.Microsecond, BusBandwidth: 1e9}
	for _, n := range []int{1, 2, 4} {
		g := moeStep(n)
		chunked, _, err := stepgraph.ChunkWith(g, stepgraph.ChunkConfig{Pattern: "layers.*.moe", Model: model, Always: true})
		if err != nil {
			t.Fatal(err)
		}
		fused, err := stepgraph.BucketBlocks(chunked, buckets.Config{Model: buckets.Model{Latency: time.Second, BusBandwidth: 1e9}})
		if err != nil {
			t.Fatal(err)
		}
		want := runEq(t, g, n, Native)
		for _, tc := range []struct {
			name string
			g    *stepgraph.Graph
		}{{"chunked", chunked}, {"chunked+fused", fused}} {
			t.Run(fmt.Sprintf("np%d/%s", n, tc.name), func(t *testing.T) {
				a2a := 0
				for _, nd := range tc.g.Nodes {
					if nd.Kind == stepgraph.Start && nd.Op == buckets.AllToAll {
						a2a++
					}
				}
				if tc.name == "chunked" && a2a != 4 {
					t.Fatalf("%d all_to_alls after chunking, want 4 (two per chunk)", a2a)
				}
				got := runEq(t, tc.g, n, Native)
				// The dispatch really exchanges: block p of rank r's
				// received tokens is block r of rank p's sent ones, for the
				// whole block and each chunk's.
				checked := 0
				for _, res := range [][]map[string][]float32{want, got} {
					for _, suffix := range []string{"", "#0", "#1"} {
						if _, ok := res[0]["tokx"+suffix]; !ok {
							continue
						}
						checked++
						for r := range n {
							recv := res[r]["tokx"+suffix]
							blk := len(recv) / n
							for p := range n {
								sent := res[p]["tok"+suffix]
								if !slices.Equal(recv[p*blk:(p+1)*blk], sent[r*blk:(r+1)*blk]) {
									t.Fatalf("rank %d: tokx%s block %d is not rank %d's tok%s block %d", r, suffix, p, p, suffix, r)
								}
							}
						}
					}
				}
				if checked < 3 {
					t.Fatalf("checked the exchange of %d tensors, want 3", checked)
				}
				for r := range n {
					for _, name := range []string{"out", "z"} {
						w, v := want[r][name], got[r][name]
						if len(v) != len(w) || len(w) == 0 {
							t.Fatalf("rank %d: %q has %d elements, want %d", r, name, len(v), len(w))
						}
						for i := range w {
							if math.Float32bits(v[i]) != math.Float32bits(w[i]) {
								t.Fatalf("rank %d: %s[%d] = %v %s, %v whole", r, name, i, v[i], tc.name, w[i])
							}
						}
					}
				}
				t.Logf("%d all_to_all collectives", a2a)
			})
		}
	}
}
