//go:build linux

package comm

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Where crowded ranks start (notes/shm-latency.md, "The first row at 4
// ranks").
//
// Ranks that wait for each other by polling and sched_yield look to the
// kernel's load balancer like tasks that are always cache hot (each ran a
// few microseconds ago), so it hardly ever moves one: 4 ranks on 2 cores
// were seen (perf sched) all on one CPU for the first tens of milliseconds,
// or 3 on one and 1 on the other for a whole run, and the small all-reduce
// ran at 25 µs (4 on one), 18 µs (3+1), 11 µs (2+2, ranks 0 and 3 together)
// or 6.8 µs (2+2, ranks 0 and 1 together) per call depending on where the
// start left them. spreadOnce moves the process, once, to the CPU its
// place among the host's ranks gives it, in consecutive blocks (ranks 0
// and 1 on the first CPU, 2 and 3 on the second, so the first exchange of
// recursive doubling is a hand-over on one core), then gives every thread
// its affinity back: nothing is bound, the balancer may move the ranks
// later as it would anyway.
//
// That alone did not hold: the Go runtime starts threads later, a rank's
// goroutines move to them (a P handed to another M after a futex sleep),
// and the kernel puts them anywhere; perf saw runs end 3+1 anyway, and in
// interleaved runs the spread start was no better than none (28 of 73 in
// the fast mode, 64 B under 7 µs, against 21 of 57). So a
// crowded waiter that finds itself off its home CPU moves its thread there
// too (rehome, from shmLink.wait where it reads its CPU anyway), once per
// thread, again unbound. With both, 27 of 34 runs were in the fast mode
// against 9 of 34 before, 64 B medians 5.3-6.0 µs against 7.5-10.4
// (notes/shm-latency.md).

// spreadCPU is the CPU the idx-th of local ranks on a host starts on, from
// the CPUs the process may run on (in increasing order).
func spreadCPU(idx, local int, cpus []int) int {
	if len(cpus) == 0 || local <= 0 {
		return -1
	}
	return cpus[idx*len(cpus)/local%len(cpus)]
}

var spreadDone sync.Once

// spreadOnce moves every thread of this process to spreadCPU(idx, local)
// and back to its old affinity, the first time a crowded group is set up
// in this process; later groups (a process makes several) leave the
// placement to the kernel. Failures leave the placement as it was.
func spreadOnce(idx, local int) {
	spreadDone.Do(func() { homeCPU.Store(int32(spreadTo(idx, local) + 1)) })
}

// homeCPU is the CPU spreadOnce chose, plus one (0: none); homedTID the
// last thread rehome moved there.
var homeCPU, homedTID atomic.Int32

// rehome moves the calling thread to the home CPU, once per thread in a
// row, when a crowded waiter finds itself elsewhere (cpu: where it runs),
// unless the process holds several ranks (liveEndpoints):
// the goroutines of a rank move to threads the runtime starts after
// spreadOnce, which start wherever the kernel puts them.
func rehome(cpu uint32) {
	h := homeCPU.Load()
	if h == 0 || int32(cpu)+1 == h || liveEndpoints.Load() > 1 {
		return
	}
	tid := int32(unix.Gettid())
	if homedTID.Load() == tid {
		return
	}
	homedTID.Store(tid)
	nudge(0, int(h-1))
}

// nudge moves thread tid (0: the calling thread) to cpu and gives it its
// affinity back at once: the kernel moves a thread when its CPU leaves the
// set and leaves it where it is when the set widens again, so the thread
// ends up on cpu, unbound. A thread whose affinity cannot be read stays.
func nudge(tid, cpu int) {
	var own, one unix.CPUSet
	if unix.SchedGetaffinity(tid, &own) != nil {
		return
	}
	one.Set(cpu)
	if unix.SchedSetaffinity(tid, &one) == nil {
		_ = unix.SchedSetaffinity(tid, &own)
	}
}

// spreadTo does spreadOnce's work and reports the CPU it moved the threads
// to (-1 for none).
func spreadTo(idx, local int) int {
	cpus := allowedCPUs()
	// Only where every CPU gets two ranks or more: at 3 ranks on 2 CPUs
	// (blocks 0,1 | 2) the small all-reduce measured slower spread than
	// left alone (8 B first row median 9.7-10.7 against 6.6-6.8 µs, two
	// A/Bs of 4 and 6 rounds), at 4 and 7 faster.
	if len(cpus) < 2 || local < 2*len(cpus) {
		return -1
	}
	cpu := spreadCPU(idx, local, cpus)
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1
	}
	for _, t := range tids {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			nudge(tid, cpu) // each thread keeps the affinity it had
		}
	}
	return cpu
}

// allowedCPUs lists the CPUs this thread may run on, in increasing order
// (nil if its affinity cannot be read).
func allowedCPUs() []int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return nil
	}
	var cpus []int
	for c := range 8 * int(unsafe.Sizeof(set)) {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}
