package supervisor

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"runtime"
	"slices"

	"github.com/gorun-hpc/gorun/rankenv"
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

// CPUShares cuts the CPUs this process may run on into n equal
// consecutive runs, one per local rank, or returns nil when there are
// fewer CPUs than ranks (or they cannot be read).
func CPUShares(n int) [][]int {
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

// goMaxProcsEnv is the environment of a rank started unbound on a host
// where bindAuto found more ranks than CPUs (oversubscribed): it adds
// GOMAXPROCS=1 unless env sets GOMAXPROCS, giving a Go rank the one P it
// would get bound to a share of one CPU. Each such rank has less than a
// CPU to itself, and a Go runtime with a P per CPU wakes idle threads to
// run the goroutines a call readies, on the cores the other ranks need.
// Measured on the 2-core reference host, 4 ranks, 8-byte all-reduce over
// shared memory (`gorun bench`, 3 rounds): 49-188 µs with GOMAXPROCS 2,
// 19-42 µs with 1 (notes/shm-latency.md). Programs other than Go ignore
// the variable; --bind-to none, or -x GOMAXPROCS=N, leaves the choice to
// the program.
func goMaxProcsEnv(env []string) []string {
	if bindPolicy(env) != BindAuto || envValue(env, "GOMAXPROCS", "") != "" {
		return env
	}
	return append(slices.Clip(env), "GOMAXPROCS=1")
}

// Sessions of oversubscribed ranks. Every rank normally leads its own
// session (supervisor.go: with the kernel's autogroup scheduling each
// session is one scheduling unit, so a job's ranks get a CPU share each
// against the other sessions on a busy machine). With more ranks than
// CPUs and bindAuto, the ranks instead lead their own process groups in
// the supervisor's session, as mpirun's do: they then share one
// autogroup, in which sched_yield hands the core to a rank queued behind
// the caller. Across autogroups a yield hands it to nobody, and a rank
// waiting for a peer that shares its core can only sleep and be woken.
// comm yields when its peer is in its session (comm/shm_linux.go, wait).
// Measured on the 2-core reference host, 4 ranks, 8-byte all-reduce
// (`gorun bench`, ranks at high priority against a load average of 20,
// 3 rounds of 3 sizes): own sessions, futex sleep 18-158 µs; one
// session, sched_yield 8-17 µs; Open MPI 4.4-5.8 µs (notes/shm-latency.md).
// The job as a whole then has one share against other sessions, which a
// job that asks for more ranks than CPUs competes for anyway.
//
// Only ranks whose program is built on gorun's runtime share the session
// (gorunRuntime): others do not yield to their session's peers, and one
// CPU share for all of them costs them dearly. MPICH's MPI_Init waits in
// a shared-memory barrier that spins without yielding, so 16 MPICH ranks
// on the 2 cores, measured alternately under a load average of 27, took
// 1.7-10.3 s to init, barrier and finalize in one session against
// 0.9-2.7 s in their own sessions (Hydra, own sessions: 0.9-2.2 s).

// GORUN_SESSION in a rank's environment (gorun --session, or -x) overrides
// that choice for oversubscribed ranks: "auto" or unset as above,
// "shared" for any program, "own" for none. The launcher cannot tell a
// program that waits on gorun's runtime when that runtime is a library it
// loads: Python ranks on the torch backend "gorun" (libgorun) wait the way
// gorun's Go programs do, yet the interpreter is no Go program. Measured on
// the 2-core reference host, 4 torch ranks, all-reduce through the torch
// backend, 3 interleaved rounds under a load average of 5-17: in their
// own sessions 160 µs at 8 B and 0.53-0.84 of native `gorun bench` busbw
// at 2-32 MiB; sharing the session, 52 µs and 0.97-1.53
// (notes/torch-backend.md). So libgorun moves such a rank, leading its own
// session on a crowded host, into one cpu cgroup with the job's other
// ranks there (comm.JoinSchedGroup, where cgroup v1 and root allow it),
// and the supervisor removes that cgroup after the job.
const sessionEnv = rankenv.Session

// Session policies (values of GORUN_SESSION).
const (
	SessionAuto   = "auto"
	SessionShared = "shared"
	SessionOwn    = "own"
)

// ParseSession checks a --session value (or a GORUN_SESSION setting).
func ParseSession(s string) (string, error) {
	switch s {
	case "", SessionAuto:
		return SessionAuto, nil
	case SessionShared, SessionOwn:
		return s, nil
	}
	return "", fmt.Errorf("--session %q: expected auto, shared or own", s)
}

// ownSession reports whether a rank leads its own session: always unless
// its host is crowded (more ranks than CPUs); then as GORUN_SESSION in
// env says, and by default only ranks of programs not on gorun's runtime
// (onRuntime is asked only then) or started with GORUN_BIND other than
// auto do. An unknown GORUN_SESSION counts as auto (gorun refuses one at
// start).
func ownSession(crowded bool, env []string, onRuntime func() bool) bool {
	if !crowded {
		return true
	}
	switch envValue(env, sessionEnv, SessionAuto) {
	case SessionShared:
		return false
	case SessionOwn:
		return true
	}
	return bindPolicy(env) != BindAuto || !onRuntime()
}

// oversubscribed reports whether n ranks are more than the CPUs this
// process may run on (false if they cannot be read).
func oversubscribed(n int) bool {
	var set unix.CPUSet
	return unix.SchedGetaffinity(0, &set) == nil && n > set.Count()
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

// gorunRuntime reports whether the program at path is a Go program built
// with gorun's module, i.e. one whose collectives run on comm and yield to
// session peers; false for anything else, or when it cannot be read.
func gorunRuntime(path string) bool {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return false
	}
	const module = "github.com/gorun-hpc/gorun"
	if bi.Main.Path == module {
		return true
	}
	for _, d := range bi.Deps {
		if d.Path == module {
			return true
		}
	}
	return false
}
