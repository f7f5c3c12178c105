package stepgraph_test

import (
	"fmt"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// A data-parallel backward over two blocks: each block's gradients are
// all-reduced one tensor at a time and waited before the optimizer. Block
// bucketing merges each block's gradients; the plan lists the buckets in the
// order every rank issues them (block 1 first: backward runs in reverse) and
// a hash the ranks compare.
func Example() {
	us := time.Microsecond
	b := stepgraph.NewBuilder().Group("dp", 4)
	b.Input("x", 0)
	b.Compute("f0", buckets.Forward, "layers.0", 100*us, []string{"x"}, []string{"a0"})
	b.Compute("f1", buckets.Forward, "layers.1", 100*us, []string{"a0"}, []string{"a1"})
	b.Compute("b1", buckets.Backward, "layers.1", 200*us, []string{"a1"}, []string{"d1", "g1.w", "g1.b"})
	b.Start("ar1.w", buckets.Backward, "layers.1", buckets.AllReduce, "dp", "f32", []stepgraph.Member{{In: "g1.w", Out: "G1.w", Bytes: 1 << 16}})
	b.Start("ar1.b", buckets.Backward, "layers.1", buckets.AllReduce, "dp", "f32", []stepgraph.Member{{In: "g1.b", Out: "G1.b", Bytes: 256}})
	b.Compute("b0", buckets.Backward, "layers.0", 200*us, []string{"d1", "a0"}, []string{"g0.w", "g0.b"})
	b.Start("ar0.w", buckets.Backward, "layers.0", buckets.AllReduce, "dp", "f32", []stepgraph.Member{{In: "g0.w", Out: "G0.w", Bytes: 1 << 16}})
	b.Start("ar0.b", buckets.Backward, "layers.0", buckets.AllReduce, "dp", "f32", []stepgraph.Member{{In: "g0.b", Out: "G0.b", Bytes: 256}})
	for _, s := range []string{"ar1.w", "ar1.b", "ar0.w", "ar0.b"} {
		b.Wait(s+".wait", s, "")
	}
	g, err := b.Graph()
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := buckets.DefaultConfig()
	out, err := stepgraph.BucketBlocks(g, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	plan, _ := stepgraph.Plan(out)
	fmt.Print(plan)
	rep, _ := stepgraph.Check(g, out, cfg.Model)
	fmt.Println("exposed", rep.Before.Exposed, "->", rep.After.Exposed)
	// Output:
	// group dp
	//   0 all_reduce f32 backward layers.1 set0 65792B: g1.w@0 g1.b@65536
	//   1 all_reduce f32 backward layers.0 set1 65792B: g0.w@0 g0.b@65536
	// hash a5cabab3c8fed218
	// exposed 138.688µs -> 118.688µs
}
