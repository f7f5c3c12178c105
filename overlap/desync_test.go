package overlap

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
)

// reversedGroups is a GroupBackend with a bug: it issues each set's calls
// last first, as a backend that trusted NCCL's group semantics (any order
// inside a group) would on comm's engine, where order is the position.
type reversedGroups struct{ reordered atomic.Int32 }

func (b *reversedGroups) IssueGroup(ctx context.Context, cm Comm, set []Call) []Handle {
	hs := make([]Handle, len(set))
	for i := len(set) - 1; i >= 0; i-- {
		hs[i] = set[i].Issue(ctx, cm)
	}
	if len(set) > 1 {
		b.reordered.Add(1)
	}
	return hs
}

// A desync inside a grouped call (one rank's backend issues a bucket set in
// another order) ends on every rank with a *comm.DesyncError naming
// the two calls, within the communicator's desync check, never a hang.
func TestGroupedDesync(t *testing.T) {
	const n = 3
	items := []buckets.Item{
		{Tensor: "g1", Out: "G1", Bytes: 48, Op: buckets.ReduceScatter, Direction: buckets.Backward, Region: "l0"},
		{Tensor: "a", Bytes: 12, Op: buckets.AllReduce, Direction: buckets.Backward, Region: "l0"},
		{Tensor: "p", Out: "P", Bytes: 40, Op: buckets.AllGather, Direction: buckets.Backward, Region: "l0"},
	}
	for i := range items {
		items[i].Group, items[i].DType = "world", "f32"
	}
	// Three ops that cannot share a bucket: one set of three calls.
	plan, err := buckets.Assign(items, []string{"l0"}, buckets.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms := startComms(ctx, t, n)
	bad := &reversedGroups{}
	errs := make([]error, n)
	took := make([]time.Duration, n)
	done := make(chan int, n)
	for r, c := range comms {
		go func() {
			defer func() { done <- r }()
			cfg := DefaultConfig()
			cfg.Mode = Grouped
			if r == n-1 {
				cfg.Backend = bad
			}
			ex, err := New(plan, map[string]Comm{"world": c}, cfg)
			if err != nil {
				errs[r] = err
				return
			}
			defer ex.Close()
			start := time.Now()
			defer func() { took[r] = time.Since(start) }()
			if errs[r] = ex.Begin(0); errs[r] != nil {
				return
			}
			for _, x := range []struct {
				name    string
				in, out []float32
			}{{"g1", make([]float32, 12), make([]float32, 4)}, {"a", make([]float32, 3), nil}, {"p", make([]float32, 10), make([]float32, 10*n)}} {
				if x.out == nil {
					x.out = x.in
				}
				if errs[r] = ex.Ready(ctx, x.name, comm.Float32s(x.in), comm.Float32s(x.out)); errs[r] != nil {
					return
				}
			}
			_, errs[r] = ex.Finish(ctx)
		}()
	}
	for range n {
		<-done
	}
	if bad.reordered.Load() == 0 {
		t.Fatal("the plan gave no set of two or more calls to reorder; the test shows nothing")
	}
	for r, err := range errs {
		var de *comm.DesyncError
		if !errors.As(err, &de) || took[r] > 3*time.Second {
			t.Errorf("rank %d after %v: %v, want a DesyncError within 3 s", r, took[r], err)
			continue
		}
		kinds := []comm.Kind{de.Mine.Kind, de.Theirs.Kind}
		if de.Mine == de.Theirs || !slices.ContainsFunc(kinds, func(k comm.Kind) bool {
			return k == comm.KindAllReduce || k == comm.KindReduceScatter || k == comm.KindAllGather
		}) {
			t.Errorf("rank %d: %v names no two different bucket calls", r, de)
		}
		t.Logf("rank %d after %v: %v", r, took[r].Round(time.Millisecond), err)
	}
}
