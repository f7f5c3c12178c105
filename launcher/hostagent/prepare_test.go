package hostagent

import (
	"net"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// A host agent refuses, in its hello, a rank count its own host cannot
// serve, before any rank starts; gorun's side (launcher's capacity_test)
// names the host and the limit from this hello. A count it can serve gets
// an answer with the program and two reserved ports.
func TestHostRefusesRanksItCannotServe(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	job := &wire.Job{Program: "/bin/true", Iface: "127.0.0.0/8", Ranks: plan.MaxRanks + 1}
	h, reserved := prepareHost(Options{Version: "v"}, job, c1, false)
	reserved.Release()
	const want = "262145 ranks requested; gorun runs at most 262144 ranks in one job"
	if h.ErrKind != "capacity" || h.Err != want || h.MasterPort != 0 {
		t.Fatalf("hello %q (%s, port %d), want a capacity refusal %q", h.Err, h.ErrKind, h.MasterPort, want)
	}
	job.Ranks = 4
	h, reserved = prepareHost(Options{Version: "v"}, job, c1, false)
	defer reserved.Release()
	if h.Err != "" {
		t.Fatalf("4 ranks refused: %s", h.Err)
	}
	if h.Version != "v" || h.Program != "/bin/true" || h.MasterPort == 0 || h.RdzvPort == 0 || h.Iface == "" {
		t.Errorf("hello %+v, want the version, the program, an interface and two ports", h)
	}
}
