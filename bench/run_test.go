package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
)

// hangGuard bounds a whole in-memory job: a hang fails the test instead of
// stalling the suite. Generous, because the machine is shared.
const hangGuard = 2 * time.Minute

// memRun runs cfg on n ranks over commtest's in-memory network and returns
// rank 0's table, every rank's report and error. corrupt (may be nil) is the
// checker's test hook.
func memRun(t *testing.T, n int, cfg Config, corrupt func(int, bool, []byte)) (string, []*Report, []error) {
	t.Helper()
	nw := commtest.NewNetwork()
	addrs := make([]string, n)
	ranks := make([]RankInfo, n)
	for r := range n {
		addrs[r] = fmt.Sprintf("mem%d:1", r)
		ranks[r] = RankInfo{Rank: r, Host: "memhost", PID: 1000 + r}
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	ccfg := comm.LocalConfig()
	ccfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	comms := make([]*comm.Comm, n)
	for r := range n {
		c, err := comm.New(ctx, commtest.NewStaticGroup(r, addrs, nil), nw.Endpoint(addrs[r]), ccfg)
		if err != nil {
			t.Fatal(err)
		}
		comms[r] = c
	}
	var out bytes.Buffer
	reps := make([]*Report, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		c := cfg
		if r == 0 {
			c.Out = &out
		}
		wg.Go(func() { reps[r], errs[r] = run(ctx, c, comms[r], comms[r], ranks, corrupt) })
	}
	wg.Wait()
	for _, c := range comms {
		wg.Go(func() { _ = c.Close() })
	}
	wg.Wait()
	return out.String(), reps, errs
}

func smallConfig(op Collective) Config {
	cfg := DefaultConfig()
	cfg.Op = op
	cfg.MinBytes, cfg.MaxBytes, cfg.StepFactor = 8, 4<<10, 8
	cfg.Iters, cfg.Warmup = 2, 1
	return cfg
}

// Every operation, every type and every reduction on 1 to 4 ranks gives
// exactly the expected values (the in-memory network is exact, so any
// wrong element is a bug in the checker's arithmetic or in comm).
func TestRunAllOpsCorrect(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for _, op := range Collectives {
			t.Run(fmt.Sprintf("%s/np%d", op, n), func(t *testing.T) {
				cfg := smallConfig(op)
				if op == Broadcast || op == Reduce {
					cfg.Root = n - 1
				}
				out, reps, errs := memRun(t, n, cfg, nil)
				for r, err := range errs {
					if err != nil {
						t.Fatalf("rank %d: %v\n%s", r, err, out)
					}
				}
				rep := reps[0]
				if len(rep.Rows) != len(cfg.Sizes()) {
					t.Fatalf("%d rows for %d sizes\n%s", len(rep.Rows), len(cfg.Sizes()), out)
				}
				for _, row := range rep.Rows {
					if op != Barrier && row.OutOfPlace.Wrong != 0 {
						t.Errorf("size %d: %d wrong", row.Bytes, row.OutOfPlace.Wrong)
					}
					if (op == SendRecv || op == Barrier) != (row.InPlace == nil) {
						t.Errorf("size %d: in-place presence wrong: %+v", row.Bytes, row.InPlace)
					}
					if row.OutOfPlace.TimeUs <= 0 {
						t.Errorf("size %d: time %v", row.Bytes, row.OutOfPlace.TimeUs)
					}
				}
				for r := 1; r < n; r++ {
					if len(reps[r].Rows) != len(rep.Rows) || reps[r].Rows[0].OutOfPlace.TimeUs != rep.Rows[0].OutOfPlace.TimeUs {
						t.Errorf("rank %d's report differs from rank 0's", r)
					}
				}
			})
		}
	}
}

func TestRunTypesAndOps(t *testing.T) {
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			for _, coll := range []Collective{AllReduce, ReduceScatter, Reduce} {
				t.Run(fmt.Sprintf("%v/%v/%v", coll, dt, op), func(t *testing.T) {
					cfg := smallConfig(coll)
					cfg.DType, cfg.RedOp = dt, op
					cfg.MinBytes, cfg.MaxBytes = 512, 512
					out, _, errs := memRun(t, 3, cfg, nil)
					for r, err := range errs {
						if err != nil {
							t.Fatalf("rank %d: %v\n%s", r, err, out)
						}
					}
				})
			}
		}
	}
}

// The checker catches one corrupted element on one rank, in either
// placement, and the whole job agrees the run failed.
func TestCheckerCatchesCorruption(t *testing.T) {
	for _, op := range []Collective{AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, SendRecv} {
		for _, inPlace := range []bool{false, true} {
			if inPlace && op == SendRecv {
				continue
			}
			t.Run(fmt.Sprintf("%s/inplace=%v", op, inPlace), func(t *testing.T) {
				cfg := smallConfig(op)
				cfg.MinBytes, cfg.MaxBytes = 1024, 1024
				victim := 1 // reduce's root is 0: corrupt the root for reduce
				if op == Reduce {
					victim = 0
				}
				corrupt := func(rank int, ip bool, out []byte) {
					if rank == victim && ip == inPlace {
						out[len(out)/2] ^= 0x40
					}
				}
				out, reps, errs := memRun(t, 3, cfg, corrupt)
				for r, err := range errs {
					var we *WrongError
					if !errors.As(err, &we) || we.Wrong != 1 || we.Rows != 1 {
						t.Fatalf("rank %d: err = %v, want one wrong element\n%s", r, err, out)
					}
				}
				m := reps[0].Rows[0].OutOfPlace
				if inPlace {
					m = reps[0].Rows[0].InPlace
				}
				if m.Wrong != 1 {
					t.Errorf("row shows %d wrong", m.Wrong)
				}
				if !bytes.Contains([]byte(out), []byte("# Out of bounds values : 1 FAILED")) {
					t.Errorf("footer does not report the failure:\n%s", out)
				}
			})
		}
	}
}

// The progress line names the size and what is left, rewrites itself in
// place and is erased at the end; only rank 0 writes it.
func TestProgress(t *testing.T) {
	cfg := smallConfig(AllReduce)
	var progress bytes.Buffer
	cfg.Progress = &progress
	_, _, errs := memRun(t, 2, cfg, nil)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	p := progress.String()
	for _, want := range []string{"\r\033[Kgorun bench: allreduce 8, size 1 of 4 (3 left)", "allreduce 4K, size 4 of 4 (0 left)"} {
		if !strings.Contains(p, want) {
			t.Errorf("progress %q lacks %q", p, want)
		}
	}
	if strings.Count(p, "size 1 of") != 1 || !strings.HasSuffix(p, "\r\033[K") || strings.Contains(p, "\n") {
		t.Errorf("progress %q: want one line per size from rank 0, erased at the end", p)
	}
}

func TestNoCheck(t *testing.T) {
	cfg := smallConfig(AllReduce)
	cfg.Check = false
	out, reps, errs := memRun(t, 2, cfg, func(_ int, _ bool, out []byte) { out[0] ^= 1 })
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if reps[0].Rows[0].OutOfPlace.Wrong != -1 {
		t.Errorf("wrong = %d, want -1 (not checked)", reps[0].Rows[0].OutOfPlace.Wrong)
	}
	if !bytes.Contains([]byte(out), []byte("N/A")) {
		t.Errorf("unchecked rows should print N/A:\n%s", out)
	}
}

func TestTransportShmRefusedOverMem(t *testing.T) {
	cfg := smallConfig(AllReduce)
	cfg.Transport = TransportShm
	_, _, errs := memRun(t, 2, cfg, nil)
	for r, err := range errs {
		if !errors.Is(err, ErrNoShm) {
			t.Errorf("rank %d: %v, want ErrNoShm", r, err)
		}
	}
}

func TestRootOutsideGroup(t *testing.T) {
	cfg := smallConfig(Broadcast)
	cfg.Root = 5
	_, _, errs := memRun(t, 2, cfg, nil)
	var ue *UsageError
	if !errors.As(errs[0], &ue) {
		t.Fatalf("err = %v, want a usage error", errs[0])
	}
}
