package comm_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// In-process checks of the side-channel detection over real loopback
// endpoints (the multi-process matrix is in desync_process_test.go).

// Each rank gets the DesyncError turned to its own side: its own call as
// Mine, its side's ranks as MineRanks.
func TestDesyncSidesPerRank(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		cfg := comm.LocalConfig()
		cfg.DesyncCheckAfter = 200 * time.Millisecond
		j := newNetJob(t, 4, cfg, tcp)
		abortAll(t, j) // a broken check must fail here, not hang Close
		errs := onEach(t, 4, func(r int) error {
			ctx := context.Background()
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			buf := comm.Float32s(make([]float32, 16))
			if r >= 2 {
				if err := j.comms[r].Broadcast(ctx, buf, buf, 0).Wait(wctx); err != nil {
					return err
				}
			} else if err := j.comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(wctx); err != nil {
				return err
			}
			return j.comms[r].Barrier(ctx).Wait(wctx)
		})
		for r, err := range errs {
			var de *comm.DesyncError
			if !errors.As(err, &de) {
				t.Fatalf("tcp=%v rank %d: %v, want a DesyncError", tcp, r, err)
			}
			mine, mineRanks, theirRanks := comm.KindAllReduce, []int{0, 1}, []int{2, 3}
			if r >= 2 {
				mine, mineRanks, theirRanks = comm.KindBroadcast, []int{2, 3}, []int{0, 1}
			}
			if de.Rank != r || de.Mine.Kind != mine || !slices.Equal(de.MineRanks, mineRanks) || !slices.Equal(de.TheirRanks, theirRanks) {
				t.Errorf("tcp=%v rank %d: %+v", tcp, r, de)
			}
			if de.Mine.Seq != 1 || de.Theirs.Seq != 1 {
				t.Errorf("tcp=%v rank %d: sequence numbers %d, %d, want 1", tcp, r, de.Mine.Seq, de.Theirs.Seq)
			}
		}
	}
}

// With StallTimeout set, ranks waiting for a rank that never issues the
// call fail with a StallError naming it; without a mismatch there is no
// DesyncError.
func TestStallTimeout(t *testing.T) {
	cfg := comm.LocalConfig()
	cfg.DesyncCheckAfter = 100 * time.Millisecond
	cfg.StallTimeout = 400 * time.Millisecond
	j := newNetJob(t, 3, cfg, false)
	abortAll(t, j)
	start := time.Now()
	errs := onEach(t, 2, func(r int) error {
		ctx := context.Background()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		buf := comm.Float32s(make([]float32, 4))
		return j.comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(wctx)
	})
	took := time.Since(start)
	for r, err := range errs {
		var se *comm.StallError
		if !errors.As(err, &se) || !errors.Is(err, comm.ErrStalled) {
			t.Fatalf("rank %d: %v, want a StallError", r, err)
		}
		if !slices.Equal(se.Behind, []int{2}) || !strings.Contains(se.Report, "rank 2 has not issued a call yet") {
			t.Errorf("rank %d: behind %v, report %q", r, se.Behind, se.Report)
		}
	}
	if took < cfg.StallTimeout || took > 5*time.Second {
		t.Errorf("stall error after %v, want just after %v", took, cfg.StallTimeout)
	}
}

// abortAll aborts every communicator of j when the test ends, before j's
// own cleanup closes them: Close waits for issued calls.
func abortAll(t *testing.T, j *netJob) {
	t.Cleanup(func() {
		for _, c := range j.comms {
			c.Abort(errors.New("test over"))
		}
	})
}

// DesyncCheckAfter <= 0 turns the side channel off: a split that no frame
// reveals then waits (this is what the check is for).
func TestDesyncCheckOff(t *testing.T) {
	cfg := comm.LocalConfig()
	cfg.DesyncCheckAfter = 0
	j := newNetJob(t, 4, cfg, false)
	abortAll(t, j)
	errs := onEach(t, 4, func(r int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		buf := comm.Float32s(make([]float32, 16))
		var h comm.Handle
		if r >= 2 {
			h = j.comms[r].Broadcast(context.Background(), buf, buf, 0)
		} else {
			h = j.comms[r].AllReduce(context.Background(), buf, buf, comm.Sum)
		}
		return h.Wait(ctx)
	})
	for r, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("rank %d: %v, want still waiting after 1.5 s", r, err)
		}
	}
}

// The flight recorder keeps the last FlightRecords calls with their
// sequence numbers and states.
func TestFlightRecords(t *testing.T) {
	cfg := comm.LocalConfig()
	cfg.FlightRecords = 4
	j := newNetJob(t, 2, cfg, false)
	onEach(t, 2, func(r int) error {
		ctx := context.Background()
		buf := comm.Float32s(make([]float32, 8))
		for range 5 {
			if err := j.comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
				return err
			}
		}
		return j.comms[r].Barrier(ctx).Wait(ctx)
	})
	recs := j.comms[0].FlightRecords()
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4", len(recs))
	}
	for i, rec := range recs {
		want := comm.KindAllReduce
		if i == 3 {
			want = comm.KindBarrier
		}
		if rec.Call.Seq != uint64(i+3) || rec.Call.Kind != want || rec.State != comm.StateDone ||
			rec.Issued.IsZero() || rec.Started.Before(rec.Issued) || rec.Ended.Before(rec.Started) ||
			time.Since(rec.Ended) > time.Minute || time.Since(rec.Ended) < 0 {
			t.Errorf("record %d: %+v", i, rec)
		}
	}
}
