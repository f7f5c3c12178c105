package comm_test

import (
	"strings"
	"testing"
)

// Multi-process tests need runRanks, which is Linux-only (process_test.go).

// Striped links between processes: an all-reduce is right, and a rank
// killed mid-collective (its frames cut mid-stripe) fails the others with
// an error naming it, nobody hanging.
func TestMultiProcessStripedTCP(t *testing.T) {
	res, _ := runRanks(t, 3, "allreduce", "tcp", "GORUN_TCP_STREAMS=3")
	for r, p := range res {
		if p.code != 0 || !strings.Contains(p.stdout, "ok") {
			t.Errorf("allreduce rank %d: exit %d\n%s%s", r, p.code, p.stdout, p.stderr)
		}
	}
	const n = 3
	res, _ = runRanks(t, n, "crash", "tcp", "GORUN_TCP_STREAMS=4")
	for r, p := range res[:n-1] {
		if p.code != exitLost {
			t.Errorf("crash rank %d: exit %d, want %d\n%s", r, p.code, exitLost, p.stderr)
		}
		t.Logf("rank %d: %s", r, strings.TrimSpace(p.stderr))
	}
	if res[n-1].code != -1 {
		t.Errorf("victim exit %d, want killed", res[n-1].code)
	}
}
