//go:build linux

package comm

import (
	"testing"
	"time"
)

// The waiter turns to yielding at once after one wait that found the peer
// on its CPU, and back to
// spinning first only after fastWaitsToSpin quick waits in a row.
func TestWaiterAdaptsToSlowPeer(t *testing.T) {
	var r ring
	r.noteWait(time.Microsecond, false)
	if r.slowPeer {
		t.Fatal("slow after a quick wait")
	}
	r.noteWait(time.Microsecond, true)
	if !r.slowPeer {
		t.Fatal("not slow after a wait that found the peer on our CPU")
	}
	for i := range fastWaitsToSpin - 1 {
		r.noteWait(time.Microsecond, false)
		if i == fastWaitsToSpin/2 {
			r.noteWait(yieldAfter.get()+time.Microsecond, false) // neither quick nor slow: no reset, no count
		}
	}
	if !r.slowPeer {
		t.Fatalf("spinning again after %d quick waits", fastWaitsToSpin-1)
	}
	r.noteWait(time.Microsecond, false)
	if r.slowPeer {
		t.Fatalf("still slow after %d quick waits", fastWaitsToSpin)
	}
}
