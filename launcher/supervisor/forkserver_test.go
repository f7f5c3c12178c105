package supervisor

import (
	"testing"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// The job's fork server runs the interpreter of the first rank that asks
// for one and runs Python; no rank asking, or none running Python, means
// no server.
func TestForkServerRank(t *testing.T) {
	ask := []string{ForkServerEnv + "=1"}
	for _, tc := range []struct {
		name  string
		ranks []wire.SupervisorRank
		want  int // the chosen rank, -1: none
	}{
		{"none asks", []wire.SupervisorRank{{Rank: 0, Path: "/usr/bin/python3"}}, -1},
		{"asked with another value", []wire.SupervisorRank{{Rank: 0, Path: "/usr/bin/python3", Env: []string{ForkServerEnv + "=0"}}}, -1},
		{"not python", []wire.SupervisorRank{{Rank: 0, Path: "/bin/trainer", Env: ask}}, -1},
		{"python in a venv", []wire.SupervisorRank{{Rank: 2, Path: "/venv/bin/python", Env: ask}}, 2},
		{"versioned", []wire.SupervisorRank{{Rank: 0, Path: "/bin/sh", Env: ask}, {Rank: 1, Path: "python3.11", Env: ask}}, 1},
		{"a directory named python", []wire.SupervisorRank{{Rank: 0, Path: "/opt/python/bin/trainer", Env: ask}}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := forkServerRank(tc.ranks)
			got := -1
			if ok {
				got = r.Rank
			}
			if got != tc.want {
				t.Fatalf("forkServerRank chose rank %d, want %d", got, tc.want)
			}
		})
	}
}

// A server the supervisor never started, or one turned off, is not used,
// and says why.
func TestForkServerUnusable(t *testing.T) {
	var none *forkServer
	if ok, why := none.usable("/usr/bin/python3"); ok || why == "" {
		t.Fatalf("no server: usable %v (%q)", ok, why)
	}
	s := &forkServer{rank: wire.SupervisorRank{Path: "/venv/bin/python"}}
	if ok, why := s.usable("/usr/bin/python3"); ok || why == "" {
		t.Fatalf("another interpreter: usable %v (%q)", ok, why)
	}
	s.off = "refused: CUDA"
	if ok, why := s.usable("/venv/bin/python"); ok || why != "refused: CUDA" {
		t.Fatalf("a server turned off: usable %v (%q)", ok, why)
	}
}
