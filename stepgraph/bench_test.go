package stepgraph

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// transformerStep is the planning benchmark's input: blocks of an FSDP
// step with per-parameter collectives, the shape bucketing exists for. In
// forward each block prefetches the next block's parameters (one all-gather
// per parameter) behind its compute; in backward each block's gradients are
// reduce-scattered (one per parameter) behind the next block's backward. With
// params=8 each block has 48 nodes, so 208 blocks make 9,984 nodes.
func transformerStep(blocks, params int) *Graph {
	b := NewBuilder().Group("dp", 8)
	b.Input("x", 1<<20)
	for k := range blocks {
		b.Region(fmt.Sprintf("layers.%d", k))
		for p := range params {
			b.Input(fmt.Sprintf("w%d.%d", k, p), 4096*int64(1+p%4))
		}
	}
	gather := func(k int) {
		for p := range params {
			w := fmt.Sprintf("w%d.%d", k, p)
			b.Start("ag"+w, buckets.Forward, fmt.Sprintf("layers.%d", k), buckets.AllGather, "dp", "bf16",
				[]Member{{In: w, Out: "W" + w, Bytes: 4096 * int64(1+p%4)}})
		}
	}
	waitGather := func(k int) {
		for p := range params {
			w := fmt.Sprintf("w%d.%d", k, p)
			b.Wait("ag"+w+".w", "ag"+w, "")
		}
	}
	gather(0)
	waitGather(0)
	act := "x"
	for k := range blocks {
		r := fmt.Sprintf("layers.%d", k)
		if k+1 < blocks {
			gather(k + 1)
		}
		for p := range params {
			out := fmt.Sprintf("a%d.%d", k, p)
			b.Compute(fmt.Sprintf("f%d.%d", k, p), buckets.Forward, r, 20*time.Microsecond,
				[]string{act, fmt.Sprintf("Ww%d.%d", k, p)}, []string{out})
			act = out
		}
		if k+1 < blocks {
			waitGather(k + 1)
		} else {
			// The last block has no successor to prefetch: keep the node
			// count per block even with a few extra computes.
			for p := range 2 * params {
				out := fmt.Sprintf("loss.%d", p)
				b.Compute(out, buckets.Forward, r, time.Microsecond, []string{act}, []string{out})
				act = out
			}
		}
	}
	for k := blocks - 1; k >= 0; k-- {
		r := fmt.Sprintf("layers.%d", k)
		for p := range params {
			d, g := fmt.Sprintf("d%d.%d", k, p), fmt.Sprintf("g%d.%d", k, p)
			b.Compute("b"+d, buckets.Backward, r, 40*time.Microsecond,
				[]string{act, fmt.Sprintf("a%d.%d", k, p), fmt.Sprintf("Ww%d.%d", k, p)}, []string{d, g})
			act = d
		}
		if k+1 < blocks {
			for p := range params {
				b.Wait(fmt.Sprintf("rs%d.%d.w", k+1, p), fmt.Sprintf("rs%d.%d", k+1, p), r)
			}
		}
		for p := range params {
			g := fmt.Sprintf("g%d.%d", k, p)
			b.Start(fmt.Sprintf("rs%d.%d", k, p), buckets.Backward, r, buckets.ReduceScatter, "dp", "f32",
				[]Member{{In: g, Out: "G" + g, Bytes: 32768 * int64(1+p%4)}})
		}
	}
	for p := range params {
		b.Wait(fmt.Sprintf("rs0.%d.w", p), fmt.Sprintf("rs0.%d", p), "layers.0")
	}
	g, err := b.Graph()
	if err != nil {
		panic(err)
	}
	return g
}

func TestTransformerStepBuckets(t *testing.T) {
	g := transformerStep(8, 8)
	cfg := buckets.DefaultConfig()
	out, err := BucketOverlap(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Check(g, out, cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := Plan(g)
	after, _ := Plan(out)
	t.Logf("buckets %d → %d, exposed %v → %v", len(before.Groups[0].Buckets), len(after.Groups[0].Buckets), rep.Before.Exposed, rep.After.Exposed)
	if len(after.Groups[0].Buckets) >= len(before.Groups[0].Buckets) {
		t.Errorf("nothing merged in a step made of per-parameter collectives")
	}
	if rep.After.Exposed > rep.Before.Exposed {
		t.Errorf("exposure grew")
	}
}

func benchPass(b *testing.B, g *Graph, pass func(*Graph) (*Graph, error)) {
	b.ReportAllocs()
	b.ReportMetric(float64(len(g.Nodes)), "nodes")
	for b.Loop() {
		if _, err := pass(g); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBucketOverlap10k is the planning goal: overlap-
// preserving bucketing of a 10k-node step well under a second.
func BenchmarkBucketOverlap10k(b *testing.B) {
	g := transformerStep(208, 8)
	cfg := buckets.DefaultConfig()
	benchPass(b, g, func(g *Graph) (*Graph, error) { return BucketOverlap(g, cfg) })
}

// BenchmarkBucketOverlapRandom10k runs the same pass on a random 10k-node
// step (many groups of tiny exposed collectives, the guard's worst case).
func BenchmarkBucketOverlapRandom10k(b *testing.B) {
	g := randomGraph(rand.New(rand.NewPCG(1, 2)), 10000)
	cfg := buckets.DefaultConfig()
	benchPass(b, g, func(g *Graph) (*Graph, error) { return BucketOverlap(g, cfg) })
}

func BenchmarkBucketBlocks10k(b *testing.B) {
	g := transformerStep(208, 8)
	cfg := buckets.DefaultConfig()
	benchPass(b, g, func(g *Graph) (*Graph, error) { return BucketBlocks(g, cfg) })
}

func BenchmarkReshard10k(b *testing.B) {
	g := transformerStep(208, 8)
	benchPass(b, g, func(g *Graph) (*Graph, error) { out, _, err := Reshard(g, buckets.DefaultModel()); return out, err })
}

func BenchmarkValidateSimulate10k(b *testing.B) {
	g := transformerStep(208, 8)
	benchPass(b, g, func(g *Graph) (*Graph, error) { _, err := Simulate(g, buckets.DefaultModel()); return g, err })
}

// BenchmarkPlanner10k is `gorun plan` on a 10k-node step without the
// process: parse the JSON document, validate, run the default passes
// (block then overlap-preserving bucketing) and print the text summary.
// The goal: under a second.
func BenchmarkPlanner10k(b *testing.B) {
	var doc bytes.Buffer
	if err := Save(&doc, transformerStep(208, 8)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ReportMetric(9984, "nodes")
	for b.Loop() {
		g, err := Load(bytes.NewReader(doc.Bytes()))
		if err != nil {
			b.Fatal(err)
		}
		s, err := RunPlanner(g, PlannerConfig{Buckets: buckets.DefaultConfig()})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.WriteText(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlannerAllPasses10k adds reshard and chunking in front.
func BenchmarkPlannerAllPasses10k(b *testing.B) { benchAllPasses(b, 208) }

// BenchmarkPlannerAllPasses100k is the same on ten times the blocks: the
// planner must stay near-linear in the graph's size.
func BenchmarkPlannerAllPasses100k(b *testing.B) { benchAllPasses(b, 2083) }

func benchAllPasses(b *testing.B, blocks int) {
	g := transformerStep(blocks, 8)
	// gorun plan's defaults for these passes.
	cfg := PlannerConfig{Passes: []string{PassReshard, PassChunk, PassBlocks, PassOverlap}, Buckets: buckets.DefaultConfig(),
		Chunk: ChunkConfig{Pattern: "*", Accumulate: true}, ReshardPrefetch: 1}
	b.ReportAllocs()
	b.ReportMetric(float64(len(g.Nodes)), "nodes")
	for b.Loop() {
		if _, err := RunPlanner(g, cfg); err != nil {
			b.Fatal(err)
		}
	}
}

// TestWriteTransformerStep writes the benchmark's 10k-node step (or, with
// $GORUN_STEP_BLOCKS, that many blocks of 48 nodes) as a JSON document to
// $GORUN_WRITE_STEP for scripts/bench-plan.sh, which times the real `gorun
// plan` on it. Without the variable it has nothing to do.
func TestWriteTransformerStep(t *testing.T) {
	out := os.Getenv("GORUN_WRITE_STEP")
	if out == "" {
		t.Skip("GORUN_WRITE_STEP not set (scripts/bench-plan.sh sets it)")
	}
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	blocks := 208
	if v := os.Getenv("GORUN_STEP_BLOCKS"); v != "" {
		if blocks, err = strconv.Atoi(v); err != nil || blocks < 1 {
			t.Fatalf("GORUN_STEP_BLOCKS=%q: want a positive number of blocks", v)
		}
	}
	if err := Save(f, transformerStep(blocks, 8)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
