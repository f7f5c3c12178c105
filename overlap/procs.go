package overlap

import (
	"runtime"
	"sync"
	"time"
)

// A step overlaps only if the communicator's worker goroutine runs while
// the program computes, and in Go that needs a P (a slot for running Go
// code, GOMAXPROCS of them) for each. A rank bound to one CPU starts with
// GOMAXPROCS 1 (Go counts its affinity), and gorun gives oversubscribed
// ranks GOMAXPROCS=1 (launcher/supervisor/bind.go), which is right for a
// program that waits for each call as it issues it but starves overlap twice
// over:
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
// Within the CPUs the process may run on (runtime.NumCPU, its affinity),
// unless its compute blocks. On one core a second P's thread only
// time-slices with a CPU compute's, and the worker's polling for a peer
// takes the core from a compute that needs it. Measured with the trainer
// (real CPU compute, 2 ranks each bound to one core, load 12, 3
// alternating rounds): mean step 53-62 ms with one P, 81-110 ms with two.
// With 4 ranks sharing the 2 cores (each may run on both) two Ps won in
// every round: dp 51.6/52.2 ms against 61.5/54.2, sharded 39.3/39.1
// against 59.4/76.3.
//
// A compute that blocks (an accelerator's synchronising call, the step
// benchmark's nanosleep) leaves the core idle, and there one P is the
// wrong choice: the worker gets the P only when the runtime's monitor
// takes it from the blocked thread, and the monitor's period is
// bistable. While it keeps finding blocked Ps it polls every 20 µs; after
// about 1 ms of finding none it backs off to 10 ms, and a compute that
// blocks for less than its period is then never taken back. Measured
// (2 ranks, one core each, the step benchmark over shared memory, 16
// blocks of 100-300 µs sleeps): a run whose monitor stayed fast left 1-23 %
// of the communication exposed; a run whose monitor had backed off hid
// none of it (exposed 83-114 % of C), with no code change between them,
// and a Go execution trace of rank 0 showed why: 200-247 of the 277-309
// compute syscalls of 3 steps returned without their P in the good runs,
// 0 of 250-264 in the bad ones. So the executor watches its compute
// (Executor.Compute): a step whose compute spent a quarter of its time
// blocked off the CPU widens GOMAXPROCS to MinProcs past the CPUs
// (widenProcs), and a step where that share fell under 1/16 narrows it
// back (narrowProcs). Widened, every run overlapped: exposed 2.4-4.8 % of
// C over shared memory, 3.6-5.3 % over TCP (notes/step-path.md).
var procsCap = runtime.NumCPU
var procs struct {
	mu   sync.Mutex
	open int // executors holding a raise
	wide int // of those, executors whose compute blocks (widenProcs)
	prev int // GOMAXPROCS before the first raise
	base int // what the raises set it to, within the CPUs
	set  int // what it is set to now by the raises (base, or widened)
}

// raiseProcs makes GOMAXPROCS at least n, within the CPUs, until the
// matching releaseProcs. It reports whether it holds a raise (n > 0),
// which the caller must release exactly once.
func raiseProcs(n int) bool {
	if n <= 0 {
		return false
	}
	n = min(n, procsCap())
	procs.mu.Lock()
	defer procs.mu.Unlock()
	cur := runtime.GOMAXPROCS(0)
	if procs.open == 0 {
		procs.prev, procs.base, procs.set = cur, cur, cur
	}
	if cur < n {
		runtime.GOMAXPROCS(n)
		procs.set = n
	}
	procs.base = max(procs.base, n)
	procs.open++
	return true
}

// widenProcs makes GOMAXPROCS at least n, past the CPUs, for a holder of a
// raise whose compute blocks, until the matching narrowProcs. A setting
// the program made meanwhile stands.
func widenProcs(n int) {
	procs.mu.Lock()
	defer procs.mu.Unlock()
	procs.wide++
	if cur := runtime.GOMAXPROCS(0); cur == procs.set && cur < n {
		runtime.GOMAXPROCS(n)
		procs.set = n
	}
}

// narrowProcs drops one widening; the last puts GOMAXPROCS back to what
// the raises set, unless the program set something else meanwhile.
func narrowProcs() {
	procs.mu.Lock()
	defer procs.mu.Unlock()
	if procs.wide--; procs.wide > 0 || procs.set <= procs.base || runtime.GOMAXPROCS(0) != procs.set {
		return
	}
	runtime.GOMAXPROCS(procs.base)
	procs.set = procs.base
}

// releaseProcs drops one raise (its holder narrowed first); the last puts
// GOMAXPROCS back, unless the program set it to something else while
// executors were open.
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

// blockedWatch measures how much of a step's compute was spent blocked
// off the CPU (Executor.Compute), for an executor whose raise the CPUs
// capped below Config.MinProcs.
type blockedWatch struct {
	on      bool          // measuring this step
	wall    time.Duration // compute wall time this step
	blocked time.Duration // of it, off the CPU in computes that blocked
}

// Widening and narrowing thresholds, as shares of a step's compute time
// spent blocked. Apart, so that a step near one does not flip GOMAXPROCS
// (a stop of the world) every step.
const (
	widenShare  = 0.25
	narrowShare = 1.0 / 16
)

// run runs fn, measuring its wall and CPU time on its thread. Time off the
// CPU counts as blocked only if the thread blocked (a voluntary context
// switch), not if other work on the host preempted it. A compute that
// parked in Go (a channel, time.Sleep) or was preempted by the runtime may
// resume on another thread: that sample is dropped, as such a compute
// hands its P on by itself and is not what widening is for.
func (w *blockedWatch) run(fn func() error) error {
	if !w.on {
		return fn()
	}
	id0, c0, v0, ok0 := threadUsage()
	t0 := time.Now()
	err := fn()
	d := time.Since(t0)
	id1, c1, v1, ok1 := threadUsage()
	if ok0 && ok1 && id0 == id1 {
		w.wall += d
		if v1 > v0 {
			w.blocked += max(d-time.Duration(c1-c0), 0)
		}
	}
	return err
}
