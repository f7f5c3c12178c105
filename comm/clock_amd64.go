package comm

import (
	"os"
	"strings"
)

func rdtsc() int64

// tscTrusted: the kernel keeps time with the time-stamp counter, so it is
// invariant (constant rate, running in every power state, one counter for
// every core). Elsewhere (kvm-clock, hpet, old CPUs) ticks fall back to the
// monotonic clock.
var tscTrusted = func() bool {
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return err == nil && strings.TrimSpace(string(b)) == "tsc"
}()

// ticks is the flight recorder's clock: the time-stamp counter where it is
// trusted (about 16 ns to read here, against 40-110 ns for time.Now on the
// same shared VM), else nanoseconds of the monotonic clock.
func ticks() int64 {
	if tscTrusted {
		return rdtsc()
	}
	return monoNanos()
}

func ticksAreNanos() bool { return !tscTrusted }
