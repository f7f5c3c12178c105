package comm

import (
	"bytes"
	"os"
	"runtime/debug"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// The Go runtime's system monitor (sysmon) is a thread of its own that
// sleeps 20 µs at a time, with the kernel's default 50 µs timer slack,
// for at least 50 rounds after anything woke it up (a P taken back from
// a system call: every futex sleep of a shared-memory waiter past its
// spin, or any other blocking call), and doubles its sleep only after
// that. A rank bound to one CPU has sysmon on the same CPU, and at each
// round the kernel gives sysmon the core ahead of the rank's spinning
// thread: measured with `perf record -e sched:sched_switch` on 2 ranks
// bound one per core (2-core VM, 8-byte all-reduce), the rank lost its
// core for about 10 µs every 90 µs, and a call that met it took 25-50 µs
// instead of 0.5, which made a third of the time of a stream of small
// calls (notes/shm-latency.md).
//
// Lowering sysmon to nice 19 (the weight of 15 against 1024) stops it
// preempting the rank on wake-up; it runs when the core has time, which
// is at once when the rank sleeps and within a scheduling period when it
// spins. The rank's goroutines are never run by sysmon's thread, so
// nothing else slows. Same measurement: no such stall in 4000 calls
// (13-23 before).

// sysmonOnce lowers sysmon once per process (see quietSysmon).
var (
	sysmonOnce sync.Once
	sysmonTID  int // the thread lowered, 0 if none (tests read it)
)

// quietSysmon sets the sysmon thread's nice value to nice (0: leave it).
// It finds the thread as the first one the runtime creates after the
// main thread (runtime.main starts sysmon before anything else, and
// /proc/self/task lists threads in creation order), and acts only if that
// thread is seen sleeping in nanosleep, as sysmon does between rounds: in
// a C program that loaded Go as a library (libgorun) the second thread is
// someone else's, and a Go thread that runs goroutines must never be
// slowed.
func quietSysmon(nice int) {
	if nice <= 0 {
		return
	}
	sysmonOnce.Do(func() {
		if !standaloneGo() {
			return
		}
		tid := findSysmon()
		if tid > 0 && unix.Setpriority(unix.PRIO_PROCESS, tid, nice) == nil {
			sysmonTID = tid
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
	// sysmon wakes for microseconds and sleeps for 20 µs to 10 ms; this
	// goroutine keeps a P busy while it looks, so sysmon is not in its
	// idle (futex) sleep. A few hundred looks take a few milliseconds.
	path := "/proc/self/task/" + names[1] + "/syscall"
	for range 400 {
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
