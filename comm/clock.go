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

// clockAt is a moment on both clocks: wall time t and ticks k.
type clockAt struct {
	t time.Time
	k int64
}

var clockBase = clockPair(nil)

// clockPair reads the wall clock and ticks at one moment: of a few tries
// (wall clock, ticks, wall clock), the one with the shortest gap between
// its two wall-clock reads, with the time at the midpoint. A single
// (time.Now(), ticks()) pair is off by however long the thread was away
// between the two reads, milliseconds on a loaded host, and every time
// converted from ticks (the flight records' issue, start and end, and so
// the watchdog's idea of how long a call has waited, which StallTimeout
// acts on) inherits that error in proportion to its age: libgorun's pytest
// saw a 1 s timeout fail a call 0.99 s after Python issued it, under CI's
// load. away, for tests, runs between a try's first wall-clock read and
// its ticks: it stands for the thread being descheduled there.
func clockPair(away func(try int)) clockAt {
	var b clockAt
	best := time.Duration(1<<63 - 1)
	for try := range clockPairTries {
		t1 := time.Now()
		if away != nil {
			away(try)
		}
		k := ticks()
		t2 := time.Now()
		if d := t2.Sub(t1); d < best {
			best, b = d, clockAt{t1.Add(d / 2), k}
		}
		if best <= clockPairGood {
			break
		}
	}
	return b
}

const (
	clockPairTries = 8
	// A gap this short is as good as the clocks allow (time.Now takes
	// 40-110 ns on the reference VM): no need to try again.
	clockPairGood = 500 * time.Nanosecond
)

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
	now := clockPair(nil)
	lastConv.mu.Lock()
	defer lastConv.mu.Unlock()
	if now.t.Sub(clockBase.t) < 10*time.Millisecond && lastConv.c.perNs > 0 {
		return lastConv.c // too soon after start-up for a fresh rate
	}
	c := rateBetween(clockBase, now)
	lastConv.c, lastConv.at = c, now.t
	return c
}

// rateBetween is the tick rate from moment a to moment b.
func rateBetween(a, b clockAt) tickConv {
	el := b.t.Sub(a.t)
	if el <= 0 {
		return tickConv{perNs: 1}
	}
	return tickConv{perNs: float64(b.k-a.k) / float64(el)}
}

// time converts k (0: never stamped) to wall time.
func (c tickConv) time(k int64) time.Time { return c.timeFrom(clockBase, k) }

// timeFrom converts k (0: never stamped) to wall time, counting from base.
func (c tickConv) timeFrom(base clockAt, k int64) time.Time {
	if k == 0 || c.perNs <= 0 {
		return time.Time{}
	}
	return base.t.Add(time.Duration(float64(k-base.k) / c.perNs))
}
