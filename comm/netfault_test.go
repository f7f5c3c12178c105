package comm_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/netfault"
)

// armNetFaults arms specs (GORUN_NETFAULT's syntax) for the communicators
// the test creates next, times counted from now, and disarms at the end.
func armNetFaults(t *testing.T, specs string) time.Time {
	t.Helper()
	ss, err := netfault.Decode(specs)
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Now()
	comm.SetNetFaults(&netfault.Plan{Specs: ss, Epoch: epoch})
	t.Cleanup(func() { comm.SetNetFaults(nil) })
	return epoch
}

// allReduceLoop runs float64 sum all-reduces of n elements on every rank
// until until has passed on some rank (the ranks agree through one more
// element of the same all-reduce), checking every element of every result:
// a fault may fail a call, never change its numbers. Calls run under a
// context that ends at until+grace; at least iters iterations run. It
// returns each rank's first error and the longest iteration rank 0 saw.
func allReduceLoop(t *testing.T, comms []*comm.Comm, n, iters int, until time.Time, grace time.Duration) ([]error, time.Duration) {
	size := len(comms)
	var longest time.Duration
	errs := onEach(t, size, func(r int) error {
		ctx, cancel := context.WithDeadline(context.Background(), until.Add(grace))
		defer cancel()
		buf := make([]float64, n+1)
		for it := 0; ; it++ {
			t0 := time.Now()
			for i := range buf[:n] {
				buf[i] = float64(r + i%5 + it)
			}
			buf[n] = 0
			if it+1 < iters || time.Now().Before(until) {
				buf[n] = 1
			}
			if err := comms[r].AllReduce(ctx, comm.Float64s(buf), comm.Float64s(buf), comm.Sum).Wait(ctx); err != nil {
				return err
			}
			for i, v := range buf[:n] {
				if want := float64(size*(size-1)/2 + size*(i%5+it)); v != want {
					t.Errorf("rank %d iteration %d: element %d = %v, want %v (a fault changed the numbers)", r, it, i, v, want)
					return nil
				}
			}
			if r == 0 {
				longest = max(longest, time.Since(t0))
			}
			if buf[n] == 0 {
				return nil
			}
		}
	})
	return errs, longest
}

// Data-plane faults inside the transport, on TCP and shared memory: a
// corrupted frame is refused by its checksum and named by its link, a
// dropped link and a partition that outlasts its lease fail every rank
// naming the peer, a delay and a short partition only slow the job, and no
// result is ever wrong.
func TestNetFaults(t *testing.T) {
	const np = 3
	type tc struct {
		name  string
		specs string
		n     int           // elements per all-reduce
		run   time.Duration // how long the loop runs
		// ok: every rank completes; else every rank fails and check
		// inspects the errors.
		ok    bool
		iters int // at least this many iterations
		// longest: ok cases, the fault's visible cost: rank 0's longest
		// iteration must be at least this (0: no check).
		longest time.Duration
		check   func(t *testing.T, errs []error, took time.Duration)
	}
	cases := []tc{
		{name: "armed, no effect: checksums on every frame", specs: "delay:rank=0:ms=1:at=1h", n: 1 << 18, run: 200 * time.Millisecond, ok: true},
		// Every all-reduce waits for frames rank 1 sends, each held 40 ms.
		{name: "delay only slows", specs: "delay:rank=1:ms=40:at=0s:for=1h", n: 8, iters: 5, ok: true, longest: 35 * time.Millisecond},
		// The iteration that meets the partition waits for it to end.
		{name: "short partition heals", specs: "partition:ranks=0:at=100ms:for=600ms:lease=3s", n: 1024, run: 900 * time.Millisecond, ok: true, longest: 450 * time.Millisecond},
		{name: "corrupt small", specs: "corrupt:rank=1:at=100ms", n: 8, run: 5 * time.Second, check: checkCorrupt},
		{name: "corrupt large", specs: "corrupt:rank=1:peer=2:at=100ms", n: 1 << 18, run: 5 * time.Second, check: checkCorrupt},
		{name: "drop", specs: "drop:rank=1:peer=2:at=200ms", n: 1024, run: 10 * time.Second, check: func(t *testing.T, errs []error, took time.Duration) {
			if !strings.Contains(errs[1].Error(), "dropped by injected fault") || !strings.Contains(errs[1].Error(), "world rank 2") {
				t.Errorf("rank 1 (dropping): %v, want the drop named, against world rank 2", errs[1])
			}
			if !strings.Contains(errs[2].Error(), "world rank 1") {
				t.Errorf("rank 2 (dropped): %v, want world rank 1 named", errs[2])
			}
		}},
		{name: "partition past its lease", specs: "partition:ranks=0:at=100ms:lease=500ms", n: 1024, run: 10 * time.Second, check: func(t *testing.T, errs []error, took time.Duration) {
			for r := 1; r < np; r++ {
				if !strings.Contains(errs[r].Error(), "world rank 0") {
					t.Errorf("rank %d: %v, want world rank 0 (across the cut) named", r, errs[r])
				}
			}
			// Rank 0 is cut from every other rank: it names the lease, or
			// a peer across the cut whose own lease closed the link first
			// (both ends close at the lease; which is first is a race).
			if e := errs[0].Error(); !strings.Contains(e, "lease") && !(strings.Contains(e, "connection closed") && regexp.MustCompile(`world rank [1-9]`).MatchString(e)) {
				t.Errorf("rank 0: %v, want the partition's lease or a peer across the cut named", errs[0])
			}
			if took > 100*time.Millisecond+500*time.Millisecond+3*time.Second {
				t.Errorf("took %v: not detected within the lease", took)
			}
		}},
	}
	for _, transport := range []string{"tcp", "shm"} {
		for _, c := range cases {
			t.Run(transport+"/"+c.name, func(t *testing.T) {
				epoch := armNetFaults(t, c.specs)
				j := newNetJob(t, np, comm.DefaultConfig(), transport == "tcp")
				if k := j.comms[0].LinkKinds()[1]; k != transport {
					t.Fatalf("link kind %q, want %q", k, transport)
				}
				errs, longest := allReduceLoop(t, j.comms, c.n, c.iters, epoch.Add(c.run), 20*time.Second)
				took := time.Since(epoch)
				if c.ok {
					for r, err := range errs {
						if err != nil {
							t.Errorf("rank %d: %v", r, err)
						}
					}
					if longest < c.longest {
						t.Errorf("longest iteration %v, want at least %v: the fault had no effect", longest, c.longest)
					}
					return
				}
				for r, err := range errs {
					if err == nil {
						t.Fatalf("rank %d completed every call until the end (%v): the fault was not detected", r, c.run)
					}
					t.Logf("rank %d: %v", r, err)
				}
				for r, err := range errs {
					if errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("rank %d: %v: the fault was not detected in time", r, err)
					}
				}
				c.check(t, errs, took)
			})
		}
	}
}

// checkCorrupt: the rank that received the corrupted frame names the link
// 1->it; the others fail too (aborted), and none returned a wrong result
// (allReduceLoop checks the numbers).
func checkCorrupt(t *testing.T, errs []error, _ time.Duration) {
	found := false
	for _, err := range errs {
		var fe *comm.FrameCheckError
		if errors.As(err, &fe) {
			found = true
			if fe.From != 1 || !strings.Contains(err.Error(), fmt.Sprintf("link 1->%d", fe.To)) {
				t.Errorf("%v: want the link from rank 1 named", err)
			}
		}
	}
	if !found {
		t.Errorf("no rank reported a checksum failure: %v", errs)
	}
}

// stepBase keeps each after-steps test's steps above every step reported
// before in this process: step gates are process-wide and steps only grow.
var stepBase int64

// An after-steps fault starts at its step, not before: a drop armed for
// step 5 lets every rank run its first four iterations, then fails the
// job naming the drop; one armed for a step never reached does nothing.
// Both ends of a partition by hosts hold frames from the step and cut the
// link at the lease, naming the host across the cut.
func TestNetFaultsAfterSteps(t *testing.T) {
	const np = 3
	for _, c := range []struct {
		name, spec string
		at         int64 // the spec's step, from stepBase
		iters      int   // how many iterations the loop runs
		hosts      []string
		fails      bool
		want       []string // in every rank's error
	}{
		{name: "drop at step 5", spec: "drop:rank=1:peer=2:after-steps=%d", at: 5, iters: 1000, fails: true, want: []string{"world rank "}},
		{name: "not reached", spec: "drop:rank=1:peer=2:after-steps=%d", at: 50, iters: 10},
		{name: "partition by hosts at step 3", spec: "partition:hosts=b:after-steps=%d:lease=500ms", at: 3, iters: 1 << 20,
			hosts: []string{"a", "a", "b"}, fails: true, want: []string{"world rank "}},
	} {
		t.Run(c.name, func(t *testing.T) {
			stepBase += 1 << 20
			base := stepBase
			armNetFaults(t, fmt.Sprintf(c.spec, base+c.at))
			j := newNetJobOn(t, np, comm.DefaultConfig(), true, c.hosts)
			done := make([]int64, np) // iterations each rank completed
			errs := onEach(t, np, func(r int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				buf := make([]float64, 1024)
				for it := range c.iters {
					for i := range buf {
						buf[i] = float64(r + it)
					}
					if err := j.comms[r].AllReduce(ctx, comm.Float64s(buf), comm.Float64s(buf), comm.Sum).Wait(ctx); err != nil {
						return err
					}
					if want := float64(np*(np-1)/2 + np*it); buf[7] != want {
						return fmt.Errorf("iteration %d: %v, want %v", it, buf[7], want)
					}
					done[r]++
					if r == 0 {
						// rank.ReportStep's part for the transport; the
						// gates are process-wide, as a rank's are.
						netfault.ReportStep(base + int64(it) + 1)
					}
				}
				return nil
			})
			for r, err := range errs {
				switch {
				case !c.fails && err != nil:
					t.Errorf("rank %d: %v (the fault's step never came)", r, err)
				case c.fails && err == nil:
					t.Errorf("rank %d completed every iteration: the fault never started", r)
				case c.fails && errors.Is(err, context.DeadlineExceeded):
					t.Errorf("rank %d: %v: not detected", r, err)
				case c.fails:
					for _, w := range c.want {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("rank %d: %v, want %q", r, err, w)
						}
					}
				}
				// Rank 0 reports step at after its iteration at: no
				// rank fails before iteration at-1 completed everywhere.
				if min := c.at - 1; c.fails && done[r] < min {
					t.Errorf("rank %d failed after %d iterations: the fault started before step %d", r, done[r], c.at)
				}
			}
			if c.fails && done[0] < c.at {
				t.Errorf("rank 0 completed %d iterations, want at least %d", done[0], c.at)
			}
		})
	}
}
