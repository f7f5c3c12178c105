package comm

import (
	"testing"
	"time"
)

// A thread descheduled between the two reads of the start-up pair must
// not shift the times converted from ticks: the flight records' start
// times, from which the watchdog judges how long a call has waited
// (StallTimeout). Here the first try of the base pair loses 5 ms between
// its wall-clock read and its ticks; a stamp taken 10 ms later and read 40
// ms after that must still convert to within 1 ms of when it was taken.
// Taking the first try as it came put the stamp about 4 ms early.
func TestTickTimesSurviveASlowBasePair(t *testing.T) {
	base := clockPair(func(try int) {
		if try == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(10 * time.Millisecond)
	stamp := clockPair(nil) // ticks, and the wall time they were read at
	time.Sleep(40 * time.Millisecond)
	c := rateBetween(base, clockPair(nil))
	if d := c.timeFrom(base, stamp.k).Sub(stamp.t); d.Abs() > time.Millisecond {
		t.Fatalf("a stamp taken at %v converts to %v off", stamp.t.Format("15:04:05.000000"), d)
	}
}
