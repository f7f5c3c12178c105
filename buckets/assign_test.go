package buckets

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAssignScenarios runs testdata/assign*.txt. Command:
//
//	assign [cap=BYTES] regions=a,b,c
//	TENSOR BYTES GROUP OP DTYPE DIRECTION REGION   (one per line, ready order)
func TestAssignScenarios(t *testing.T) {
	runScenarios(t, "testdata/assign*.txt", func(t *testing.T, sc scenario) string {
		p, err := assign(t, sc)
		if err != nil {
			return "error: " + err.Error()
		}
		return p.String()
	})
}

func assignFrom(t *testing.T, sc scenario) *Plan {
	p, err := assign(t, sc)
	if err != nil {
		t.Fatalf("%s: %v", sc.Pos, err)
	}
	return p
}

// assign parses the items of an assign or plan command and plans them.
func assign(t *testing.T, sc scenario) (*Plan, error) {
	{
		cfg := DefaultConfig()
		if c, ok := sc.Args["cap"]; ok {
			v, err := strconv.ParseInt(c, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Pos, err)
			}
			cfg.CapBytes = v
		}
		var items []Item
		for _, l := range strings.Split(sc.Input, "\n") {
			f := strings.Fields(l)
			if len(f) != 7 {
				t.Fatalf("%s: want 7 fields in %q", sc.Pos, l)
			}
			b, _ := strconv.ParseInt(f[1], 10, 64)
			items = append(items, Item{Tensor: f[0], Bytes: b, Group: f[2], Op: Op(f[3]), DType: f[4], Direction: Direction(f[5]), Region: f[6]})
		}
		var regions []string
		if r := sc.Args["regions"]; r != "" {
			regions = strings.Split(r, ",")
		}
		return Assign(items, regions, cfg)
	}
}

func TestModelTimes(t *testing.T) {
	m := Model{Latency: 10 * time.Microsecond, BusBandwidth: 1e9}
	for _, tc := range []struct {
		op    Op
		bytes int64
		ranks int
		want  time.Duration
	}{
		{AllReduce, 1000, 1, 0},                          // nothing to move
		{AllReduce, 1000, 2, 10*time.Microsecond + 1000}, // 2(n-1)/n = 1
		{AllReduce, 1000, 4, 10*time.Microsecond + 1500}, // 1.5
		{AllGather, 1000, 4, 10*time.Microsecond + 3000}, // shard × (n-1)
		{ReduceScatter, 1000, 4, 10*time.Microsecond + 750},
		{Broadcast, 1000, 4, 10*time.Microsecond + 1000},
	} {
		if got := m.Time(tc.op, tc.bytes, tc.ranks); got != tc.want {
			t.Errorf("%s %dB %d ranks: %v, want %v", tc.op, tc.bytes, tc.ranks, got, tc.want)
		}
	}
	// α·bw = 10 kB: below it latency is at least half of the time.
	if got := m.MinBucketBytes(); got != 10000 {
		t.Errorf("MinBucketBytes = %d, want 10000", got)
	}
	if got := m.CapBytes(); got != 190000 {
		t.Errorf("CapBytes = %d, want 190000", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for i, c := range []Config{
		{Model: Model{Latency: -1, BusBandwidth: 1}},
		{Model: Model{BusBandwidth: 0}},
		{Model: DefaultModel(), CapBytes: 10, MinBytes: 20},
		{Model: DefaultModel(), SearchLimit: -1},
		{Model: Model{Latency: 1, BusBandwidth: 1, CopyBandwidth: -1}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: Validate accepted %+v", i, c)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Error(err)
	}
	if err := LocalConfig().Validate(); err != nil {
		t.Error(err)
	}
}

func TestPack(t *testing.T) {
	for _, tc := range []struct {
		sizes []int64
		cap   int64
		want  string
	}{
		{nil, 10, "[]"},
		{[]int64{4, 4, 4}, 10, "[[0 2] [2 3]]"},
		{[]int64{20, 1, 1}, 10, "[[0 1] [1 3]]"}, // oversize item alone
		{[]int64{5, 5, 5, 5}, 10, "[[0 2] [2 4]]"},
	} {
		if got := fmt.Sprint(Pack(tc.sizes, tc.cap)); got != tc.want {
			t.Errorf("Pack(%v, %d) = %s, want %s", tc.sizes, tc.cap, got, tc.want)
		}
	}
}

func TestPlanValidateAndHash(t *testing.T) {
	good := func() *Plan {
		return &Plan{Groups: []GroupPlan{{Group: "dp", Buckets: []Bucket{{
			Name: "b0", Op: AllReduce, DType: "f32", Bytes: 12,
			Members: []Member{{Tensor: "a", Out: "a", Offset: 0, Bytes: 4}, {Tensor: "b", Out: "b", Offset: 4, Bytes: 8}},
		}}}}}
	}
	if err := good().Validate(); err != nil {
		t.Fatal(err)
	}
	h := good().Hash()
	renamed := good()
	renamed.Groups[0].Buckets[0].Name = "other"
	if renamed.Hash() != h {
		t.Error("bucket names must not change the hash")
	}
	for name, mut := range map[string]func(p *Plan){
		"gap":        func(p *Plan) { p.Groups[0].Buckets[0].Members[1].Offset = 8 },
		"misaligned": func(p *Plan) { p.Groups[0].Buckets[0].Members[0].Bytes = 3 },
		"sum":        func(p *Plan) { p.Groups[0].Buckets[0].Bytes = 16 },
		"dup": func(p *Plan) {
			p.Groups[0].Buckets = append(p.Groups[0].Buckets, p.Groups[0].Buckets[0])
		},
		"noout": func(p *Plan) { p.Groups[0].Buckets[0].Members[0].Out = "" },
		"op":    func(p *Plan) { p.Groups[0].Buckets[0].Op = "scan" },
	} {
		p := good()
		mut(p)
		if err := p.Validate(); !errors.Is(err, ErrBadPlan) {
			t.Errorf("%s: Validate = %v, want ErrBadPlan", name, err)
		}
		if name != "dup" && name != "op" && name != "noout" && p.Hash() == h {
			t.Errorf("%s: hash unchanged by a change ranks must agree on", name)
		}
	}
	swapped := good()
	m := swapped.Groups[0].Buckets[0].Members
	m[0].Tensor, m[1].Tensor = m[1].Tensor, m[0].Tensor
	if swapped.Hash() == h {
		t.Error("swapping members must change the hash")
	}
	loc := good().Index()["b"]
	if len(loc) != 1 || loc[0] != (Location{Group: "dp", Bucket: 0, Member: 1}) {
		t.Errorf("Index b = %+v", loc)
	}
}

// TestMergePays: a merge pays while packing the input and scattering the
// output back cost less than the latency it saves; with no copy bandwidth
// (members are views) it always pays.
func TestMergePays(t *testing.T) {
	// 10 µs latency, copies at 1 GB/s: 1 ns per byte copied.
	m := Model{Latency: 10 * time.Microsecond, BusBandwidth: 1e9, CopyBandwidth: 1e9}
	for _, tc := range []struct {
		op    Op
		bytes int64
		ranks int
		want  bool
	}{
		{AllReduce, 4_000, 2, true},      // 8 µs of copies < 10 µs
		{AllReduce, 5_000, 2, false},     // exactly 10 µs: no gain
		{AllReduce, 40_000, 2, false},    // 80 µs
		{AllGather, 1_500, 4, true},      // 1.5 KB in + 6 KB out
		{AllGather, 2_000, 5, false},     // 2 KB in + 10 KB out
		{ReduceScatter, 7_000, 4, true},  // 7 KB in + 1.75 KB out
		{ReduceScatter, 9_000, 2, false}, // 9 KB in + 4.5 KB out
		{AllToAll, 4_000, 4, true},       // 4 KB in + 4 KB out
		{Broadcast, 6_000, 8, false},     // 12 KB
	} {
		if got := m.MergePays(tc.op, tc.bytes, tc.ranks); got != tc.want {
			t.Errorf("MergePays(%s, %d B, %d ranks) = %v, want %v", tc.op, tc.bytes, tc.ranks, got, tc.want)
		}
	}
	m.CopyBandwidth = 0
	if !m.MergePays(AllReduce, 1<<30, 2) {
		t.Error("with views (no copy bandwidth) a merge must always pay")
	}
}
