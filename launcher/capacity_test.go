package launcher

import (
	"testing"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// A host agent's capacity refusal (its hello, as launcher/hostagent's
// prepare_test pins it) becomes an error that names the host and the
// limit, before any rank starts.
func TestHostCapacityRefusalNamesHost(t *testing.T) {
	h := wire.Hello{Version: "v", ErrKind: "capacity", Err: "262145 ranks requested; gorun runs at most 262144 ranks in one job"}
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
}
