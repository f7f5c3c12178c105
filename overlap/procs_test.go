package overlap

import (
	"runtime"
	"testing"
)

// TestMinProcs checks that an open executor runs with at least
// Config.MinProcs Ps, so that the communicator's worker has one of its own
// while the program computes, and that the last Close puts the setting
// back (but not over a setting the program made meanwhile).
func TestMinProcs(t *testing.T) {
	orig, origCap := runtime.GOMAXPROCS(0), procsCap
	t.Cleanup(func() { runtime.GOMAXPROCS(orig); procsCap = origCap })
	open := func(minProcs int) *Executor {
		t.Helper()
		cfg := DefaultConfig()
		cfg.MinProcs = minProcs
		ex, err := New(twoBucketPlan(t), map[string]Comm{"g": newFakeComm(0, 2, newFakeClock(), nil)}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	for _, tc := range []struct {
		name          string
		before        int
		cpus          int   // CPUs the process may run on
		minProcs      []int // one executor each, closed in order
		program       int   // GOMAXPROCS the program sets while they are open (0: none)
		during, after int
	}{
		{"one P raised to two", 1, 2, []int{2}, 0, 2, 1},
		{"enough already", 3, 4, []int{2}, 0, 3, 3},
		{"MinProcs 0 leaves it", 1, 2, []int{0}, 0, 1, 1},
		{"the largest of two executors", 1, 4, []int{2, 3}, 0, 3, 1},
		{"the program's own setting stands", 1, 2, []int{2}, 5, 5, 5},
		{"no more Ps than CPUs", 1, 1, []int{2}, 0, 1, 1},
		{"capped at the CPUs", 1, 3, []int{4}, 0, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(tc.before)
			procsCap = func() int { return tc.cpus }
			var exs []*Executor
			for _, n := range tc.minProcs {
				exs = append(exs, open(n))
			}
			if tc.program > 0 {
				runtime.GOMAXPROCS(tc.program)
			}
			if got := runtime.GOMAXPROCS(0); got != tc.during {
				t.Errorf("while open: GOMAXPROCS %d, want %d", got, tc.during)
			}
			for i, ex := range exs {
				if err := ex.Close(); err != nil {
					t.Fatal(err)
				}
				if i < len(exs)-1 && runtime.GOMAXPROCS(0) != tc.during {
					t.Errorf("one executor still open: GOMAXPROCS %d, want %d", runtime.GOMAXPROCS(0), tc.during)
				}
			}
			if got := runtime.GOMAXPROCS(0); got != tc.after {
				t.Errorf("after Close: GOMAXPROCS %d, want %d", got, tc.after)
			}
		})
	}
}
