package launcher

import (
	"errors"
	"strings"
	"testing"
)

func TestIsLocal(t *testing.T) {
	id := LocalIdentity{Names: []string{"localhost", "vm", "vm.example"}, Addrs: []string{"127.0.0.1", "::1", "10.0.0.5"}}
	tests := []struct {
		host string
		want bool
	}{
		{"localhost", true}, {"LOCALHOST", true}, {"127.0.0.1", true}, {"127.0.1.1", true},
		{"::1", true}, {"[::1]", true}, {"vm", true}, {"vm.example.", true}, {"10.0.0.5", true},
		{"10.0.0.6", false}, {"node01", false}, {"vm2", false},
	}
	for _, tc := range tests {
		if got := id.IsLocal(tc.host); got != tc.want {
			t.Errorf("IsLocal(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
	err := RequireLocal([]Host{{Name: "vm", Slots: 1}, {Name: "node01", Slots: 1}}, id)
	var re *RemoteHostError
	if !errors.As(err, &re) || re.Host != "node01" || !strings.Contains(err.Error(), "is not this machine") {
		t.Fatalf("RequireLocal: %v", err)
	}
	if err := RequireLocal([]Host{{Name: "localhost", Slots: 1}}, DetectLocal()); err != nil {
		t.Fatalf("localhost is not local: %v", err)
	}
}

func TestPickFailure(t *testing.T) {
	fs := []failure{{rank: 3, code: 2}, {rank: 1, code: 1}, {rank: 2, signal: 9}}
	tests := []struct {
		policy ExitPolicy
		rank   int
	}{{ExitFirst, 3}, {ExitLowest, 1}, {ExitMax, 2}}
	for _, tc := range tests {
		if got := pickFailure(fs, tc.policy); got.rank != tc.rank {
			t.Errorf("%s: rank %d, want %d", tc.policy, got.rank, tc.rank)
		}
	}
}

func TestCountGPULines(t *testing.T) {
	out := "GPU 0: NVIDIA A100 (UUID: GPU-1)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\n  MIG 1g.5gb Device 0: (UUID: MIG-x)\n"
	if n := countGPULines([]byte(out)); n != 2 {
		t.Fatalf("countGPULines = %d, want 2", n)
	}
}
