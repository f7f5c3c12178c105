package plan

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/hostfile"
)

func baseConfig() Config {
	return Config{JobID: "job1", Secret: "s3cret", MasterPort: 1000, RdzvPort: 1001}
}

func TestNewPlacement(t *testing.T) {
	type place struct {
		host             string
		local, size, nod int
	}
	tests := []struct {
		name   string
		np     int
		hosts  []hostfile.Host
		over   bool
		want   []place
		nodes  []string
		errStr string
	}{
		{name: "no hosts, np 3", np: 3, want: []place{{"localhost", 0, 3, 0}, {"localhost", 1, 3, 0}, {"localhost", 2, 3, 0}}, nodes: []string{"localhost"}},
		{name: "no hosts, np omitted", np: 0, want: []place{{"localhost", 0, 1, 0}}, nodes: []string{"localhost"}},
		{name: "np omitted fills every slot", hosts: []hostfile.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 1}},
			want: []place{{"a", 0, 2, 0}, {"a", 1, 2, 0}, {"b", 0, 1, 1}}, nodes: []string{"a", "b"}},
		{name: "by slot: first host first", np: 3, hosts: []hostfile.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}},
			want: []place{{"a", 0, 2, 0}, {"a", 1, 2, 0}, {"b", 0, 1, 1}}, nodes: []string{"a", "b"}},
		{name: "unused hosts are left out", np: 2, hosts: []hostfile.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}},
			want: []place{{"a", 0, 2, 0}, {"a", 1, 2, 0}}, nodes: []string{"a"}},
		{name: "duplicates add slots", np: 3, hosts: []hostfile.Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}, {Name: "a", Slots: 1}},
			want: []place{{"a", 0, 2, 0}, {"a", 1, 2, 0}, {"b", 0, 1, 1}}, nodes: []string{"a", "b"}},
		{name: "too many ranks", np: 5, hosts: []hostfile.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}},
			errStr: "5 ranks requested but only 4 slots available on 2 hosts (use --oversubscribe"},
		{name: "oversubscribe round robin, contiguous per host", np: 7, over: true, hosts: []hostfile.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}},
			want:  []place{{"a", 0, 4, 0}, {"a", 1, 4, 0}, {"a", 2, 4, 0}, {"a", 3, 4, 0}, {"b", 0, 3, 1}, {"b", 1, 3, 1}, {"b", 2, 3, 1}},
			nodes: []string{"a", "b"}},
		{name: "oversubscribe respects max_slots", np: 5, over: true, hosts: []hostfile.Host{{Name: "a", Slots: 1, MaxSlots: 1}, {Name: "b", Slots: 1}},
			want: []place{{"a", 0, 1, 0}, {"b", 0, 4, 1}, {"b", 1, 4, 1}, {"b", 2, 4, 1}, {"b", 3, 4, 1}}, nodes: []string{"a", "b"}},
		{name: "max_slots total exceeded", np: 5, over: true, hosts: []hostfile.Host{{Name: "a", Slots: 1, MaxSlots: 2}, {Name: "b", Slots: 1, MaxSlots: 2}},
			errStr: "5 ranks requested but max_slots allows only 4 on 2 hosts"},
		{name: "negative np", np: -1, errStr: "-np must be positive"},
		{name: "zero slots", np: 1, hosts: []hostfile.Host{{Name: "a", Slots: 0}}, errStr: `host "a" has 0 slots`},
		{name: "max below slots", np: 1, hosts: []hostfile.Host{{Name: "a", Slots: 4, MaxSlots: 2}}, errStr: "max_slots 2 below its 4 slots"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			c.NP, c.Hosts, c.Oversubscribe = tc.np, tc.hosts, tc.over
			p, err := New(c)
			if tc.errStr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errStr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.errStr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.WorldSize != len(tc.want) || len(p.Ranks) != len(tc.want) {
				t.Fatalf("world size %d, %d ranks; want %d", p.WorldSize, len(p.Ranks), len(tc.want))
			}
			for i, w := range tc.want {
				r := p.Ranks[i]
				got := place{r.Host, r.LocalRank, r.LocalSize, r.NodeRank}
				if r.Rank != i || got != w {
					t.Errorf("rank %d: got %+v (rank %d), want %+v", i, got, r.Rank, w)
				}
			}
			var names []string
			for _, n := range p.Nodes {
				names = append(names, n.Name)
			}
			if !slices.Equal(names, tc.nodes) {
				t.Errorf("nodes %v, want %v", names, tc.nodes)
			}
		})
	}
}

func TestSlotsErrorIsTyped(t *testing.T) {
	c := baseConfig()
	c.NP, c.Hosts = 3, []hostfile.Host{{Name: "a", Slots: 2}}
	_, err := New(c)
	var se *SlotsError
	if !errors.As(err, &se) || se.Requested != 3 || se.Slots != 2 {
		t.Fatalf("err = %#v, want *SlotsError{3, 2}", err)
	}
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestNewEnvironment(t *testing.T) {
	c := baseConfig()
	c.NP = 5
	c.Hosts = []hostfile.Host{{Name: "h0", Slots: 3}, {Name: "h1", Slots: 2}}
	c.GPUsPerHost = 2
	c.Export = []string{"FOO=bar", "MASTER_ADDR=override"}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Ranks[4] // h1, local rank 1
	got := envMap(r.Env)
	want := map[string]string{
		"RANK": "4", "WORLD_SIZE": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"NODE_RANK": "1", "GROUP_RANK": "1", "MASTER_PORT": "1000",
		"PMI_RANK": "4", "PMI_SIZE": "5", "CUDA_VISIBLE_DEVICES": "1",
		"GORUN_JOB_ID": "job1", "GORUN_RANK": "4", "GORUN_WORLD_SIZE": "5",
		"GORUN_LOCAL_RANK": "1", "GORUN_LOCAL_WORLD_SIZE": "2", "GORUN_NODE_RANK": "1",
		"GORUN_HOST": "h1", "GORUN_SECRET": "s3cret", "GORUN_RDZV_ENDPOINT": "h0:1001",
		"FOO": "bar",
		// -x comes last and wins.
		"MASTER_ADDR": "override",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// gorun does not run Open MPI's launch protocol: nothing may claim it.
	for k := range got {
		if strings.HasPrefix(k, "OMPI_") {
			t.Errorf("%s set; gorun serves no Open MPI launch", k)
		}
	}
	// Without PMI (--pmi none) no PMI_* variable claims a server.
	c.NoPMI = true
	p, err = New(c)
	if err != nil {
		t.Fatal(err)
	}
	for k := range envMap(p.Ranks[4].Env) {
		if strings.HasPrefix(k, "PMI_") {
			t.Errorf("NoPMI plan sets %s", k)
		}
	}
	// Round robin GPUs per host: h0 has local ranks 0,1,2 → GPUs 0,1,0.
	for i, g := range []int{0, 1, 0, 0, 1} {
		if p.Ranks[i].GPU != g {
			t.Errorf("rank %d GPU %d, want %d", i, p.Ranks[i].GPU, g)
		}
	}
}

func TestNewNoGPUs(t *testing.T) {
	c := baseConfig()
	c.NP, c.MasterAddr = 2, "::1"
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Ranks {
		if _, ok := envMap(r.Env)["CUDA_VISIBLE_DEVICES"]; ok || r.GPU != -1 {
			t.Errorf("rank %d: GPU %d / CUDA_VISIBLE_DEVICES set without GPUs", r.Rank, r.GPU)
		}
	}
	if p.RdzvEndpoint != "[::1]:1001" {
		t.Errorf("rendezvous endpoint %q, want [::1]:1001", p.RdzvEndpoint)
	}
}

func TestNewIsDeterministic(t *testing.T) {
	c := baseConfig()
	c.NP, c.Oversubscribe, c.GPUsPerHost = 9, true, 3
	c.Hosts = []hostfile.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 3, MaxSlots: 4}}
	p1, err1 := New(c)
	p2, err2 := New(c)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	for i := range p1.Ranks {
		if !slices.Equal(p1.Ranks[i].Env, p2.Ranks[i].Env) {
			t.Fatalf("rank %d env differs between two plans of one config", i)
		}
	}
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"same ports", func(c *Config) { c.RdzvPort = c.MasterPort }, "two distinct ports"},
		{"no secret", func(c *Config) { c.Secret = "" }, "job id and a secret"},
		{"bad export", func(c *Config) { c.Export = []string{"=x"} }, "not NAME=VALUE"},
		{"negative GPUs", func(c *Config) { c.GPUsPerHost = -2 }, "GPUs per host"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			c.NP = 1
			tc.mod(&c)
			if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestResolveExports(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "HOME" {
			return "/root", true
		}
		return "", false
	}
	tests := []struct {
		in   []string
		want []string
		err  string
	}{
		{in: []string{"A=1", "HOME", "B="}, want: []string{"A=1", "HOME=/root", "B="}},
		{in: []string{"MISSING"}, err: "not set in gorun's environment"},
		{in: []string{"=1"}, err: "expected NAME or NAME=VALUE"},
		{in: []string{"A=1", "RANK=5"}, err: "-x RANK: gorun sets RANK to the rank on every rank; it cannot be exported"},
		{in: []string{"WORLD_SIZE=8"}, err: "-x WORLD_SIZE: gorun sets"},
		{in: []string{"NODE_RANK=1"}, err: "-x NODE_RANK: gorun sets"},
		{in: []string{"GORUN_SECRET=00"}, err: "-x GORUN_SECRET: gorun sets"},
		{in: []string{"PMI_FD=9"}, err: "-x PMI_FD: gorun sets"},
		// Chosen by the user unless gorun assigns GPUs (New checks).
		{in: []string{"CUDA_VISIBLE_DEVICES=1", "NCCL_SOCKET_IFNAME=eth1"}, want: []string{"CUDA_VISIBLE_DEVICES=1", "NCCL_SOCKET_IFNAME=eth1"}},
	}
	for _, tc := range tests {
		got, err := ResolveExports(tc.in, lookup)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v: got %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestMergeEnv(t *testing.T) {
	got := MergeEnv([]string{"A=1", "B=2", "C=3"}, []string{"B=20", "D=4"}, []string{"A=10"})
	if want := []string{"C=3", "B=20", "D=4", "A=10"}; !slices.Equal(got, want) {
		t.Fatalf("MergeEnv = %v, want %v", got, want)
	}
}

// Every variable RankEnv sets per rank is refused as an export, so that a
// new per-rank variable cannot be overridden silently either; the
// interface names and a CUDA_VISIBLE_DEVICES gorun does not assign are the
// user's.
func TestPlanRefusesExportsOfPerRankVariables(t *testing.T) {
	c := baseConfig()
	c.GPUsPerHost = 1
	c.Interfaces = map[string]string{"localhost": "eth0"}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	userChosen := map[string]bool{"NCCL_SOCKET_IFNAME": true, "GLOO_SOCKET_IFNAME": true, "MASTER_ADDR": true, "MASTER_PORT": true}
	for _, kv := range p.Ranks[0].Env {
		name, _, _ := strings.Cut(kv, "=")
		c := baseConfig()
		c.GPUsPerHost = 1
		c.Export = []string{name + "=x"}
		_, err := New(c)
		if userChosen[name] {
			if err != nil {
				t.Errorf("export of %s refused: %v", name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "-x "+name+": gorun sets") {
			t.Errorf("export of %s: err %v, want it refused", name, err)
		}
	}
	c = baseConfig()
	c.Export = []string{"CUDA_VISIBLE_DEVICES=2"}
	if _, err := New(c); err != nil {
		t.Errorf("CUDA_VISIBLE_DEVICES without --gpus-per-host refused: %v", err)
	}
}

// The plan refuses absurd counts before building one environment per rank,
// whether they come from -np or from slots.
func TestPlanRefusesAbsurdCounts(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.NP = 99999999999 },
		func(c *Config) { c.NP = MaxRanks + 1 },
		func(c *Config) {
			c.NP = 0
			c.Hosts = []hostfile.Host{{Name: "a", Slots: MaxRanks}, {Name: "b", Slots: 1 << 30}}
		},
	} {
		c := baseConfig()
		mod(&c)
		p, err := New(c)
		var ce *CapacityError
		if !errors.As(err, &ce) || ce.Resource != "ranks" || p != nil {
			t.Errorf("New(np %d, hosts %v) = %v, %v; want a ranks CapacityError", c.NP, c.Hosts, p, err)
		}
	}
}

// The endpoints ranks are told bracket an IPv6 master, as net.JoinHostPort
// does, so that "host:port" splits at the right colon.
func TestEndpointsBracketIPv6(t *testing.T) {
	for _, tc := range []struct{ addr, master, rdzv string }{
		{"10.0.0.1", "10.0.0.1:1000", "10.0.0.1:1001"},
		{"fe80::1", "[fe80::1]:1000", "[fe80::1]:1001"},
	} {
		c := baseConfig()
		c.MasterAddr = tc.addr
		p, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		if p.MasterEndpoint() != tc.master || p.RdzvEndpoint != tc.rdzv {
			t.Errorf("master %s: endpoints %s and %s, want %s and %s", tc.addr, p.MasterEndpoint(), p.RdzvEndpoint, tc.master, tc.rdzv)
		}
	}
}
