package overlap

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// hsdpStep is hybrid sharding's gradient path on 4 ranks: shard groups
// {0,1} and {2,3}, replica groups {0,2} and {1,3}. Each rank's gradient is
// reduce-scattered on its shard group, and that result — another
// collective's output — all-reduced on its replica group.
const hsdpStep = `group shard 2
group replica 2
region layers.0
tensor w 32 input
compute bwd bwd layers.0 10us reads=w writes=g
start rs bwd layers.0 reduce_scatter shard f32 g>gs:32
wait rs.w bwd layers.0 of=rs
start ar bwd layers.0 all_reduce replica f32 gs>G:16
compute other bwd layers.0 10us reads=w writes=o
wait ar.w opt - of=ar
compute step opt - 10us reads=G writes=done`

// startGroups connects, on each of 4 in-memory ranks, a communicator for its
// shard group and one for its replica group over the rank's one endpoint.
func startGroups(ctx context.Context, t *testing.T) []map[string]Comm {
	t.Helper()
	nw := commtest.NewNetwork()
	addrs := []string{"r0:1", "r1:1", "r2:1", "r3:1"}
	eps := make([]comm.Transport, 4)
	for r := range eps {
		eps[r] = nw.Endpoint(addrs[r])
	}
	out := make([]map[string]Comm, 4)
	var mu sync.Mutex
	var all []*comm.Comm
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			shard := []int{r &^ 1, r | 1}    // {0,1} or {2,3}
			replica := []int{r & 1, r&1 + 2} // {0,2} or {1,3}
			m := map[string]Comm{}
			for _, gr := range []struct {
				name  string
				ranks []int
			}{{"shard", shard}, {"replica", replica}} {
				me := 0
				if gr.ranks[1] == r {
					me = 1
				}
				cfg := comm.LocalConfig()
				cfg.Tag, cfg.Deterministic = gr.name, true
				c, err := comm.New(ctx, comm.NewStaticGroup(me, []string{addrs[gr.ranks[0]], addrs[gr.ranks[1]]}, nil), eps[r], cfg)
				if err != nil {
					errs[r] = err
					return
				}
				mu.Lock()
				all = append(all, c)
				mu.Unlock()
				m[gr.name] = c
			}
			out[r] = m
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

// TestDependentCollectives: the replica all-reduce reads the shard
// reduce-scatter's output, so the runner must issue it only after that
// reduce-scatter's wait; issued earlier it reduces stale data. Every
// element of G is then the sum of all four ranks' gradients at this rank's
// shard, on every step and in every mode.
func TestDependentCollectives(t *testing.T) {
	g, err := stepgraph.Parse(hsdpStep)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{Native, Grouped, Serial} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			comms := startGroups(ctx, t)
			errs := make([]error, 4)
			var wg sync.WaitGroup
			for r := range 4 {
				wg.Go(func() { errs[r] = hsdpRank(ctx, g, comms[r], r, mode) })
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func hsdpRank(ctx context.Context, g *stepgraph.Graph, comms map[string]Comm, rank int, mode Mode) (err error) {
	cfg := DefaultConfig()
	cfg.Mode = mode
	gr, err := NewGraphRunner(g, comms, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			for _, c := range comms {
				c.(*comm.Comm).Abort(err)
			}
		}
		_ = gr.Close()
	}()
	bufs := map[string][]float32{
		"w": make([]float32, 8), "g": make([]float32, 8), "gs": make([]float32, 4), "G": make([]float32, 4),
		"o": make([]float32, 1), "done": make([]float32, 1),
	}
	tensors := func(name string) (comm.Buffer, error) {
		b, ok := bufs[name]
		if !ok {
			return nil, fmt.Errorf("no tensor %q", name)
		}
		return comm.Float32s(b), nil
	}
	for step := 1; step <= 3; step++ {
		kernel := func(_ context.Context, n *stepgraph.Node) error {
			switch n.Name {
			case "bwd":
				// Rank- and step-dependent, so stale data from a previous
				// step or a missing contribution shows.
				for i := range bufs["g"] {
					bufs["g"][i] = float32((rank + 1) * (i + 1) * step)
				}
			case "other":
				time.Sleep(time.Millisecond) // the replica all-reduce runs meanwhile
			}
			return nil
		}
		if _, err := gr.Step(ctx, step, tensors, kernel); err != nil {
			return err
		}
		s := rank & 1 // shard rank
		for j, v := range bufs["G"] {
			// Σ over ranks r of (r+1)·(4s+j+1)·step = 10·(4s+j+1)·step.
			if want := float32(10 * (4*s + j + 1) * step); v != want {
				return fmt.Errorf("step %d: G[%d] = %v, want %v (G = %v)", step, j, v, want, bufs["G"])
			}
		}
	}
	return nil
}
