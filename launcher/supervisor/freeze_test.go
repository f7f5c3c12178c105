package supervisor

import (
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
)

// TestFreezeAfter: the supervisor judges a stopped rank by the lease its
// runtime uses: the rendezvous's default, or GORUN_RDZV_LEASE from the
// rank's own environment, plus a quarter.
func TestFreezeAfter(t *testing.T) {
	if d := rendezvous.DefaultConfig().AttachLease; d != defaultLease {
		t.Fatalf("defaultLease %v, the rendezvous's default lease is %v", defaultLease, d)
	}
	for _, tc := range []struct {
		env  []string
		want time.Duration
	}{
		{nil, 5 * time.Second},
		{[]string{"GORUN_RDZV_LEASE=2s"}, 2500 * time.Millisecond},
		{[]string{"A=1", "GORUN_RDZV_LEASE=800ms", "B=2"}, time.Second},
		{[]string{"GORUN_RDZV_LEASE=nonsense"}, 5 * time.Second},
		{[]string{"GORUN_RDZV_LEASE=-1s"}, 5 * time.Second},
	} {
		if got := freezeAfter(tc.env); got != tc.want {
			t.Errorf("freezeAfter(%q) = %v, want %v", tc.env, got, tc.want)
		}
	}
}
