//go:build !amd64

package comm

// ticks is the flight recorder's clock: nanoseconds of the monotonic clock.
func ticks() int64 { return monoNanos() }

func ticksAreNanos() bool { return true }
