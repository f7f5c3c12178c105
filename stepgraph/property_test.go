package stepgraph

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// randomGraph builds a valid random step: blocks run forward in order and
// backward in reverse; each position either computes (reading tensors
// already available), starts a collective over available tensors (sometimes
// on a second group, sometimes hidden by the next compute by name), or waits
// for a pending collective. Every edge points forward in plan order, so the
// result is valid by construction; the passes must keep it so.
func randomGraph(r *rand.Rand, nodes int) *Graph {
	blocks := 1 + r.IntN(4)
	b := NewBuilder().Group("dp", 2+r.IntN(3)).Group("tp", 2)
	for k := range blocks {
		b.Region(fmt.Sprintf("layers.%d", k))
	}
	b.Input("x", 4096)
	avail := []string{"x"}
	batch := map[string]bool{} // written by compute
	for k := range blocks {
		w := fmt.Sprintf("w%d", k)
		b.Input(w, 4096)
		avail = append(avail, w)
	}
	type pend struct{ start string }
	var pending []pend
	var hideNext []int // indices into b.g.Nodes of starts to hide by the next compute
	id := 0
	fresh := func(p string) string { id++; return fmt.Sprintf("%s%d", p, id) }
	for i := 0; i < nodes; i++ {
		phase := i * 2 * blocks / nodes // 0..2·blocks-1
		dir, blk := buckets.Forward, phase
		if phase >= blocks {
			dir, blk = buckets.Backward, 2*blocks-1-phase
		}
		region := fmt.Sprintf("layers.%d", blk)
		if r.IntN(5) == 0 {
			region += ".attn"
		}
		switch x := r.IntN(10); {
		case x < 4: // compute
			reads := []string{avail[r.IntN(len(avail))]}
			if r.IntN(2) == 0 {
				reads = append(reads, avail[r.IntN(len(avail))])
			}
			out := fresh("t")
			name := fresh("c")
			b.Compute(name, dir, region, time.Duration(r.IntN(60))*time.Microsecond, reads, []string{out})
			for _, s := range hideNext {
				b.g.Nodes[s].HiddenBy = append(b.g.Nodes[s].HiddenBy, name)
			}
			hideNext = nil
			avail = append(avail, out)
			batch[out] = true
		case x < 7: // start
			ops := []buckets.Op{buckets.AllReduce, buckets.AllReduce, buckets.AllGather, buckets.ReduceScatter, buckets.AllToAll}
			group := "dp"
			if r.IntN(4) == 0 {
				group = "tp"
			}
			// Members of one collective are all compute outputs or all
			// not (inputs, collective outputs), and sizes split into whole
			// halves, so that Chunk can split most random collectives.
			var ms []Member
			first := avail[r.IntN(len(avail))]
			for range 1 + r.IntN(2) {
				in := avail[r.IntN(len(avail))]
				if batch[in] != batch[first] {
					in = first
				}
				ms = append(ms, Member{In: in, Out: fresh("o"), Bytes: 8 * int64(1+r.IntN(5000))})
			}
			name := fresh("s")
			b.Start(name, dir, region, ops[r.IntN(len(ops))], group, "f32", ms)
			if r.IntN(4) == 0 {
				hideNext = append(hideNext, len(b.g.Nodes)-1)
			}
			pending = append(pending, pend{name})
		default: // wait
			if len(pending) == 0 || len(hideNext) > 0 && r.IntN(2) == 0 {
				continue
			}
			k := r.IntN(len(pending))
			if r.IntN(2) == 0 {
				k = 0
			}
			p := pending[k]
			pending = append(pending[:k], pending[k+1:]...)
			if slicesContainsStart(b, hideNext, p.start) {
				pending = append(pending, p) // its hiding compute is not written yet
				continue
			}
			b.Wait(fresh("w"), p.start, region)
			for _, n := range b.g.Nodes {
				if n.Name == p.start {
					for _, m := range n.Members {
						avail = append(avail, m.Out)
					}
				}
			}
		}
	}
	if len(hideNext) > 0 {
		name := fresh("c")
		b.Compute(name, buckets.Optimizer, "", time.Microsecond, []string{"x"}, []string{fresh("t")})
		for _, s := range hideNext {
			b.g.Nodes[s].HiddenBy = append(b.g.Nodes[s].HiddenBy, name)
		}
	}
	for _, p := range pending {
		b.Wait(fresh("w"), p.start, "")
		b.g.Nodes[len(b.g.Nodes)-1].Dir = buckets.Optimizer
	}
	g, err := b.Graph()
	if err != nil {
		panic(fmt.Sprintf("random graph invalid: %v\n%s", err, Format(&b.g)))
	}
	return g
}

func slicesContainsStart(b *Builder, idx []int, name string) bool {
	for _, i := range idx {
		if b.g.Nodes[i].Name == name {
			return true
		}
	}
	return false
}

// propertySeeds is kept small so `go test -race` stays fast on a shared
// 2-core machine; run with -seeds=2000 after changing a pass.
var propertySeeds = flag.Int("seeds", 40, "random graphs per property test")

// TestPassProperties runs every pass, and chains of them, over random
// graphs: the result validates (acyclic, plan order topological), yields a
// valid bucket plan, survives a JSON round trip, is the same when computed
// twice, never exposes a collective the input hid, and — except for Reshard,
// which adds communication — never increases total exposed time.
func TestPassProperties(t *testing.T) {
	seeds := *propertySeeds
	if testing.Short() || raceEnabled {
		seeds = min(seeds, 20)
	}
	cfg := buckets.Config{Model: buckets.Model{Latency: 10 * time.Microsecond, BusBandwidth: 1e9}}
	type pass struct {
		name      string
		run       func(*Graph) (*Graph, error)
		monotone  bool // total exposure never grows
		mayRefuse error
	}
	passes := []pass{
		{"blocks", func(g *Graph) (*Graph, error) { return BucketBlocks(g, cfg) }, true, nil},
		{"overlap", func(g *Graph) (*Graph, error) { return BucketOverlap(g, cfg) }, true, nil},
		{"overlap-small-cap", func(g *Graph) (*Graph, error) {
			c := cfg
			c.CapBytes, c.MinBytes = 30000, 30000
			return BucketOverlap(g, c)
		}, true, nil},
		{"reshard", func(g *Graph) (*Graph, error) { out, _, err := Reshard(g, cfg.Model); return out, err }, false, nil},
		{"chunk", func(g *Graph) (*Graph, error) {
			out, _, err := Chunk(g, "layers.*", nil, cfg.Model)
			return out, err
		}, true, ErrChunk},
		{"blocks+overlap", func(g *Graph) (*Graph, error) {
			g, err := BucketBlocks(g, cfg)
			if err != nil {
				return nil, err
			}
			return BucketOverlap(g, cfg)
		}, true, nil},
		{"reshard+overlap", func(g *Graph) (*Graph, error) {
			g, _, err := Reshard(g, cfg.Model)
			if err != nil {
				return nil, err
			}
			return BucketOverlap(g, cfg)
		}, false, nil},
	}
	merged := 0
	changed := map[string]int{}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		g := randomGraph(r, 20+r.IntN(80))
		in := Format(g)
		before, err := Simulate(g, cfg.Model)
		if err != nil {
			t.Fatal(err)
		}
		checkEstimate(t, seed, g, before)
		for _, p := range passes {
			out, err := p.run(g)
			if p.mayRefuse != nil && errors.Is(err, p.mayRefuse) {
				continue
			}
			if err != nil {
				t.Fatalf("seed %d %s: %v\n%s", seed, p.name, err, in)
			}
			if Format(g) != in {
				t.Fatalf("seed %d %s modified its input", seed, p.name)
			}
			if err := out.Validate(); err != nil {
				t.Fatalf("seed %d %s: invalid output: %v\n%s", seed, p.name, err, Format(out))
			}
			if _, err := Plan(out); err != nil {
				t.Fatalf("seed %d %s: plan: %v", seed, p.name, err)
			}
			rep, err := Check(g, out, cfg.Model)
			if err != nil {
				t.Fatalf("seed %d %s: %v\n%s\n%s", seed, p.name, err, rep, Format(out))
			}
			checkEstimate(t, seed, out, rep.After)
			if err := directionRule(g, out); err != nil {
				t.Fatalf("seed %d %s: %v\n%s", seed, p.name, err, Format(out))
			}
			if p.monotone && rep.After.Exposed > rep.Before.Exposed {
				t.Fatalf("seed %d %s: exposure %v → %v", seed, p.name, rep.Before.Exposed, rep.After.Exposed)
			}
			if len(out.Nodes) < len(g.Nodes) {
				merged++
			}
			if Format(out) != in {
				changed[p.name]++
			}
			if seed%4 != 0 { // the costlier checks on a quarter of the seeds
				continue
			}
			again, _ := p.run(g)
			if Format(again) != Format(out) {
				t.Fatalf("seed %d %s: not deterministic", seed, p.name)
			}
			var buf bytes.Buffer
			if err := Save(&buf, out); err != nil {
				t.Fatal(err)
			}
			if back, err := Load(&buf); err != nil || Format(back) != Format(out) {
				t.Fatalf("seed %d %s: JSON round trip: %v", seed, p.name, err)
			}
			if back, err := Parse(Format(out)); err != nil || Format(back) != Format(out) {
				t.Fatalf("seed %d %s: text round trip: %v", seed, p.name, err)
			}
		}
	}
	// The properties would hold trivially if the passes never did anything.
	if merged < seeds/4 {
		t.Errorf("only %d pass results over %d seeds merged anything", merged, seeds)
	}
	for _, p := range passes {
		if changed[p.name] == 0 {
			t.Errorf("%s never changed a random graph", p.name)
		}
	}
	t.Logf("graphs changed per pass over %d seeds: %v", seeds, changed)
}

// checkEstimate checks the simulator's bookkeeping: the step is compute
// plus blocking, totals are the sums of their parts.
func checkEstimate(t *testing.T, seed int, g *Graph, e *Estimate) {
	t.Helper()
	if e.Step != e.Compute+e.Exposed {
		t.Fatalf("seed %d: step %v != compute %v + exposed %v", seed, e.Step, e.Compute, e.Exposed)
	}
	var exp, comm, rc, rx time.Duration
	for _, c := range e.Collectives {
		exp += c.Exposed
		comm += c.End - c.Begin
		if c.Begin < c.Issue || c.End < c.Begin {
			t.Fatalf("seed %d: collective %s runs %v..%v, issued %v", seed, c.Start, c.Begin, c.End, c.Issue)
		}
	}
	for _, r := range e.Regions {
		rc += r.Comm
		rx += r.Exposed
	}
	if exp != e.Exposed || rx != e.Exposed || comm != e.Comm || rc != e.Comm {
		t.Fatalf("seed %d: totals disagree: exposed %v/%v/%v comm %v/%v/%v", seed, exp, rx, e.Exposed, comm, rc, e.Comm)
	}
}

// directionRule checks that no bucket of out carries members whose author
// starts in g had another direction than the bucket: forward and backward
// are planned apart, never merged into one collective.
func directionRule(g, out *Graph) error {
	dir := map[string]Direction{}
	for _, n := range g.Nodes {
		if n.Kind == Start {
			dir[n.Name] = n.Dir
			for _, m := range n.Members {
				if m.From != "" {
					dir[m.From] = n.Dir
				}
			}
		}
	}
	for _, n := range out.Nodes {
		if n.Kind != Start {
			continue
		}
		for _, m := range n.Members {
			from := m.From
			if from == "" {
				from = n.Name
			}
			if d, ok := dir[from]; ok && d != n.Dir {
				return fmt.Errorf("bucket %q (%s) carries %q, a %s collective", n.Name, n.Dir, from, d)
			}
		}
	}
	return nil
}

// TestDirectionRule: on a transformer step, the bucketing passes keep the
// directions apart, forward buckets follow block order and backward buckets
// reverse block order, as buckets.Assign orders eager programs.
func TestDirectionRule(t *testing.T) {
	g := transformerStep(8, 8)
	block := map[string]int{}
	for i, r := range g.Regions {
		block[r] = i
	}
	cfg := buckets.DefaultConfig()
	for _, tc := range []struct {
		name string
		run  func(*Graph) (*Graph, error)
	}{
		{"blocks", func(g *Graph) (*Graph, error) { return BucketBlocks(g, cfg) }},
		{"overlap", func(g *Graph) (*Graph, error) { return BucketOverlap(g, cfg) }},
		{"blocks+overlap", func(g *Graph) (*Graph, error) {
			g, err := BucketBlocks(g, cfg)
			if err != nil {
				return nil, err
			}
			return BucketOverlap(g, cfg)
		}},
		{"reshard+blocks", func(g *Graph) (*Graph, error) {
			g, _, err := Reshard(g, cfg.Model)
			if err != nil {
				return nil, err
			}
			return BucketBlocks(g, cfg)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.run(g)
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Nodes) >= len(g.Nodes) && tc.name != "reshard+blocks" {
				t.Fatal("nothing was bucketed: the rule would hold trivially")
			}
			if err := directionRule(g, out); err != nil {
				t.Fatal(err)
			}
			last := map[Direction]int{buckets.Forward: -1, buckets.Backward: len(g.Regions)}
			for _, n := range out.Nodes {
				if n.Kind != Start || (n.Dir != buckets.Forward && n.Dir != buckets.Backward) {
					continue
				}
				b := block[n.Region]
				if n.Dir == buckets.Forward && b < last[n.Dir] || n.Dir == buckets.Backward && b > last[n.Dir] {
					t.Fatalf("%s bucket %q of block %d issued after one of block %d", n.Dir, n.Name, b, last[n.Dir])
				}
				last[n.Dir] = b
			}
		})
	}
}

// TestCopyCostKeepsLoneCollectives: with a copy bandwidth in the model,
// both bucketing passes merge the small gradients (their copies cost less
// than a latency) and leave every large one a bucket of its own (its copies
// would cost more than the latency saved); with views (no copy bandwidth)
// the large ones merge too.
func TestCopyCostKeepsLoneCollectives(t *testing.T) {
	const small, large = 400, 40_000
	b := NewBuilder().Group("dp", 2).Region("m")
	var gs []string
	for i := range 12 {
		gs = append(gs, fmt.Sprintf("g%d", i))
	}
	b.Compute("bwd", buckets.Backward, "m", time.Microsecond, nil, gs)
	for i, g := range gs {
		by := int64(small)
		if i >= 6 {
			by = large
		}
		b.Start("ar"+g, buckets.Backward, "m", buckets.AllReduce, "dp", "f32", []Member{{In: g, Out: "R" + g, Bytes: by}})
	}
	var outs []string
	for _, g := range gs {
		b.Wait("ar"+g+".w", "ar"+g, "m")
		outs = append(outs, "R"+g)
	}
	b.Compute("opt", buckets.Optimizer, "m", time.Microsecond, outs, []string{"done"})
	g, err := b.Graph()
	if err != nil {
		t.Fatal(err)
	}
	// 2 µs latency; copies at 1 GB/s: a small member costs 0.8 µs to copy
	// in and out, a large one 80 µs.
	cfg := buckets.Config{Model: buckets.Model{Latency: 2 * time.Microsecond, BusBandwidth: 5e9, CopyBandwidth: 1e9},
		CapBytes: 1 << 20, MinBytes: 1 << 20}
	passes := map[string]func(*Graph, buckets.Config) (*Graph, error){"blocks": BucketBlocks, "overlap": BucketOverlap}
	for name, pass := range passes {
		for _, views := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/views=%v", name, views), func(t *testing.T) {
				c := cfg
				if views {
					c.Model.CopyBandwidth = 0
				}
				out, err := pass(g, c)
				if err != nil {
					t.Fatal(err)
				}
				var merged, alone int
				for _, n := range out.Nodes {
					if n.Kind != Start {
						continue
					}
					big := false
					for _, m := range n.Members {
						big = big || m.Bytes == large
					}
					switch {
					case big && len(n.Members) > 1 && !views:
						t.Errorf("bucket %q merges a %d-byte member whose copies cost more than a latency", n.Name, large)
					case len(n.Members) > 1:
						merged++
					default:
						alone++
					}
				}
				if views && (merged != 1 || alone != 0) {
					t.Errorf("with views: %d merged buckets and %d lone collectives, want everything in one bucket", merged, alone)
				}
				// With copies: the six small ones in one bucket, the six
				// large ones alone.
				if !views && (merged != 1 || alone != 6) {
					t.Errorf("with copies: %d merged buckets and %d lone collectives, want 1 and 6", merged, alone)
				}
			})
		}
	}
}
