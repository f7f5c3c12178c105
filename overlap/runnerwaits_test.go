package overlap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// gradsGraph: n gradients, each all-reduced by its own start, waited, and
// read by one optimizer; capB ≥ 0 buckets them (passes) under that cap.
func gradsGraph(t testing.TB, n int, bytes int64, capB int64) *stepgraph.Graph {
	t.Helper()
	gb := stepgraph.NewBuilder().Group("g", 2).Region("m")
	var ins, outs []string
	for i := range n {
		ins, outs = append(ins, fmt.Sprintf("t%d", i)), append(outs, fmt.Sprintf("T%d", i))
	}
	gb.Compute("backward", buckets.Backward, "m", time.Millisecond, nil, ins)
	for i := range n {
		gb.Start(fmt.Sprintf("ar%d", i), buckets.Backward, "m", buckets.AllReduce, "g", "f32",
			[]stepgraph.Member{{In: ins[i], Out: outs[i], Bytes: bytes}})
	}
	for i := range n {
		gb.Wait(fmt.Sprintf("ar%d.w", i), fmt.Sprintf("ar%d", i), "m")
	}
	gb.Compute("optimizer", buckets.Optimizer, "m", 0, outs, []string{"updated"})
	g, err := gb.Graph()
	if err != nil {
		t.Fatal(err)
	}
	if capB >= 0 {
		bc := buckets.DefaultConfig()
		bc.CapBytes = capB
		if g, err = stepgraph.BucketBlocks(g, bc); err != nil {
			t.Fatal(err)
		}
		if g, err = stepgraph.BucketOverlap(g, bc); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// TestRunnerWaitsOncePerCollective: a compute that reads several outputs
// of one collective waits for it once (the executor's wait scatters every
// member), and still once for each collective it reads from. The step's
// results stay right: every output holds the all-reduced value when the
// optimizer reads it.
func TestRunnerWaitsOncePerCollective(t *testing.T) {
	const n, bytes = 12, 400
	for _, tc := range []struct {
		name  string
		capB  int64
		waits int // collectives the optimizer reads from
	}{
		{"per tensor", -1, n},
		{"one bucket", 1 << 20, 1},
		{"three buckets", 4 * bytes, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := gradsGraph(t, n, bytes, tc.capB)
			starts := map[string]bool{}
			opt := -1
			for i, nd := range g.Nodes {
				switch {
				case nd.Kind == stepgraph.Start:
					starts[nd.Name] = true
				case nd.Name == "optimizer":
					opt = i
				}
			}
			if len(starts) != tc.waits {
				t.Fatalf("the passes made %d collectives, want %d", len(starts), tc.waits)
			}
			runTwoRanks(t, g, func(r *GraphRunner) {
				var of []int
				for _, out := range r.waitsBefore[opt] {
					of = append(of, r.outStart[out])
				}
				slices.Sort(of)
				if len(of) != tc.waits || len(slices.Compact(of)) != tc.waits {
					t.Errorf("the optimizer waits for %v (start nodes %v): want one output of each of the %d collectives", r.waitsBefore[opt], of, tc.waits)
				}
			})
		})
	}
}

// runTwoRanks runs g for 2 steps on 2 in-process ranks, every gradient of
// rank r filled with r+1 and checked by the optimizer to hold 3 (the sum),
// then calls check with rank 0's runner.
func runTwoRanks(t *testing.T, g *stepgraph.Graph, check func(*GraphRunner)) {
	t.Helper()
	comms := eqComms(context.Background(), t, g, 2)
	errs := make([]error, 2)
	runners := make([]*GraphRunner, 2)
	done := make(chan int, 2)
	for rk := range 2 {
		r, err := NewGraphRunner(g, comms[rk], DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		runners[rk] = r
		go func() {
			defer func() { done <- rk }()
			bufs := map[string][]float32{}
			tens := func(name string) (comm.Buffer, error) {
				if name == "updated" {
					return comm.Float32s(nil), nil
				}
				key := name[1:] // tK and TK: reduced in place
				if bufs[key] == nil {
					bufs[key] = make([]float32, 100)
				}
				return comm.Float32s(bufs[key]), nil
			}
			kernel := func(_ context.Context, nd *stepgraph.Node) error {
				switch nd.Name {
				case "backward":
					for _, w := range nd.Writes {
						b, _ := tens(w)
						for i := range comm.AsFloat32(b) {
							comm.AsFloat32(b)[i] = float32(rk + 1)
						}
					}
				case "optimizer":
					for _, rd := range nd.Reads {
						b, _ := tens(rd)
						for i, v := range comm.AsFloat32(b) {
							if v != 3 {
								return fmt.Errorf("rank %d: %s[%d] = %v when the optimizer read it, want 3", rk, rd, i, v)
							}
						}
					}
				}
				return nil
			}
			for step := range 2 {
				if _, err := r.Step(context.Background(), step, tens, kernel); err != nil {
					errs[rk] = err
					return
				}
			}
		}()
	}
	<-done
	<-done
	for _, r := range runners {
		r.Close()
	}
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	check(runners[0])
}

// TestBindSparesTensors: members whose buffers the program bound (here
// View's slots, as DDP's gradient_as_bucket_view) are never asked of
// Tensors, and the step's results are right; unbinding asks again; only
// a collective's tensors may be bound.
func TestBindSparesTensors(t *testing.T) {
	const n, bytes = 12, 400
	g := gradsGraph(t, n, bytes, 1<<20)
	comms := eqComms(context.Background(), t, g, 2)
	errs := make([][]error, 2)
	var wg sync.WaitGroup
	for rk := range 2 {
		r, err := NewGraphRunner(g, comms[rk], DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.Bind("updated", comm.Float32s(nil)); !errors.Is(err, ErrUsage) {
			t.Errorf("Bind of a compute's output: %v, want ErrUsage", err)
		}
		views := map[string]comm.Buffer{}
		for i := range n {
			v, ok := r.View(fmt.Sprintf("t%d", i))
			if !ok {
				t.Fatalf("no view of t%d", i)
			}
			views[fmt.Sprintf("t%d", i)], views[fmt.Sprintf("T%d", i)] = v, v
			for _, name := range []string{fmt.Sprintf("t%d", i), fmt.Sprintf("T%d", i)} {
				if err := r.Bind(name, v); err != nil {
					t.Fatal(err)
				}
			}
		}
		tens := func(name string) (comm.Buffer, error) {
			if name == "updated" {
				return comm.Float32s(nil), nil
			}
			return nil, fmt.Errorf("Tensors asked for %s", name)
		}
		kernel := func(_ context.Context, nd *stepgraph.Node) error {
			for _, name := range append(append([]string(nil), nd.Reads...), nd.Writes...) {
				v, ok := views[name]
				if !ok {
					continue
				}
				for i := range comm.AsFloat32(v) {
					switch {
					case nd.Name == "backward":
						comm.AsFloat32(v)[i] = float32(rk + 1)
					case comm.AsFloat32(v)[i] != 3:
						return fmt.Errorf("rank %d: %s[%d] = %v, want 3", rk, name, i, comm.AsFloat32(v)[i])
					}
				}
			}
			return nil
		}
		wg.Go(func() {
			for step := range 2 {
				_, err := r.Step(context.Background(), step, tens, kernel)
				errs[rk] = append(errs[rk], err)
			}
			// Unbound, T0 is asked of Tensors again (both ranks fail
			// there, before anything is issued).
			if err := r.Bind("T0", nil); err != nil {
				errs[rk] = append(errs[rk], err)
				return
			}
			_, err := r.Step(context.Background(), 2, tens, kernel)
			errs[rk] = append(errs[rk], err)
		})
	}
	wg.Wait()
	for rk, es := range errs {
		if len(es) != 3 || es[0] != nil || es[1] != nil {
			t.Errorf("rank %d: steps returned %v, want nil, nil, then Tensors' error for T0", rk, es)
			continue
		}
		if es[2] == nil || !strings.Contains(es[2].Error(), "Tensors asked for T0") {
			t.Errorf("rank %d: step after unbinding T0: %v, want Tensors asked for T0", rk, es[2])
		}
	}
}
