package overlap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// startComms connects n real communicators over commtest's in-memory
// network; Cleanup closes them.
func startComms(ctx context.Context, t *testing.T, n int) []*comm.Comm {
	t.Helper()
	cfg := comm.LocalConfig()
	cfg.Deterministic = true
	return commtest.StartComms(ctx, t, n, cfg)
}

// TestRealComm runs an FSDP-shaped step (gather, reduce-scatter) and a DDP
// bucket on 4 real ranks, in every mode, and checks every rank's results
// against values computed here.
func TestRealComm(t *testing.T) {
	const n = 4
	items := []buckets.Item{
		{Tensor: "p0", Out: "P0", Bytes: 8, Op: buckets.AllGather, Direction: buckets.Forward, Region: "l0"},
		{Tensor: "p1", Out: "P1", Bytes: 4, Op: buckets.AllGather, Direction: buckets.Forward, Region: "l0"},
		{Tensor: "g1", Out: "G1", Bytes: 32, Op: buckets.ReduceScatter, Direction: buckets.Backward, Region: "l0"},
		{Tensor: "g0", Out: "G0", Bytes: 16, Op: buckets.ReduceScatter, Direction: buckets.Backward, Region: "l0"},
		{Tensor: "a", Bytes: 12, Op: buckets.AllReduce, Direction: buckets.Backward, Region: "l0"},
	}
	for i := range items {
		items[i].Group, items[i].DType = "world", "f32"
	}
	plan, err := buckets.Assign(items, []string{"l0"}, buckets.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{Native, Grouped, Serial} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			comms := startComms(ctx, t, n)
			runRanks(t, comms, func(c *comm.Comm) error { return realRank(ctx, c, plan, mode) })
		})
	}
}

func realRank(ctx context.Context, c *comm.Comm, plan *buckets.Plan, mode Mode) error {
	cfg := DefaultConfig()
	cfg.Mode = mode
	ex, err := New(plan, map[string]Comm{"world": c}, cfg)
	if err != nil {
		return err
	}
	defer ex.Close()
	n, k := c.Size(), c.Rank()
	fill := func(len, base int) []float32 {
		s := make([]float32, len)
		for i := range s {
			s[i] = float32(base + i)
		}
		return s
	}
	for step := range 2 {
		p0, p1 := fill(2, 100*k), fill(1, 100*k+50)
		P0, P1 := make([]float32, 2*n), make([]float32, n)
		g1, g0 := fill(8, k), fill(4, 10*k)
		G1, G0 := make([]float32, 2), make([]float32, 1)
		a := fill(3, k)
		if err := ex.Begin(step); err != nil {
			return err
		}
		for _, x := range []struct {
			name    string
			in, out []float32
		}{{"p0", p0, P0}, {"p1", p1, P1}, {"g1", g1, G1}, {"g0", g0, G0}, {"a", a, a}} {
			if err := ex.Ready(ctx, x.name, comm.Float32s(x.in), comm.Float32s(x.out)); err != nil {
				return err
			}
		}
		if _, err := ex.Finish(ctx); err != nil {
			return err
		}
		for p := range n {
			if P0[2*p] != float32(100*p) || P0[2*p+1] != float32(100*p+1) || P1[p] != float32(100*p+50) {
				return fmt.Errorf("gathered P0 %v P1 %v", P0, P1)
			}
		}
		// Sum over ranks q of (q + i) is n(n-1)/2 + n·i; of 10q + i is 10·n(n-1)/2 + n·i.
		tri := float32(n * (n - 1) / 2)
		for i := range G1 {
			if want := tri + float32(n*(2*k+i)); G1[i] != want {
				return fmt.Errorf("G1 %v, element %d want %v", G1, i, want)
			}
		}
		if want := 10*tri + float32(n*k); G0[0] != want {
			return fmt.Errorf("G0 %v, want %v", G0, want)
		}
		for i := range a {
			if want := tri + float32(n*i); a[i] != want {
				return fmt.Errorf("a %v, element %d want %v", a, i, want)
			}
		}
	}
	return nil
}

// TestRealPlanMismatch: one rank buckets differently; every rank gets an
// error (the plan mismatch where the hash exchange completes first) instead
// of a hang or silently mixed data.
func TestRealPlanMismatch(t *testing.T) {
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms := startComms(ctx, t, n)
	mk := func(bytes int64) *buckets.Plan {
		p, err := buckets.Assign([]buckets.Item{{Tensor: "a", Bytes: bytes, Group: "world", Op: buckets.AllReduce, DType: "f32", Direction: buckets.Backward, Region: "l0"}},
			[]string{"l0"}, buckets.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			bytes := int64(8)
			if r == 2 {
				bytes = 12
			}
			ex, err := New(mk(bytes), map[string]Comm{"world": comms[r]}, DefaultConfig())
			if err != nil {
				errs[r] = err
				return
			}
			defer ex.Close()
			buf := make([]float32, bytes/4)
			if err = ex.Begin(0); err == nil {
				if err = ex.Ready(ctx, "a", comm.Float32s(buf), comm.Float32s(buf)); err == nil {
					_, err = ex.Finish(ctx)
				}
			}
			errs[r] = err
			if err != nil {
				comms[r].Abort(err)
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		// A rank may learn of the mismatch from a peer's abort (which
		// carries the text) before its own check runs.
		var pm *PlanMismatchError
		if !errors.As(err, &pm) && (err == nil || !strings.Contains(err.Error(), "disagree on the bucket plan")) {
			t.Errorf("rank %d: %v, want the plan mismatch", r, err)
			continue
		}
		t.Logf("rank %d: %v", r, err)
	}
}

// TestRealGraph runs a step graph (an FSDP-shaped step over two blocks) on
// 2 real ranks through GraphRunner in Native and Grouped modes and checks
// the gathered parameters and reduced gradients every rank sees.
// realGraphText is a two-block step on 2 ranks: gathers in forward,
// all-reduces in backward.
const realGraphText = `group dp 2
region layers.0
region layers.1
tensor x 8 input
tensor w0 8 input
tensor w1 8 input
start ag0 fwd layers.0 all_gather dp f32 w0>W0:8
wait ag0.w fwd layers.0 of=ag0
compute f0 fwd layers.0 10us reads=x,W0 writes=a0
start ag1 fwd layers.1 all_gather dp f32 w1>W1:8
wait ag1.w fwd layers.1 of=ag1
compute f1 fwd layers.1 10us reads=a0,W1 writes=a1
compute b1 bwd layers.1 10us reads=a1,W1 writes=g1,d1
start ar1 bwd layers.1 all_reduce dp f32 g1>G1:16
compute b0 bwd layers.0 10us reads=d1,W0 writes=g0
start ar0 bwd layers.0 all_reduce dp f32 g0>G0:16
wait ar1.w opt - of=ar1
wait ar0.w opt - of=ar0
compute step opt - 10us reads=G1,G0 writes=done`

func TestRealGraph(t *testing.T) {

	g, err := stepgraph.Parse(realGraphText)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{Native, Grouped} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			comms := startComms(ctx, t, 2)
			runRanks(t, comms, func(c *comm.Comm) error { return graphRank(ctx, g, c, mode, nil) })
		})
	}
}

// graphRank runs one step of g on c and checks the results; before, when
// set, runs before each compute node (to delay one).
func graphRank(ctx context.Context, g *stepgraph.Graph, c *comm.Comm, mode Mode, before func(rank int, node string)) error {
	cfg := DefaultConfig()
	cfg.Mode = mode
	gr, err := NewGraphRunner(g, map[string]Comm{"dp": c}, cfg)
	if err != nil {
		return err
	}
	defer gr.Close()
	k := float32(c.Rank())
	bufs := map[string][]float32{
		"x": {1, 1}, "w0": {10 + k, 20 + k}, "w1": {30 + k, 40 + k},
		"W0": make([]float32, 4), "W1": make([]float32, 4),
		"a0": make([]float32, 4), "a1": make([]float32, 4), "d1": make([]float32, 4), "done": make([]float32, 1),
		"g0": make([]float32, 4), "g1": make([]float32, 4), "G0": make([]float32, 4), "G1": make([]float32, 4),
	}
	tensors := func(name string) (comm.Buffer, error) {
		b, ok := bufs[name]
		if !ok {
			return nil, fmt.Errorf("no tensor %q", name)
		}
		return comm.Float32s(b), nil
	}
	var order []string
	kernel := func(_ context.Context, n *stepgraph.Node) error {
		if before != nil {
			before(c.Rank(), n.Name)
		}
		order = append(order, n.Name)
		switch n.Name {
		case "b1", "b0":
			// A "gradient" that depends on the rank and on the gathered
			// parameters, so wrong data anywhere shows.
			W := bufs["W1"]
			if n.Name == "b0" {
				W = bufs["W0"]
			}
			gr := bufs["g"+n.Name[1:]]
			for i := range gr {
				gr[i] = W[i] + k
			}
		}
		return nil
	}
	if _, err := gr.Step(ctx, 1, tensors, kernel); err != nil {
		return err
	}
	if got := fmt.Sprint(order); got != "[f0 f1 b1 b0 step]" {
		return fmt.Errorf("compute order %s", got)
	}
	if got := fmt.Sprint(bufs["W0"], bufs["W1"]); got != "[10 20 11 21] [30 40 31 41]" {
		return fmt.Errorf("gathered %s", got)
	}
	// G = sum over ranks q of (W[i] + q) = 2·W[i] + 1.
	if got := fmt.Sprint(bufs["G0"], bufs["G1"]); got != "[21 41 23 43] [61 81 63 83]" {
		return fmt.Errorf("reduced %s", got)
	}
	return nil
}

// runRanks runs one rank per communicator at once and reports each rank's
// error; a rank that fails aborts its communicator so the others are
// released rather than left waiting.
func runRanks(t *testing.T, comms []*comm.Comm, rank func(*comm.Comm) error) {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			errs[r] = rank(c)
			if errs[r] != nil {
				c.Abort(errs[r])
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
