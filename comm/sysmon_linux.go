package comm

import (
	"bytes"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Go runtime's system monitor (sysmon) is a thread of its own that
// sleeps 20 µs at a time, with the kernel's default 50 µs timer slack,
// for at least 50 rounds after anything woke it up (a P taken back from
// a system call: every futex sleep of a shared-memory waiter past its
// spin, or any other blocking call), and doubles its sleep only after
// that. A rank bound to one CPU has sysmon on the same CPU, and at each
// round the kernel's wake-up preemption gave sysmon the core ahead of the
// rank's spinning thread: measured with `perf record -e sched:sched_switch`
// on 2 ranks bound one per core (2-core VM, 8-byte all-reduce), the rank
// lost its core for about 10 µs every 90 µs, and a call that met it took
// 25-50 µs instead of 0.5 (notes/shm-latency.md).
//
// sysmon is therefore moved to SCHED_BATCH: the same CPU share and nice
// value as before, but a batch thread that wakes up does not preempt the
// running one; it runs when the rank's thread sleeps or at the next
// scheduler tick. sysmon's duties (retaking Ps from long system calls,
// preempting goroutines that run for 10 ms, forcing a GC every 2 minutes)
// tolerate a tick's delay. Threads sysmon creates inherit the policy
// (Ms started to take over a P from a blocking system call): they too
// then wait for the tick or for the core to free up when they wake, rather
// than preempting, and keep their CPU share. A shared-memory waiter about
// to sleep on its futex, whose wake-up is the latency path, first puts its
// own thread back to the normal policy if it was one of them (unbatch). An earlier version lowered sysmon to
// nice 19 instead, which those threads inherited as well, with a fiftieth
// of the CPU share, and a loaded host starved them (supervisors' leases
// ran out); that change was withdrawn.

// SysmonEnv, set to "default" in a rank's environment, leaves the Go
// runtime's sysmon thread at the normal scheduling policy (see
// quietSysmon); for benchmarks that compare, and as an escape hatch.
const SysmonEnv = "GORUN_SYSMON"

// sysmonOnce quiets sysmon once per process (see quietSysmon).
var (
	sysmonOnce sync.Once
	sysmonTID  atomic.Int32 // the thread moved, 0 if none
)

// schedBatch is Linux's SCHED_BATCH policy number.
const schedBatch = 3

// quietSysmon moves the sysmon thread to SCHED_BATCH, once per process.
// It finds the thread as the first one the runtime creates after the main
// thread (runtime.main starts sysmon before anything else, and
// /proc/self/task lists threads in creation order), and acts only if that
// thread is seen sleeping in nanosleep, as sysmon does between rounds: in
// a C program that loaded Go as a library (libgorun) the second thread is
// someone else's.
func quietSysmon() {
	sysmonOnce.Do(func() {
		if os.Getenv(SysmonEnv) == "default" || !standaloneGo() {
			return
		}
		tid := findSysmon()
		if tid <= 0 {
			return
		}
		var param [1]int32 // sched_priority 0, as SCHED_BATCH requires
		if _, _, e := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(tid), schedBatch, uintptr(unsafe.Pointer(&param[0]))); e == 0 {
			sysmonTID.Store(int32(tid))
		}
	})
}

// standaloneGo reports whether this process is a Go program rather than
// a library of another (c-shared, c-archive).
func standaloneGo() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-buildmode" {
			return s.Value == "exe" || s.Value == "pie"
		}
	}
	return true // `go run` and tests record no build mode
}

// findSysmon returns sysmon's thread id, or 0 when it cannot tell.
func findSysmon() int {
	f, err := os.Open("/proc/self/task")
	if err != nil {
		return 0
	}
	names, err := f.Readdirnames(-1) // unsorted: creation order
	_ = f.Close()
	if err != nil || len(names) < 2 || names[0] != strconv.Itoa(os.Getpid()) {
		return 0
	}
	tid, err := strconv.Atoi(names[1])
	if err != nil || tid == unix.Gettid() {
		return 0
	}
	// sysmon wakes for microseconds and sleeps for 20 µs to 10 ms between
	// rounds. When it found every P idle (as at a rank's first group,
	// after waiting on the network) it sleeps on a futex instead, until a
	// system call of ours wakes it (the reads below do). It then needs a
	// CPU to get back to its rounds, and on a rank bound to one CPU that
	// CPU is this thread's: the kernel need not preempt us for it, and
	// looking back to back for 3.4 ms (400 looks) ended with sysmon still
	// runnable in 6 of 10 tries on the 2-core reference VM; 2 of 16 ranks
	// of `gorun bench` kept sysmon at SCHED_OTHER, and a trace of such a
	// rank showed sysmon preempting it every 87 µs
	// (notes/shm-latency.md). So each look after the first yields the CPU first
	// (sched_yield: sysmon is a thread of this process, so it is what the
	// kernel runs next here), and sysmon was then seen in nanosleep at the
	// second look in 10 tries of 10. A raw system call: the P stays with
	// this thread, so sysmon has no P to take over and hand to a new
	// thread (a 20 µs nanosleep between looks, tried first, let it).
	path := "/proc/self/task/" + names[1] + "/syscall"
	for i := range 400 {
		if i > 0 {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		if nr, _, _ := bytes.Cut(b, []byte(" ")); string(nr) == strconv.Itoa(unix.SYS_NANOSLEEP) {
			return tid
		}
	}
	return 0
}

// unbatch returns the calling thread to the normal policy if it inherited
// SCHED_BATCH from sysmon (see above). Called before a futex sleep, after
// the spin: two system calls are nothing there, and a thread woken from
// that sleep must preempt what runs on its CPU as any thread would.
func unbatch() {
	tid := sysmonTID.Load()
	if tid == 0 {
		return
	}
	pol, _, e := unix.RawSyscall(unix.SYS_SCHED_GETSCHEDULER, 0, 0, 0)
	if e != 0 || pol != schedBatch || unix.Gettid() == int(tid) {
		return
	}
	var param [1]int32
	_, _, _ = unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, 0, 0 /* SCHED_OTHER */, uintptr(unsafe.Pointer(&param[0])))
}
