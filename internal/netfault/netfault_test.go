package netfault

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Malformed specs are refused naming the part at fault.
func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"drop:rank=1", "drop needs at="},
		{"drop:rank=1:at=1s:ms=3", `key "ms" does not apply to drop`},
		{"delay:rank=1:ms=0:at=1s", "ms=0: must be positive"},
		{"delay:rank=1:ms=5:at=1s:for=0s", "for=0s: must be positive"},
		{"partition:ranks=2-1:at=1s", "range runs backwards"},
		{"partition:ranks=0:at=1s:lease=0s", "lease=0s: must be at least 1ms"},
		{"corrupt:rank=1:peer=1:at=1s", "a rank has no link to itself"},
		{"corrupt:rank=1:rank=2:at=1s", `key "rank" given twice`},
		{"corrupt:rank=-1:at=1s", "rank=-1: must not be negative"},
		{"flood:rank=1:at=1s", "unknown kind"},
	} {
		_, err := Parse(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.spec) {
			t.Errorf("%s: %v, want %q", c.spec, err, c.want)
		}
	}
}

func TestParseAndCheck(t *testing.T) {
	s, err := Parse("partition:ranks=0-1,3:at=1s:for=3s")
	if err != nil || fmt.Sprint(s.Ranks) != "[0 1 3]" || s.Lease != DefaultLease || s.At != time.Second || s.For != 3*time.Second {
		t.Fatalf("%+v %v", s, err)
	}
	if err := s.Check(5); err != nil {
		t.Error(err)
	}
	if err := s.Check(3); err == nil || !strings.Contains(err.Error(), "rank 3 does not exist") {
		t.Errorf("Check(3): %v", err)
	}
	all, _ := Parse("partition:ranks=0-2:at=1s")
	if err := all.Check(3); err == nil || !strings.Contains(err.Error(), "no rank on the other side") {
		t.Errorf("a partition of everyone: %v", err)
	}
	d, err := Parse("delay:rank=1:peer=2:ms=50:at=1s:for=2s")
	if err != nil || d.Delay != 50*time.Millisecond || d.Peer != 2 {
		t.Fatalf("%+v %v", d, err)
	}
}

// Touches decides which links a fault acts on, from each end.
func TestTouches(t *testing.T) {
	drop, _ := Parse("drop:rank=1:peer=2:at=1s")
	all, _ := Parse("corrupt:rank=1:at=1s")
	part, _ := Parse("partition:ranks=0-1:at=1s")
	for _, c := range []struct {
		s        Spec
		me, peer int
		want     bool
	}{
		{drop, 1, 2, true}, {drop, 2, 1, false}, {drop, 1, 0, false},
		{all, 1, 0, true}, {all, 1, 3, true}, {all, 0, 1, false},
		{part, 0, 2, true}, {part, 2, 1, true}, {part, 0, 1, false}, {part, 2, 3, false},
	} {
		if got := c.s.Touches(c.me, c.peer); got != c.want {
			t.Errorf("%s: Touches(%d, %d) = %v, want %v", c.s.Text, c.me, c.peer, got, c.want)
		}
	}
}

// Env round trip, and FromEnv refusing a malformed value.
func TestEnv(t *testing.T) {
	specs, err := Decode("drop:rank=1:at=1s; delay:rank=0:ms=5:at=0s;")
	if err != nil || len(specs) != 2 || Encode(specs) != "drop:rank=1:at=1s;delay:rank=0:ms=5:at=0s" {
		t.Fatalf("%v %v %q", specs, err, Encode(specs))
	}
	t.Setenv(Env, "")
	if _, ok, err := FromEnv(); ok || err != nil {
		t.Errorf("empty: armed %v, %v", ok, err)
	}
	t.Setenv(Env, "drop:rank=1:at=1s")
	t.Setenv(EpochEnv, "1000")
	p, ok, err := FromEnv()
	if !ok || err != nil || !p.Epoch.Equal(time.Unix(0, 1000)) {
		t.Errorf("FromEnv = %+v %v %v", p, ok, err)
	}
	t.Setenv(EpochEnv, "soon")
	if _, _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), EpochEnv) {
		t.Errorf("bad epoch: %v", err)
	}
	t.Setenv(Env, "drop:rank=1")
	if _, _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), Env) {
		t.Errorf("bad spec: %v", err)
	}
}
