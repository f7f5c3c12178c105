package launcher

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// CPU binding of the ranks on one host.
//
// With bindAuto (the default), when a host runs no more ranks than its
// agent may use CPUs, each rank is started bound to its own equal share
// of those CPUs (local rank i of n gets the i-th of n consecutive runs
// of the agent's allowed CPUs, at least one each); with more ranks than
// CPUs nothing is bound. This is what Open MPI's mpirun does for two
// ranks (--bind-to core) and why its shared-memory latency is steady:
// two ranks that poll shared memory must not share a core. Measured on
// the 2-core reference host (8-byte all-reduce, 2 ranks, shared memory):
// unbound, the kernel often put both ranks on one core, and a call took
// 5-9 µs (264-320 µs under a load average of 27) where it took 0.8 µs
// (14-17 µs under that load) with one rank per core. A Go rank bound to
// one CPU also starts with GOMAXPROCS 1, which spares it the idle
// threads the runtime would otherwise wake on every hand-off.
//
// GORUN_BIND in a rank's environment (gorun --bind-to, or -x) chooses:
// "auto" or unset as above, "none" to start ranks unbound (programs that
// place their own threads).
const bindEnv = "GORUN_BIND"

// Binding policies (values of GORUN_BIND).
const (
	BindAuto = "auto"
	BindNone = "none"
)

// ParseBind checks a --bind-to value.
func ParseBind(s string) (string, error) {
	switch s {
	case "", BindAuto:
		return BindAuto, nil
	case BindNone:
		return BindNone, nil
	}
	return "", fmt.Errorf("--bind-to %q: expected auto or none", s)
}

// bindPolicy is the GORUN_BIND a rank's environment asks for (the last
// setting wins, as in exec).
func bindPolicy(env []string) string { return envValue(env, bindEnv, BindAuto) }

// cpuShares cuts the CPUs this process may run on into n equal
// consecutive runs, one per local rank, or returns nil when there are
// fewer CPUs than ranks (or they cannot be read).
func cpuShares(n int) [][]int {
	var set unix.CPUSet
	if n < 1 || unix.SchedGetaffinity(0, &set) != nil {
		return nil
	}
	var cpus []int
	for c, count := 0, set.Count(); len(cpus) < count; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < n {
		return nil
	}
	k := len(cpus) / n
	out := make([][]int, n)
	for i := range out {
		out[i] = cpus[i*k : (i+1)*k]
	}
	return out
}

// startBound runs start (which forks) on a thread bound to cpus, so the
// child and every thread it makes start with that affinity, then gives
// the thread its old affinity back. An empty cpus runs start as is.
func startBound(cpus []int, start func() (*os.Process, error)) (*os.Process, error) {
	if len(cpus) == 0 {
		return start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return start()
	}
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return start()
	}
	p, err := start()
	if unix.SchedSetaffinity(0, &old) != nil {
		// The thread keeps the narrow set: keep it for this goroutine
		// (a second lock outlives the deferred unlock) rather than let it
		// run others.
		runtime.LockOSThread()
	}
	return p, err
}
