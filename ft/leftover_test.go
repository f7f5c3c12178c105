package ft_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
)

// TestLeftoverConnectionNotReused: a quorum's attempt that failed half
// way leaves connections parked at its peers' endpoints (the lowest member
// dialed; the others never took them). The next quorum over the same
// members builds its communicators afresh, never over one of those: the
// quorum id is in every communicator's tag. Both communicators are
// checked, the quorum's (replicas without groups) and a replica group's
// (HSDP), each by a collective of the next quorum that must give the
// right answer on every member within a bound.
func TestLeftoverConnectionNotReused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		group int
	}{{"quorum", 1}, {"replica group", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, ms := joinGroups(ctx, t, 2, tc.group)
			quorums := func() []ft.Quorum {
				t.Helper()
				qs, errs := make([]ft.Quorum, 2), make([]error, 2)
				var wg sync.WaitGroup
				for r := range ms {
					wg.Go(func() { qs[r], errs[r] = ms[r].Quorum(ctx) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				return qs
			}
			qs := quorums()
			if err := ms[0].LeaveConnections(ctx, qs[0], tc.group > 1); err != nil {
				t.Fatal(err)
			}
			// The quorum fails (both vote no), and the next one goes on
			// over the same members.
			for r := range ms {
				ms[r].ReportError(errors.New("the step failed"))
				if ok, err := ms[r].ShouldCommit(ctx); ok || err != nil {
					t.Fatalf("replica %d: ShouldCommit = %v, %v; want false, nil", r, ok, err)
				}
			}
			next := quorums()
			if next[0].ID == qs[0].ID || !slices.Equal(next[0].Participants, qs[0].Participants) {
				t.Fatalf("next quorum %d over %v, want a new id over %v", next[0].ID, next[0].Participants, qs[0].Participants)
			}
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			defer ccancel()
			outs, errs := make([][]float32, 2), make([]error, 2)
			var wg sync.WaitGroup
			for r := range ms {
				wg.Go(func() {
					if tc.group > 1 {
						outs[r] = make([]float32, 2)
						errs[r] = ms[r].GroupComm().AllGather(cctx, comm.Float32s([]float32{float32(r + 1)}), comm.Float32s(outs[r])).Wait(cctx)
					} else {
						outs[r] = []float32{float32(r + 1)}
						errs[r] = ms[r].AllReduce(cctx, outs[r], comm.Sum)
					}
				})
			}
			wg.Wait()
			want := []float32{1, 2} // the group's all-gather
			if tc.group == 1 {
				want = []float32{3} // the quorum's all-reduce
			}
			for r := range ms {
				if errs[r] != nil || !slices.Equal(outs[r], want) {
					t.Errorf("replica %d: the next quorum's %s collective gave %v, %v; want %v", r, tc.name, outs[r], errs[r], want)
				}
			}
		})
	}
}
