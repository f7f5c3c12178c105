package launcher

import (
	"net"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// A host agent refuses, in its hello, a rank count its own host cannot
// serve, and gorun names the host and the limit before any rank starts.
func TestHostRefusesRanksItCannotServe(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	job := &wire.Job{Program: "/bin/true", Iface: "127.0.0.0/8", Ranks: plan.MaxRanks + 1}
	h, ports := prepareHost(HostAgentOptions{Version: "v"}, job, c1, false)
	ports.Release()
	if h.ErrKind != "capacity" || !strings.Contains(h.Err, "262145 ranks requested; gorun runs at most 262144") {
		t.Fatalf("hello %q (%s), want a capacity refusal", h.Err, h.ErrKind)
	}
	m := &hostAgents{cfg: Config{Version: "v"}, nodes: []plan.Node{{Name: "h1"}}}
	err := m.checkHello(0, h)
	if err == nil || err.Error() != "host h1: check limits: 262145 ranks requested; gorun runs at most 262144 ranks in one job" {
		t.Fatalf("checkHello = %v", err)
	}
	// Bad input, like the local refusal: exit 1, not 255 (a lost host).
	if c := err.(interface{ ExitCode() int }).ExitCode(); c != 1 {
		t.Errorf("exit code of a host's capacity refusal = %d, want 1", c)
	}
	// A host that fails otherwise still reads as lost.
	if c := m.checkHello(0, wire.Hello{Version: "v", Err: "boom"}).(interface{ ExitCode() int }).ExitCode(); c != 255 {
		t.Errorf("exit code of a host's other failure = %d, want 255", c)
	}
	job.Ranks = 4
	if h, ports := prepareHost(HostAgentOptions{Version: "v"}, job, c1, false); h.Err != "" {
		t.Fatalf("4 ranks refused: %s", h.Err)
	} else {
		ports.Release()
	}
}
