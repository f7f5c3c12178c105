//go:build unix

package main

import (
	"syscall"
	"time"
	"unsafe"
)

// sleep is the modelled compute: this thread idles for d, as the CPU does
// while a GPU runs the block's kernels.
//
// Not time.Sleep: when every goroutine of the process is parked, Go's
// timers wake through the network poller, whose timeout has millisecond
// granularity. On the 2-core VM a 50 µs time.Sleep took 1.06 ms when the
// process was idle (nanosleep: 80 µs) but far less while communication kept
// a thread busy, so "compute alone" and compute during the overlapped step
// differed by up to 5× and the exposed share meant nothing. nanosleep
// blocks the thread on a high-resolution timer either way; the runtime
// hands the thread's P to other goroutines meanwhile.
func sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}

// processCPU is the CPU time every thread of this process has used (user
// and system): what a step really costs the host's cores, as against its
// wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadCPU is the CPU time of the calling thread (0 where it cannot be
// read): spin's calibration counts iterations per CPU second, which time
// slices lost to other ranks do not change.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
