package overlap

import (
	"syscall"
	"unsafe"
)

// threadUsage returns the calling thread's id, its CPU time (nanoseconds)
// and its count of voluntary context switches: the times it left the CPU because
// it blocked (a sleep, a futex, a read, a driver's synchronising call),
// as against being preempted. ok is false where the kernel cannot say.
//
// The CPU time is CLOCK_THREAD_CPUTIME_ID's, not getrusage's: getrusage
// reports a running thread's time as of its last scheduler event (a tick,
// up to 4 ms ago), so a spinning compute read as mostly idle and the
// blocking compute after it as mostly busy (TestBlockingComputeWidens
// caught it).
func threadUsage() (tid int, cpuNs, voluntary int64, ok bool) {
	const rusageThread = 1       // RUSAGE_THREAD
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ru syscall.Rusage
	if syscall.Getrusage(rusageThread, &ru) != nil {
		return 0, 0, 0, false
	}
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, 0, 0, false
	}
	return syscall.Gettid(), ts.Nano(), ru.Nvcsw, true
}
