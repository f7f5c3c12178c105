package comm_test

import (
	"fmt"
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
