package overlap

import (
	"runtime"
	"sync"
)

// A step overlaps only if the communicator's worker goroutine runs while
// the program computes, and in Go that needs a P (a slot for running Go
// code, GOMAXPROCS of them) for each. A rank bound to one CPU starts with
// GOMAXPROCS 1 (Go counts its affinity), and gorun gives oversubscribed
// ranks GOMAXPROCS=1 (launcher/bind.go), which is right for a program that
// waits for each call as it issues it but starves overlap twice over:
//
//   - a compute that blocks the thread (an accelerator's synchronising
//     call, a cgo call, the step benchmark's nanosleep) keeps the only P
//     until the runtime's monitor takes it back, 20 µs to 10 ms later
//     (its period grows while it finds nothing to do), and a CPU-bound
//     compute keeps it until preempted (10 ms): the collective the program
//     just issued does not start meanwhile;
//   - when the compute returns, the worker holds the P in the middle of a
//     copy or a shared-memory poll, and the program resumes only when the
//     worker next lets go (its Gosched in a wait, or a preemption).
//
// Measured with a Go execution trace of rank 0 (scripts/bench-step.sh's
// synthetic step, 4 ranks on the 2-core host over shared memory, 5 steps,
// notes/step-path.md): with one P the worker sat runnable and not running
// for 88.9 ms, the program for 34.8 ms after its compute's syscall
// returned; with two, 10.9 ms and 1.5 ms.
//
// So an executor raises GOMAXPROCS to Config.MinProcs while it is open
// and puts the old setting back when the last such executor closes (unless
// the program changed it meanwhile).
//
// Never past the CPUs the process may run on (runtime.NumCPU, its
// affinity): on one core the second P's thread only time-slices with the
// compute's, and the worker's polling for a peer takes the core from a
// compute that needs it. Measured with the trainer (real CPU compute, 2
// ranks each bound to one core, load 12, 3 alternating rounds): mean step
// 53-62 ms with one P, 81-110 ms with two. With 4 ranks sharing the 2
// cores (each may run on both) two Ps won in every round: dp 51.6/52.2 ms
// against 61.5/54.2, sharded 39.3/39.1 against 59.4/76.3.
var procsCap = runtime.NumCPU
var procs struct {
	mu   sync.Mutex
	open int // executors holding a raise
	prev int // GOMAXPROCS before the first raise
	set  int // what the raises set it to
}

// raiseProcs makes GOMAXPROCS at least n until the matching releaseProcs.
// It reports whether it holds a raise (n > 0), which the caller must
// release exactly once.
func raiseProcs(n int) bool {
	if n <= 0 {
		return false
	}
	n = min(n, procsCap())
	procs.mu.Lock()
	defer procs.mu.Unlock()
	cur := runtime.GOMAXPROCS(0)
	if procs.open == 0 {
		procs.prev, procs.set = cur, cur
	}
	if cur < n {
		runtime.GOMAXPROCS(n)
		procs.set = n
	}
	procs.open++
	return true
}

// releaseProcs drops one raise; the last puts GOMAXPROCS back, unless the
// program set it to something else while executors were open.
func releaseProcs() {
	procs.mu.Lock()
	defer procs.mu.Unlock()
	if procs.open--; procs.open > 0 || procs.set == procs.prev || runtime.GOMAXPROCS(0) != procs.set {
		return
	}
	// The old number, set explicitly: whether it was the runtime's own
	// choice (which would follow later changes of the CPU affinity) or
	// the program's cannot be told apart, and the program's must stand.
	runtime.GOMAXPROCS(procs.prev)
}
