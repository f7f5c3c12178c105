package rendezvous

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := LocalConfig()
	c.JobID, c.Rank, c.WorldSize, c.Host, c.Seed, c.Secret = "j", 1, 4, "h", "127.0.0.1:1", testSecret
	return c
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		edit        func(*Config)
	}{
		{"no job", "JobID", func(c *Config) { c.JobID = "" }},
		{"slash in job", "JobID", func(c *Config) { c.JobID = "a/b" }},
		{"rank too big", "Rank", func(c *Config) { c.Rank = 4 }},
		{"negative rank", "Rank", func(c *Config) { c.Rank = -1 }},
		{"no world", "WorldSize", func(c *Config) { c.WorldSize = 0 }},
		{"short secret", "Secret", func(c *Config) { c.Secret = []byte("short") }},
		{"no seed", "Seed", func(c *Config) { c.Seed = "" }},
		{"bad seed", "Seed", func(c *Config) { c.Seed = "nohostport" }},
		{"rank hosts", "RankHosts", func(c *Config) { c.RankHosts = []string{"a"} }},
		{"zero probe", "ProbeInterval", func(c *Config) { c.ProbeInterval = 0 }},
		{"probe timeout", "ProbeTimeout", func(c *Config) { c.ProbeTimeout = c.ProbeInterval }},
		{"meta too big", "JobID/Host/DataAddr", func(c *Config) { c.DataAddr = strings.Repeat("x", 600) }},
	} {
		c := validConfig()
		tc.edit(&c)
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v, want a ConfigError on %s", tc.name, err, tc.field)
		}
	}
	c := validConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Seed, c.WorldSize, c.Rank = "", 1, 0 // a world of one needs no seed
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// memberlist's suspicion timeout is mult·max(1, log10 n)·ProbeInterval; the
// multiplier chosen keeps it at or below SuspicionTimeout at any size.
func TestSuspicionMult(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct{ n, want int }{{2, 10}, {16, 8}, {64, 5}, {256, 4}, {1024, 3}, {100000, 2}} {
		if got := c.suspicionMult(tc.n); got != tc.want {
			t.Errorf("n=%d: mult %d, want %d", tc.n, got, tc.want)
		}
	}
}

// Every member passes a gossip message on at least minRetransmits times,
// whatever the world's size: with RetransmitMult 2 alone a 64-member world
// relayed each death only 4 times and about one run in twenty had a member
// that heard none of it (TestScale256 then failed its 2 s detection bound).
func TestRetransmitMult(t *testing.T) {
	c := DefaultConfig()
	tests := []struct{ n, want int }{{1, 6}, {9, 6}, {10, 3}, {64, 3}, {99, 3}, {100, 2}, {256, 2}, {1024, 2}, {100000, 2}}
	for _, tc := range tests {
		if got := c.retransmitMult(tc.n); got != tc.want {
			t.Errorf("n=%d: RetransmitMult %d, want %d", tc.n, got, tc.want)
		}
	}
	for n := 1; n <= 5000; n++ {
		// memberlist's limit (retransmitLimit in memberlist/util.go).
		limit := c.retransmitMult(n) * int(math.Ceil(math.Log10(float64(n+1))))
		if limit < minRetransmits {
			t.Fatalf("n=%d: %d retransmits, want at least %d", n, limit, minRetransmits)
		}
	}
	c.RetransmitMult = 5
	if got := c.retransmitMult(64); got != 5 {
		t.Errorf("a larger RetransmitMult is kept: got %d, want 5", got)
	}
	flat := DefaultConfig()
	flat.WorldSize, flat.Flat = 64, true
	if got := flat.memberlistConfig().RetransmitMult; got != 3 {
		t.Errorf("flat 64-member world: memberlist RetransmitMult %d, want 3", got)
	}
}

func TestMetaRoundTrip(t *testing.T) {
	m := Member{Rank: 1023, WorldSize: 1024, LocalRank: 7, JobID: "job-Ω", Host: "node17", DataAddr: "[fe80::1]:40000", PID: 4242}
	b := encodeMeta(m)
	got, err := decodeMeta(b)
	if err != nil || got != m {
		t.Fatalf("got %+v, %v", got, err)
	}
	for i := range b { // every truncation is an error, never a panic
		if _, err := decodeMeta(b[:i]); err == nil {
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
	if _, err := decodeMeta(append([]byte{9}, b[1:]...)); err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Errorf("other version: %v", err)
	}
}

func TestCollectRoundTrip(t *testing.T) {
	in := map[int][]byte{0: nil, 3: []byte("abc"), 1000: make([]byte, 300)}
	b := encodeCollect(42, 7, 3, 2, in)
	k, out, err := decodeCollect(b)
	if err != nil || k != (slotKey{42, 7, 3, 2}) || len(out) != 3 || string(out[3]) != "abc" || len(out[1000]) != 300 {
		t.Fatalf("got %v %v %v", k, out, err)
	}
	for i := range b {
		if _, _, err := decodeCollect(b[:i]); err == nil && i < len(b) {
			// A prefix may decode only if it ends exactly at an entry
			// boundary with the count satisfied, which this layout
			// does not allow before the last byte.
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
}

func TestGossipKey(t *testing.T) {
	a, _ := gossipKey(testSecret, "job1")
	b, _ := gossipKey(testSecret, "job2")
	c, _ := gossipKey([]byte("another secret, 32 bytes long!!!"), "job1")
	if len(a) != 32 || string(a) == string(b) || string(a) == string(c) {
		t.Fatal("keys must be 32 bytes and differ by job and secret")
	}
}

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// long: a flat table of environments, one case per launcher convention
// and refusal.
func TestConfigFromEnv(t *testing.T) {
	sec := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name    string
		env     func(string) (string, bool)
		check   func(Config) string // "" when fine
		wantErr string
	}{
		{
			name: "gorun",
			env: env("GORUN_RANK", "3", "GORUN_WORLD_SIZE", "8", "GORUN_LOCAL_RANK", "1", "GORUN_JOB_ID", "j1",
				"GORUN_RDZV_ENDPOINT", "10.1.1.1:4000", "GORUN_SECRET", sec, "GORUN_HOST", "n1",
				"RANK", "99", "WORLD_SIZE", "100"), // gorun's own variables win
			check: func(c Config) string {
				if c.Rank != 3 || c.WorldSize != 8 || c.LocalRank != 1 || c.JobID != "j1" || c.Seed != "10.1.1.1:4000" ||
					c.Host != "n1" || c.SecretDerived || len(c.Secret) != 32 || c.Secret[0] != 0xab {
					return "wrong identity"
				}
				return ""
			},
		},
		{
			name: "generation from gorun's restart count",
			env: env("GORUN_RANK", "0", "GORUN_WORLD_SIZE", "2", "GORUN_JOB_ID", "j", "GORUN_RDZV_ENDPOINT", "h:1", "GORUN_SECRET", sec,
				"GORUN_RESTART_COUNT", "3", "TORCHELASTIC_RESTART_COUNT", "9"),
			check: func(c Config) string {
				if c.Generation != 3 {
					return fmt.Sprintf("generation %d, want 3", c.Generation)
				}
				return ""
			},
		},
		{
			name: "generation from torchrun's restart count",
			env:  env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "10.0.0.5", "MASTER_PORT", "29500", "TORCHELASTIC_RESTART_COUNT", "2"),
			check: func(c Config) string {
				if c.Generation != 2 {
					return fmt.Sprintf("generation %d, want 2", c.Generation)
				}
				return ""
			},
		},
		{
			name:    "bad restart count",
			env:     env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "10.0.0.5", "MASTER_PORT", "29500", "TORCHELASTIC_RESTART_COUNT", "x"),
			wantErr: "TORCHELASTIC_RESTART_COUNT",
		},
		{
			name:    "gorun without secret",
			env:     env("GORUN_RANK", "0", "GORUN_WORLD_SIZE", "2", "GORUN_JOB_ID", "j", "GORUN_RDZV_ENDPOINT", "h:1"),
			wantErr: "GORUN_SECRET: not set",
		},
		{
			name: "torch",
			env:  env("RANK", "1", "WORLD_SIZE", "2", "LOCAL_RANK", "1", "MASTER_ADDR", "10.0.0.5", "MASTER_PORT", "29500", "GORUN_HOST", "x"),
			check: func(c Config) string {
				if c.Seed != "10.0.0.5:29500" || c.JobID != "torch-10.0.0.5-29500" || !c.SecretDerived || c.LocalRank != 1 {
					return "wrong torch config"
				}
				return ""
			},
		},
		{
			name: "torch with run id, secret and endpoint",
			env: env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "a", "MASTER_PORT", "1", "TORCHELASTIC_RUN_ID", "run7",
				"GORUN_SECRET", sec, "GORUN_RDZV_ENDPOINT", "b:2", "GORUN_HOST", "x", "SLURMD_NODENAME", "n9"),
			check: func(c Config) string {
				if c.Seed != "b:2" || c.JobID != "run7" || c.SecretDerived {
					return "wrong"
				}
				if c.Host != "x" { // gorun's host name wins over Slurm's node name (gorun inside an allocation)
					return "host " + c.Host + ", want GORUN_HOST's x over SLURMD_NODENAME"
				}
				return ""
			},
		},
		{
			name: "srun",
			env: env("SLURM_PROCID", "5", "SLURM_NTASKS", "6", "SLURM_LOCALID", "1", "SLURM_JOB_ID", "77", "SLURM_STEP_ID", "2",
				"SLURM_JOB_NODELIST", "n[01-03]", "SLURM_STEP_TASKS_PER_NODE", "2(x3)", "SLURMD_NODENAME", "n03"),
			check: func(c Config) string {
				if c.JobID != "slurm-77.2" || !strings.HasPrefix(c.Seed, "n01:") || c.Host != "n03" || c.Rank != 5 ||
					strings.Join(c.RankHosts, ",") != "n01,n01,n02,n02,n03,n03" || !c.SecretDerived {
					return "wrong srun config"
				}
				if p := slurmPort("slurm-77.2"); p < 10000 || p >= 30000 {
					return "port out of range"
				}
				return ""
			},
		},
		{
			name: "srun with port override",
			env: env("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_JOB_ID", "77", "SLURM_JOB_NODELIST", "vm,n[1-2]",
				"GORUN_RDZV_PORT", "4567", "GORUN_HOST", "vm", "GORUN_RDZV_TIMEOUT", "5m"),
			check: func(c Config) string {
				if c.Seed != "vm:4567" || c.RankHosts != nil || c.FormationTimeout != 5*time.Minute {
					return "wrong"
				}
				return ""
			},
		},
		{
			name: "host leaders from each launcher's local world size",
			env: env("GORUN_RANK", "5", "GORUN_WORLD_SIZE", "8", "GORUN_LOCAL_RANK", "1", "GORUN_LOCAL_WORLD_SIZE", "4",
				"GORUN_JOB_ID", "j", "GORUN_RDZV_ENDPOINT", "h:1", "GORUN_SECRET", sec, "GORUN_HOST", "n1"),
			check: func(c Config) string {
				if c.LocalWorldSize != 4 || c.Flat || !c.hierarchical() || c.leader() || c.gossipSize() != 2 {
					return "want host leaders, attached"
				}
				return ""
			},
		},
		{
			name: "flat forced",
			env: env("RANK", "0", "WORLD_SIZE", "4", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "4", "MASTER_ADDR", "a",
				"MASTER_PORT", "1", "GORUN_HOST", "x", "GORUN_RDZV_FLAT", "1"),
			check: func(c Config) string {
				if c.LocalWorldSize != 4 || !c.Flat || c.hierarchical() || !c.leader() {
					return "want flat"
				}
				return ""
			},
		},
		{
			name: "srun local world size",
			env: env("SLURM_PROCID", "4", "SLURM_NTASKS", "5", "SLURM_LOCALID", "0", "SLURM_NODEID", "1", "SLURM_JOB_ID", "7",
				"SLURM_JOB_NODELIST", "n[1-2]", "SLURM_STEP_TASKS_PER_NODE", "4,1", "SLURMD_NODENAME", "n2"),
			check: func(c Config) string {
				if c.LocalWorldSize != 1 || c.hierarchical() {
					return "want local world size 1"
				}
				return ""
			},
		},
		{name: "nothing", env: env(), wantErr: "no rank environment"},
		{name: "bad rank", env: env("RANK", "x", "WORLD_SIZE", "2"), wantErr: "RANK: \"x\" is not an integer"},
		{name: "bad secret", env: env("RANK", "0", "WORLD_SIZE", "1", "GORUN_SECRET", "zz", "GORUN_HOST", "h"), wantErr: "not hex"},
	} {
		c, err := configFromEnv(tc.env)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if msg := tc.check(c); msg != "" {
			t.Errorf("%s: %s: %+v", tc.name, msg, c)
		}
	}
}
