package overlap

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// zeroCopyGraph is a DDP backward: one compute writes six gradients of
// different sizes, each all-reduced on its own as written; a lone
// reduce-scatter on the same group shows which tensors get no view.
func zeroCopyGraph(t *testing.T, n int) *stepgraph.Graph {
	t.Helper()
	b := stepgraph.NewBuilder().Group("dp", n).Region("m")
	var gs, outs []string
	for i := range 6 {
		gs = append(gs, fmt.Sprintf("g%d", i))
	}
	b.Compute("bwd", buckets.Backward, "m", time.Millisecond, nil, append(gs, "h"))
	for i := range 6 {
		b.Start(fmt.Sprintf("ar%d", i), buckets.Backward, "m", buckets.AllReduce, "dp", "f32",
			[]stepgraph.Member{{In: gs[i], Out: "G" + gs[i][1:], Bytes: int64(4 * (i + 1))}})
		outs = append(outs, "G"+gs[i][1:])
	}
	b.Start("rs", buckets.Backward, "m", buckets.ReduceScatter, "dp", "i32",
		[]stepgraph.Member{{In: "h", Out: "H", Bytes: int64(4 * n)}})
	for i := range 6 {
		b.Wait(fmt.Sprintf("ar%d.w", i), fmt.Sprintf("ar%d", i), "m")
	}
	b.Wait("rs.w", "rs", "m")
	b.Compute("opt", buckets.Optimizer, "m", 0, append(outs, "H"), []string{"done"})
	g, err := b.Graph()
	if err != nil {
		t.Fatal(err)
	}
	cfg := buckets.DefaultConfig()
	cfg.CapBytes = 1 << 20
	if g, err = stepgraph.BucketBlocks(g, cfg); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestZeroCopyBuckets: gradients computed into GraphRunner.View slots are
// all-reduced without a single byte packed or scattered, give the same
// results as gradients in the program's own buffers (which are copied in
// and out: 2 × the bucket's bytes), and only fused in-place buckets hand
// out views.
func TestZeroCopyBuckets(t *testing.T) {
	const n, steps = 2, 3
	for _, views := range []bool{true, false} {
		t.Run(fmt.Sprintf("views=%v", views), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g := zeroCopyGraph(t, n)
			comms := startComms(ctx, t, n)
			runRanks(t, comms, func(c *comm.Comm) error { return zeroCopyRank(ctx, g, c, views, steps) })
		})
	}
}

func zeroCopyRank(ctx context.Context, g *stepgraph.Graph, c *comm.Comm, views bool, steps int) error {
	gr, err := NewGraphRunner(g, map[string]Comm{"dp": c}, DefaultConfig())
	if err != nil {
		return err
	}
	defer gr.Close()
	if nb := len(gr.Executor().Plan().Groups[0].Buckets); nb != 2 {
		return fmt.Errorf("%d buckets, want 2 (the six all-reduces fused, the reduce-scatter)", nb)
	}
	n := c.Size()
	bufs := map[string][]float32{"done": {0}}
	for _, name := range []string{"h", "H"} {
		if _, ok := gr.View(name); ok {
			return fmt.Errorf("View(%q): a reduce-scatter member got a view", name)
		}
	}
	if _, ok := gr.View("nope"); ok {
		return fmt.Errorf("View of a tensor of no start succeeded")
	}
	ints := map[string][]int32{"h": make([]int32, n), "H": make([]int32, 1)}
	var fused int64
	for i := range 6 {
		name := fmt.Sprintf("g%d", i)
		fused += int64(4 * (i + 1))
		if v, ok := gr.View(name); views && ok {
			bufs[name] = comm.AsFloat32(v)
		} else if views {
			return fmt.Errorf("View(%q): no view for a member of a fused all-reduce", name)
		} else {
			bufs[name] = make([]float32, i+1)
		}
		bufs["G"+name[1:]] = bufs[name] // reduced in place
	}
	tensors := func(name string) (comm.Buffer, error) {
		if b, ok := ints[name]; ok {
			return comm.Int32s(b), nil
		}
		b, ok := bufs[name]
		if !ok {
			return nil, fmt.Errorf("no tensor %q", name)
		}
		return comm.Float32s(b), nil
	}
	k := float32(c.Rank())
	for s := range steps {
		kernel := func(_ context.Context, nd *stepgraph.Node) error {
			if nd.Name != "bwd" {
				return nil
			}
			for i := range 6 {
				gi := bufs[fmt.Sprintf("g%d", i)]
				for j := range gi {
					gi[j] = float32(100*s+10*i+j) + k
				}
			}
			for j := range ints["h"] {
				ints["h"][j] = int32(j + s)
			}
			return nil
		}
		m, err := gr.Step(ctx, s, tensors, kernel)
		if err != nil {
			return err
		}
		// Σ over ranks q of (100s + 10i + j + q) = n(100s + 10i + j) + n(n-1)/2.
		for i := range 6 {
			for j, got := range bufs[fmt.Sprintf("G%d", i)] {
				if want := float32(n*(100*s+10*i+j) + n*(n-1)/2); got != want {
					return fmt.Errorf("step %d: G%d[%d] = %v, want %v", s, i, j, got, want)
				}
			}
		}
		if want := int32(n * (c.Rank() + s)); ints["H"][0] != want {
			return fmt.Errorf("step %d: H = %d, want %d", s, ints["H"][0], want)
		}
		// The lone reduce-scatter runs on the program's buffers (no copy)
		// either way; the fused bucket copies in and out unless views.
		want := 2 * fused
		if views {
			want = 0
		}
		if m.CopiedBytes != want {
			return fmt.Errorf("step %d: copied %d bytes, want %d (views %v)", s, m.CopiedBytes, want, views)
		}
	}
	return nil
}

// TestRealCompletionTimes: over real communicators (whose handles say
// when they completed, so no watcher goroutine waits on them), a small
// all-reduce issued before 40 ms of compute and waited for after it is
// timed as the collective took, not as the wait came: StepMetrics.Comm is
// above zero and well below the compute, and the wait finds it done.
//
// A completion stamped at the wait makes Comm at least the compute on
// every step. The collective's own time runs from this rank's issue to
// the other rank's contribution and the worker's turn, which a loaded
// machine delays without bound (beside a load of 30, one -race run in a
// hundred timed it at 22 ms). So each rank runs several steps, both ranks
// held at a barrier before each (without it, one rank's lateness carries
// from step to step: the collective completes inside the compute and
// nothing else brings the ranks together; a run timed every step of rank
// 1 at 28 ms), and must time at least one far below the compute; every
// step is checked for the rest.
func TestRealCompletionTimes(t *testing.T) {
	const compute, steps = 40 * time.Millisecond, 5
	b := stepgraph.NewBuilder().Group("dp", 2).Region("m")
	b.Compute("bwd", buckets.Backward, "m", time.Millisecond, nil, []string{"g"})
	b.Start("ar", buckets.Backward, "m", buckets.AllReduce, "dp", "f32", []stepgraph.Member{{In: "g", Out: "G", Bytes: 16}})
	b.Compute("other", buckets.Backward, "m", compute, nil, []string{"o"})
	b.Wait("ar.w", "ar", "m")
	b.Compute("opt", buckets.Optimizer, "m", time.Millisecond, []string{"G", "o"}, []string{"done"})
	g, err := b.Graph()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms := startComms(ctx, t, 2)
	arrived := make([]atomic.Int32, steps)
	together := make([]chan struct{}, steps) // closed when both ranks reached step s
	for s := range together {
		together[s] = make(chan struct{})
	}
	runRanks(t, comms, func(c *comm.Comm) error {
		gr, err := NewGraphRunner(g, map[string]Comm{"dp": c}, DefaultConfig())
		if err != nil {
			return err
		}
		defer gr.Close()
		var bufs map[string][]float32
		tensors := func(name string) (comm.Buffer, error) { return comm.Float32s(bufs[name]), nil }
		kernel := func(_ context.Context, nd *stepgraph.Node) error {
			if nd.Name == "other" {
				time.Sleep(compute)
			}
			return nil
		}
		var took []time.Duration
		for s := range steps {
			bufs = map[string][]float32{"g": {1, 2, 3, 4}, "o": nil, "done": nil}
			bufs["G"] = bufs["g"]
			if arrived[s].Add(1) == int32(len(comms)) {
				close(together[s])
			}
			select {
			case <-together[s]:
			case <-ctx.Done():
				return fmt.Errorf("step %d: the other rank never came: %w", s, ctx.Err())
			}
			m, err := gr.Step(ctx, s, tensors, kernel)
			if err != nil {
				return err
			}
			if m.Comm <= 0 || m.Comm > m.Time || m.Time < compute {
				return fmt.Errorf("step %d: comm %v, step %v: want the collective's own time, above 0, within a step of at least the %v of compute", s, m.Comm, m.Time, compute)
			}
			if got := fmt.Sprint(bufs["G"]); got != "[2 4 6 8]" {
				return fmt.Errorf("step %d: reduced %s", s, got)
			}
			took = append(took, m.Comm)
		}
		if slices.Min(took) >= compute/2 {
			return fmt.Errorf("comm %v in %d steps: want the collective's own time, far below the %v of compute it hid behind, in one step at least", took, steps, compute)
		}
		return nil
	})
}
