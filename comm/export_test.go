package comm

import (
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// SetTuning overrides the shared-memory waiter's spin and yield thresholds
// and whether Wait may run calls itself (benchmark experiments; safe while
// calls run).
func SetTuning(spin, yield time.Duration, inline bool, slow time.Duration, cpu bool) {
	cpuCheck.Store(cpu)
	slowWait.ns.Store(int64(slow))
	spinLimit.ns.Store(int64(spin))
	yieldAfter.ns.Store(int64(yield))
	inlineWait.Store(inline)
}

// SetSegmentBytes changes c's pipeline segment between calls (benchmark
// experiments; only while no call runs).
func SetSegmentBytes(c *Comm, n int) { c.cfg.SegmentBytes, c.cfg.TCPSegmentBytes = n, n }

// SetFastLimit changes the largest payload sent through a shared-memory
// fast slot (at most the slot's capacity; negative: none), for benchmarks
// that compare the two paths. Safe while calls run.
func SetFastLimit(n int) { fastLimit.Store(int64(min(n, fastMaxPayload))) }

// SetFlightRecorder turns the flight recorder (and with it desync and
// stall detection) on or off, so a benchmark can measure its cost. Safe
// while calls run.
func SetFlightRecorder(on bool) { flightOff.Store(!on) }

// SetYieldIdle makes shared-memory waiters yield after the yield
// threshold even when nothing suggests the peer needs their core (the
// policy before), for benchmarks that compare.
func SetYieldIdle(b bool) { yieldIdle.Store(b) }

// SetDirectCheck makes stuck ranks ask every peer themselves instead of
// group rank 0's view (to measure the coordinated check against it).
func SetDirectCheck(on bool) { directCheck.Store(on) }

// SideQueries returns how many desync checks c ran, the side-channel
// queries it made and the bytes their answers carried.
func SideQueries(c *Comm) (checks, queries, bytes int64) {
	return c.checks.Load(), c.queries.Load(), c.queryBytes.Load()
}

// RaceEnabled reports whether the race detector is on.
const RaceEnabled = raceEnabled

// SetNetFaults arms plan in this process instead of GORUN_NETFAULT for
// communicators created after the call; nil goes back to the environment.
func SetNetFaults(plan *netfault.Plan) { netPlanOverride.Store(plan) }

// Kicks is how many wake-ups c has sent its worker goroutine.
func Kicks(c *Comm) int64 { return c.kicks.Load() }

// Posts is how many messages c has handed to its sender goroutines.
func Posts(c *Comm) int64 { return c.posts }

// SetCallerStepMinEager sets the smallest EagerLimit for which foreign
// callers run large steps themselves (callerFrame) and returns the old one.
func SetCallerStepMinEager(n int) int { return int(callerStepMinEager.Swap(int64(n))) }

// SetHandsOffMin sets handsOffMin and returns the old value.
func SetHandsOffMin(n int) int { return int(handsOffMin.Swap(int64(n))) }

// FuseCounts is how many fused all-reduces of several calls c ran, and
// how many of its offers the ranks cut short.
func FuseCounts(c *Comm) (fused, shrunk int64) { return c.fusedRuns, c.fuseShrunk }
