package main

import (
	"runtime"
	"time"
)

// The modelled compute of the synthetic step, --compute:
//
//   - sleep (default): the thread idles for the block's time, as the CPU
//     does while an accelerator runs the block's kernels; only the
//     communicator needs the cores. This is the setting of the step runtime's
//     goal (overlapped step ≤ 1.1 × max(P, C)).
//   - cpu: a fixed amount of arithmetic per block (spin), as a CPU
//     trainer's compute: it and the communicator's copies share the
//     cores, so on a host with fewer cores than ranks need, no schedule
//     reaches max(P, C), and the benchmark prints the bound the cores
//     allow next to it.
const (
	computeSleep = "sleep"
	computeCPU   = "cpu"
)

// spinSink keeps the compiler from dropping spin's loop.
var spinSink float64

// spin runs n iterations of a dependent multiply-add chain: fixed work,
// whose time grows when the thread loses its core (unlike a loop that
// spins until a deadline, which would hide exactly that).
func spin(n int) {
	x, a := 1.0, 0.999999
	for range n {
		x = x*a + 1e-9
	}
	spinSink += x
}

// spinRate measures spin's iterations per nanosecond of this thread's CPU
// time (wall time where that cannot be read), so that the rate is the
// core's and not what is left of it by the other ranks calibrating at the
// same moment.
func spinRate() float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clock := threadCPU
	if clock() == 0 {
		t0 := time.Now()
		clock = func() time.Duration { return time.Since(t0) }
	}
	best := 0.0
	for n := 1 << 16; ; n *= 2 {
		t0 := clock()
		spin(n)
		d := clock() - t0
		if d > 0 {
			best = max(best, float64(n)/float64(d))
		}
		if d > 20*time.Millisecond {
			return best
		}
	}
}
