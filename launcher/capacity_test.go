package launcher

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

func TestCheckLocalCapacity(t *testing.T) {
	roomy := localLimits{files: 1 << 20, userProcs: 1 << 20, pidMax: 1 << 22, threadsMax: 1 << 22, procsInUse: 300}
	tests := []struct {
		name     string
		ranks    int
		lim      localLimits
		resource string // "" when allowed
		want     string
	}{
		{name: "fits", ranks: 64, lim: roomy},
		{name: "no limits known", ranks: 1000, lim: localLimits{}},
		{name: "absurd", ranks: 99999999999, lim: roomy, resource: "ranks", want: "99999999999 ranks requested; gorun runs at most 262144 ranks in one job"},
		{name: "open files", ranks: 5000, lim: localLimits{files: 20000}, resource: "open files",
			want: "5000 ranks on this machine need about 20064 open files, but the limit is 20000 (ulimit -n, hard limit 20000"},
		{name: "open files just fit", ranks: 4984, lim: localLimits{files: 20000}},
		{name: "user processes", ranks: 500, lim: localLimits{userProcs: 512, procsInUse: 40}, resource: "processes",
			want: "500 ranks on this machine need about 501 processes, but the limit is 472 (ulimit -u is 512 with 40 in use)"},
		{name: "pid_max", ranks: 40000, lim: localLimits{pidMax: 32768, procsInUse: 300}, resource: "processes", want: "kernel.pid_max is 32768"},
		{name: "threads-max", ranks: 40000, lim: localLimits{threadsMax: 30000}, resource: "processes", want: "kernel.threads-max is 30000"},
		{name: "cgroup", ranks: 100, lim: localLimits{cgroupPids: 128, cgroupInUse: 30}, resource: "processes", want: "pids.max of gorun's cgroup is 128 with 30 in use"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLocalCapacity(tc.ranks, tc.lim)
			if tc.resource == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ce *plan.CapacityError
			if !errors.As(err, &ce) || ce.Resource != tc.resource || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a %s CapacityError containing %q", err, tc.resource, tc.want)
			}
		})
	}
}

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
