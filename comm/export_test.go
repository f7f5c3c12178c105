package comm

import "time"

// SetTuning overrides the shared-memory waiter's spin and yield thresholds
// and whether Wait may run calls itself (benchmark experiments; safe while
// calls run).
func SetTuning(spin, yield time.Duration, inline bool) {
	spinLimit.ns.Store(int64(spin))
	yieldAfter.ns.Store(int64(yield))
	inlineWait.Store(inline)
}
