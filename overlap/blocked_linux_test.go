package overlap

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// TestBlockingComputeWidens checks that an executor whose raise the CPUs
// capped (a rank bound to one core) widens GOMAXPROCS to MinProcs after a
// step whose compute blocked off the CPU, where the communicator's worker
// needs a P the blocked thread would otherwise hold (procs.go), narrows it
// back after a step whose compute ran on the CPU, and that Close puts the
// setting back.
func TestBlockingComputeWidens(t *testing.T) {
	orig, origCap := runtime.GOMAXPROCS(0), procsCap
	t.Cleanup(func() { runtime.GOMAXPROCS(orig); procsCap = origCap })
	// A blocking system call, as a driver's synchronising call (not
	// time.Sleep, which parks the goroutine and hands its P on by itself).
	block := func() error {
		ts := syscall.NsecToTimespec(int64(time.Millisecond))
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
		return nil
	}
	spin := func() error {
		for t0 := time.Now(); time.Since(t0) < time.Millisecond; {
		}
		return nil
	}
	for _, tc := range []struct {
		name    string
		cpus    int
		program int            // GOMAXPROCS the program sets after the first step (0: none)
		steps   []func() error // one compute each
		want    []int          // GOMAXPROCS after each step
		after   int            // after Close
	}{
		{"blocking widens, CPU narrows", 1, 0, []func() error{block, block, spin, block}, []int{2, 2, 1, 2}, 1},
		{"CPU compute keeps one P", 1, 0, []func() error{spin, spin}, []int{1, 1}, 1},
		{"not capped: nothing to widen", 2, 0, []func() error{block, spin}, []int{2, 2}, 1},
		{"the program's own setting stands", 1, 3, []func() error{block, spin, spin}, []int{2, 3, 3}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(1)
			procsCap = func() int { return tc.cpus }
			ex, err := New(twoBucketPlan(t), map[string]Comm{"g": newFakeComm(0, 2, newFakeClock(), nil)}, DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			a, b := make([]float32, 2), make([]float32, 2)
			for i, fn := range tc.steps {
				if err := ex.Begin(i); err != nil {
					t.Fatal(err)
				}
				if err := ex.Ready(ctx, "a", comm.Float32s(a), comm.Float32s(a)); err != nil {
					t.Fatal(err)
				}
				// Three computes: the watch drops one that moved to
				// another thread (a GC's stop of the world can do that).
				for range 3 {
					if err := ex.Compute(ctx, "backward l0", "l0", fn); err != nil {
						t.Fatal(err)
					}
				}
				if err := ex.Ready(ctx, "b", comm.Float32s(b), comm.Float32s(b)); err != nil {
					t.Fatal(err)
				}
				if _, err := ex.Finish(ctx); err != nil {
					t.Fatal(err)
				}
				if got := runtime.GOMAXPROCS(0); got != tc.want[i] {
					t.Errorf("after step %d: GOMAXPROCS %d, want %d", i, got, tc.want[i])
				}
				if i == 0 && tc.program > 0 {
					runtime.GOMAXPROCS(tc.program)
				}
			}
			if err := ex.Close(); err != nil {
				t.Fatal(err)
			}
			if got := runtime.GOMAXPROCS(0); got != tc.after {
				t.Errorf("after Close: GOMAXPROCS %d, want %d", got, tc.after)
			}
		})
	}
}
