//go:build unix

package main

import (
	"syscall"
	"time"
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
