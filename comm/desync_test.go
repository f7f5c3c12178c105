package comm_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
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

// The check's cost at 64 ranks: 63 ranks wait in AllReduce #2 while rank
// 63 is 1.2 s late. Coordinated (every waiting rank asks group rank 0,
// which gathers once per round), a round of checks costs about 2(n-1)
// side-channel queries, one connection each over Endpoint; asking every
// peer from every waiting rank costs n-1 per rank, (n-1)² a round. Both run
// here side by side; the stall is named either way.
func TestCheckCostAt64(t *testing.T) {
	if testing.Short() {
		t.Skip("64 communicators, 2 stalls of 1.2 s")
	}
	if comm.RaceEnabled {
		// 64 ranks' goroutines under the detector on a small host starve
		// rank 0's gather past the askers' wait, and they fall back to
		// asking everyone: the figure would measure the host.
		t.Skip("a cost measurement; run without -race (make test-desync)")
	}
	const n, late = 64, 63
	perRound, perCheck := map[bool]float64{}, map[bool]float64{}
	for _, direct := range []bool{true, false} {
		comm.SetDirectCheck(direct)
		cfg := comm.LocalConfig()
		cfg.DesyncCheckAfter = 300 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		comms := commtest.StartComms(ctx, t, n, cfg)
		errs := onEach(t, n, func(r int) error {
			buf := comm.Float32s(make([]float32, 2))
			for i := range 2 {
				if i == 1 && r == late {
					time.Sleep(1200 * time.Millisecond)
				}
				if err := comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		cancel()
		var checks, queries, bytes int64
		for r, c := range comms {
			if errs[r] != nil {
				t.Errorf("rank %d: %v", r, errs[r])
			}
			_ = c.Close() // waits for its watchdog: no check half counted
			ck, q, b := comm.SideQueries(c)
			checks, queries, bytes = checks+ck, queries+q, bytes+b
		}
		// A round is one check by each of the 63 waiting ranks.
		rounds := float64(checks) / float64(n-1)
		if checks == 0 {
			t.Fatalf("direct=%v: no rank checked during a 1.2 s stall", direct)
		}
		perRound[direct] = float64(queries) / rounds
		perCheck[direct] = float64(queries) / float64(checks)
		t.Logf("direct=%v: %d checks (%.1f rounds), %d queries (%.0f a round), %.1f MB answered (%.2f MB a round)",
			direct, checks, rounds, queries, perRound[direct], float64(bytes)/1e6, float64(bytes)/1e6/rounds)
	}
	comm.SetDirectCheck(false)
	// Direct: every check asks the n-1 others. Coordinated: one query per
	// check, plus rank 0's gathers of n-1, a few per round at most.
	if perCheck[true] != n-1 {
		t.Errorf("direct: %.1f queries a check, want n-1 = %d", perCheck[true], n-1)
	}
	if perCheck[false] > perCheck[true]/5 {
		t.Errorf("coordinated: %.1f queries a check, want at most a fifth of direct's %.1f", perCheck[false], perCheck[true])
	}
}

// A call whose frames look alike on the wire is still a desync when the
// kinds differ: AllReduce of m elements on one rank against ReduceScatter
// of 2m into m on the other carries the same dtype, op, count and byte
// totals in every frame, so only the kind in the header tells them apart.
// Both ranks must get a DesyncError naming both kinds, not a result.
func TestDesyncKindOnly(t *testing.T) {
	const m = 64
	for _, tcp := range []bool{false, true} {
		cfg := comm.LocalConfig()
		j := newNetJob(t, 2, cfg, tcp)
		abortAll(t, j)
		errs := onEach(t, 2, func(r int) error {
			ctx := context.Background()
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if r == 0 {
				buf := comm.Float32s(make([]float32, m))
				return j.comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(wctx)
			}
			send, recv := comm.Float32s(make([]float32, 2*m)), comm.Float32s(make([]float32, m))
			return j.comms[r].ReduceScatter(ctx, send, recv, comm.Sum).Wait(wctx)
		})
		for r, err := range errs {
			var de *comm.DesyncError
			if !errors.As(err, &de) {
				t.Fatalf("tcp=%v rank %d: %v, want a DesyncError", tcp, r, err)
			}
			kinds := []comm.Kind{de.Mine.Kind, de.Theirs.Kind}
			if !slices.Contains(kinds, comm.KindAllReduce) || !slices.Contains(kinds, comm.KindReduceScatter) {
				t.Errorf("tcp=%v rank %d: %v, want AllReduce against ReduceScatter", tcp, r, err)
			}
		}
	}
}

// A failed communicator's flight records go to the log as a warning only
// when the log is their one copy. With a flight directory (gorun sets one
// and prints a table merged from every rank's file) the file is written and
// the log gets them at debug level: one injected kill must not print each
// survivor's records before gorun's table.
func TestFlightDumpLogOnlyWithoutFile(t *testing.T) {
	for _, withDir := range []bool{false, true} {
		var logs syncBuf
		cfg := comm.LocalConfig()
		cfg.Logger = zerolog.New(&logs).Level(zerolog.WarnLevel)
		dir := ""
		if withDir {
			dir = t.TempDir()
			cfg.FlightDir = dir
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		comms := commtest.StartComms(ctx, t, 2, cfg)
		onEach(t, 2, func(r int) error {
			buf := comm.Float32s(make([]float32, 4))
			return comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx)
		})
		comms[0].Abort(errors.New("test: rank 0 gives up"))
		cancel()
		files, _ := filepath.Glob(filepath.Join(dir, "flight-*.json"))
		logged := strings.Contains(logs.String(), "flight recorder (latest last)")
		switch {
		case withDir && len(files) == 0:
			t.Errorf("flight dir set: no dump file written")
		case withDir && logged:
			t.Errorf("flight dir set: the records were also logged as a warning:\n%s", logs.String())
		case !withDir && !logged:
			t.Errorf("no flight dir: the records were not logged:\n%s", logs.String())
		}
	}
}

// A call issued under WithLabel carries the label into its flight record,
// however the label's context is wrapped; one issued without it carries
// none (Go callers' records are as before). The merged table and the
// disagreement it names show each rank's label.
func TestFlightRecordLabels(t *testing.T) {
	a, err := comm.RegisterLabel("all_reduce_coalesced")
	if err != nil {
		t.Fatal(err)
	}
	b, err := comm.RegisterLabel("reduce_scatter_tensor")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := comm.RegisterLabel("all_reduce_coalesced"); again != a || a == b {
		t.Errorf("labels %d, %d, %d: a name registered twice must keep its label", a, b, again)
	}
	if _, err := comm.RegisterLabel(""); err == nil {
		t.Error("an empty label name was accepted")
	}
	j := newNetJob(t, 2, comm.LocalConfig(), false)
	onEach(t, 2, func(r int) error {
		bg := context.Background()
		buf := comm.Float32s(make([]float32, 8))
		if err := j.comms[r].AllReduce(bg, buf, buf, comm.Sum).Wait(bg); err != nil {
			return err
		}
		ctx := comm.IssuerWaits(comm.WithLabel(bg, a))
		if err := j.comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(comm.WithLabel(bg, b), time.Minute)
		defer cancel()
		return j.comms[r].Barrier(ctx).Wait(ctx)
	})
	var dumps []comm.FlightDump
	for r := range 2 {
		recs := j.comms[r].FlightRecords()
		var got []string
		for _, rec := range recs {
			got = append(got, rec.Label)
		}
		if want := []string{"", "all_reduce_coalesced", "reduce_scatter_tensor"}; !slices.Equal(got, want) {
			t.Errorf("rank %d: labels %q, want %q", r, got, want)
		}
		dumps = append(dumps, comm.FlightDump{Group: "g", Rank: r, Size: 2, Records: recs})
	}
	// The same records, as if rank 1 had issued its second call from
	// another torch call: the table names both.
	dumps[1].Records = slices.Clone(dumps[1].Records)
	dumps[1].Records[1].Label = "all_reduce"
	dumps[1].Records[1].Call.Count = 4
	table := comm.FlightTable(dumps)
	for _, want := range []string{
		"all_reduce_coalesced AllReduce(float32 sum,8) done",
		"first disagreement at #2: rank 0 called all_reduce_coalesced AllReduce(float32 sum, count=8) #2, " +
			"rank 1 called all_reduce AllReduce(float32 sum, count=4) #2",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// A traced communicator keeps every call's record as it ends, past the
// flight recorder's ring, up to its limit, and counts the rest; an
// untraced one keeps none.
func TestCallTrace(t *testing.T) {
	cfg := comm.LocalConfig()
	cfg.FlightRecords = 2
	j := newNetJob(t, 2, cfg, false)
	j.comms[0].StartCallTrace(5)
	l, err := comm.RegisterLabel("all_reduce")
	if err != nil {
		t.Fatal(err)
	}
	onEach(t, 2, func(r int) error {
		ctx := comm.WithLabel(context.Background(), l)
		buf := comm.Float32s(make([]float32, 8))
		for range 6 {
			if err := j.comms[r].AllReduce(ctx, buf, buf, comm.Sum).Wait(ctx); err != nil {
				return err
			}
		}
		return j.comms[r].Barrier(context.Background()).Wait(context.Background())
	})
	recs, dropped := j.comms[0].CallTrace()
	if len(recs) != 5 || dropped != 2 {
		t.Fatalf("%d records, %d dropped; want 5 and 2", len(recs), dropped)
	}
	for i, rec := range recs {
		if rec.Call.Seq != uint64(i+1) || rec.Call.Kind != comm.KindAllReduce || rec.Label != "all_reduce" ||
			rec.State != comm.StateDone || rec.Ended.Before(rec.Started) || rec.Started.Before(rec.Issued) {
			t.Errorf("record %d: %+v", i, rec)
		}
	}
	if recs, dropped := j.comms[1].CallTrace(); recs != nil || dropped != 0 {
		t.Errorf("untraced communicator: %d records, %d dropped", len(recs), dropped)
	}
}
