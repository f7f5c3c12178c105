package comm

import (
	"sync"
	"time"
)

// The flight recorder stamps three times per call (issue, start, end) on
// the latency path, so it reads a cheap counter (ticks, per architecture)
// and converts to wall time only when records are read. The conversion
// maps ticks linearly between a pair taken at start-up and a pair taken at
// the conversion; reading both clocks together costs a few hundred
// nanoseconds of jitter, a relative error that shrinks as the process runs.

var clockBase = struct {
	t time.Time
	k int64
}{time.Now(), ticks()}

var monoBase = time.Now()

// monoNanos is nanoseconds since start-up on the monotonic clock (plus
// one: 0 means "never stamped").
func monoNanos() int64 { return int64(time.Since(monoBase)) + 1 }

// tickConv converts ticks to time; one per read of many records.
type tickConv struct {
	perNs float64 // ticks per nanosecond
}

var lastConv struct {
	mu sync.Mutex
	c  tickConv
	at time.Time
}

// newTickConv calibrates ticks against the wall clock now.
func newTickConv() tickConv {
	if ticksAreNanos() {
		return tickConv{perNs: 1}
	}
	now, k := time.Now(), ticks()
	lastConv.mu.Lock()
	defer lastConv.mu.Unlock()
	el := now.Sub(clockBase.t)
	if el < 10*time.Millisecond && lastConv.c.perNs > 0 {
		return lastConv.c // too soon after start-up for a fresh rate
	}
	if el <= 0 {
		return tickConv{perNs: 1}
	}
	c := tickConv{perNs: float64(k-clockBase.k) / float64(el)}
	lastConv.c, lastConv.at = c, now
	return c
}

// time converts k (0: never stamped) to wall time.
func (c tickConv) time(k int64) time.Time {
	if k == 0 || c.perNs <= 0 {
		return time.Time{}
	}
	return clockBase.t.Add(time.Duration(float64(k-clockBase.k) / c.perNs))
}
