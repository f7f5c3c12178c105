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
		{"drop:rank=1", "drop needs at= or after-steps="},
		{"drop:rank=1:at=1s:after-steps=3", "at= and after-steps= both given"},
		{"delay:rank=1:ms=5:after-steps=0", "after-steps=0: must be at least 1"},
		{"corrupt:rank=1:after-steps=x", "after-steps=x: not a whole number"},
		{"corrupt:rank=1:after-steps=3:after-steps=4", `key "after-steps" given twice`},
		{"partition:at=1s", "partition needs ranks= or hosts="},
		{"partition:ranks=0:hosts=h1:at=1s", "ranks= and hosts= both given"},
		{"partition:hosts=h1,,h2:at=1s", "an empty host name"},
		{"partition:hosts=h1:after-steps=2:peer=3", `key "peer" does not apply to partition`},
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
		if got := c.s.Touches(c.me, c.peer, "h", "h"); got != c.want {
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

// A partition by hosts: parsed, checked against the job's hosts, and
// touching the links between its hosts and the others.
func TestPartitionByHosts(t *testing.T) {
	s, err := Parse("partition:hosts=h3,h2,h2:after-steps=5:for=2s")
	if err != nil || fmt.Sprint(s.Hosts) != "[h2 h3]" || s.AfterSteps != 5 || s.At != 0 || s.For != 2*time.Second {
		t.Fatalf("%+v %v", s, err)
	}
	job := []string{"h1", "h1", "h2", "h3"}
	if err := s.CheckHosts(job); err != nil {
		t.Error(err)
	}
	if err := s.CheckHosts([]string{"h1", "h2"}); err == nil || !strings.Contains(err.Error(), `host "h3" runs no rank of the job (its hosts: h1, h2)`) {
		t.Errorf("unknown host: %v", err)
	}
	if err := s.CheckHosts([]string{"h2", "h3", "h3"}); err == nil || !strings.Contains(err.Error(), "names every host") {
		t.Errorf("every host: %v", err)
	}
	for _, c := range []struct {
		me, peer int
		mh, ph   string
		want     bool
	}{
		{0, 2, "h1", "h2", true}, {2, 0, "h2", "h1", true}, {2, 3, "h2", "h3", false}, {0, 1, "h1", "h1", false},
	} {
		if got := s.Touches(c.me, c.peer, c.mh, c.ph); got != c.want {
			t.Errorf("Touches(%d@%s, %d@%s) = %v, want %v", c.me, c.mh, c.peer, c.ph, got, c.want)
		}
	}
}

// Step gates open at the step, whether asked for before or after it.
func TestStepGates(t *testing.T) {
	// Far above any step reported in this process so far (steps are
	// process-wide, so a second run, -count=2, starts above the first's).
	steps.mu.Lock()
	n := steps.last + 1<<40
	steps.mu.Unlock()
	g := Gate(n)
	select {
	case <-g.Done():
		t.Fatal("open before its step")
	default:
	}
	if Gate(n) != g {
		t.Error("two gates for one step")
	}
	ReportStep(n - 1)
	select {
	case <-g.Done():
		t.Fatal("open a step early")
	default:
	}
	before := time.Now()
	ReportStep(n + 2)
	select {
	case <-g.Done():
	default:
		t.Fatal("not open at a later step")
	}
	if g.At().Before(before) {
		t.Errorf("opened at %v, before the step's report %v", g.At(), before)
	}
	late := Gate(n + 1)
	select {
	case <-late.Done():
	default:
		t.Error("a gate asked for after its step is not open")
	}
}
