package launcher

import (
	"syscall"
	"testing"

	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// TestOwnFailure: which failures count as the program's own doing (and so
// may be deterministic) and which came from outside (always replaced).
func TestOwnFailure(t *testing.T) {
	for _, c := range []struct {
		code, signal int
		want         int
	}{
		{code: 1, want: 1},
		{code: 3, want: 3},
		{signal: int(syscall.SIGKILL), want: 0}, // the OOM killer, an operator, --inject
		{signal: int(syscall.SIGTERM), want: 0},
		{signal: int(syscall.SIGINT), want: 0},
		{signal: int(syscall.SIGSEGV), want: 128 + int(syscall.SIGSEGV)},
		{signal: int(syscall.SIGABRT), want: 128 + int(syscall.SIGABRT)},
		{signal: int(syscall.SIGBUS), want: 128 + int(syscall.SIGBUS)},
	} {
		if got := ownFailure(wire.Event{Code: c.code, Signal: c.signal}); got != c.want {
			t.Errorf("code %d signal %d: ownFailure %d, want %d", c.code, c.signal, got, c.want)
		}
	}
}

// TestQuorumAfterLossFormedBeforeTheHostWasCounted: the survivors'
// quorum without the lost host's rank is the one reported, whether it
// formed before gorun counted the host lost (the survivors' collective
// failed first) or after; and none is reported when no quorum followed.
func TestQuorumAfterLossFormedBeforeTheHostWasCounted(t *testing.T) {
	quorums := []ft.QuorumRecord{
		{ID: 1, At: 0.1, Participants: []int{0, 1, 2}},
		{ID: 2, At: 1.0, Participants: []int{0, 1}},
		{ID: 3, At: 3.0, Participants: []int{0, 1, 2}}, // a replacement healed
	}
	for _, tc := range []struct {
		name   string
		lostAt float64
		quorum []ft.QuorumRecord
		want   int
	}{
		{"survivors first", 1.2, quorums, 1},
		{"host counted first", 0.9, quorums, 1},
		{"no quorum after", 1.2, quorums[:1], -1},
		{"lost before any quorum had its rank", 0.05, quorums, 0},
	} {
		h := &FTHostLoss{At: tc.lostAt + 0.5, Ranks: []int{2}, Retired: []int{2}}
		if got := quorumAfterLoss(tc.quorum, 0.5, h); got != tc.want {
			t.Errorf("%s: quorum index %d, want %d", tc.name, got, tc.want)
		}
	}
}
