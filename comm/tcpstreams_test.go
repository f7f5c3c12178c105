package comm_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// Every collective is correct over links striped across several TCP
// connections, with segments large enough to be striped and small frames
// that are not.
func TestCollectivesOverStripedTCP(t *testing.T) {
	testTCPStreams = 3
	defer func() { testTCPStreams = 0 }()
	sizes := []int{0, 13, 20001}
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cfg := comm.LocalConfig()
			cfg.SegmentBytes = 64 << 10
			cfg.TCPSegmentBytes = 64 << 10 // several frames per message, each striped
			cfg.LatencyNs = 100
			j := newNetJob(t, n, cfg, true)
			var tcs []tcase
			for _, tc := range cases(n, sizes) {
				if tc.dt == comm.Float32 || tc.dt == comm.BFloat16 {
					tcs = append(tcs, tc)
				}
			}
			runCases(t, j.comms, tcs, true)
		})
	}
}

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

// GORUN_TCP_STREAMS sets the default, and nonsense is refused.
func TestTCPStreamsSetting(t *testing.T) {
	for _, tc := range []struct {
		env string
		ok  bool
	}{{"2", true}, {"x", false}, {"17", false}, {"-1", false}} {
		t.Setenv("GORUN_TCP_STREAMS", tc.env)
		ep, err := comm.Listen(comm.EndpointConfig{Addr: "127.0.0.1:0", Secret: testSecret, ForceTCP: true})
		if (err == nil) != tc.ok {
			t.Errorf("GORUN_TCP_STREAMS=%s: %v", tc.env, err)
		}
		if ep != nil {
			ep.Close()
		}
	}
}
