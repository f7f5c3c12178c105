package launcher

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseFault(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Fault
	}{
		{"kill:rank=2:at=2s", Fault{Kind: FaultKill, Rank: 2, At: 2 * time.Second, Signal: syscall.SIGKILL}},
		{"kill:rank=0:at=0s:sig=TERM", Fault{Kind: FaultKill, At: 0, Signal: syscall.SIGTERM}},
		{"kill:at=150ms:rank=3:sig=SIGUSR1", Fault{Kind: FaultKill, Rank: 3, At: 150 * time.Millisecond, Signal: syscall.SIGUSR1}},
		{"kill:rank=1:at=1s:sig=9", Fault{Kind: FaultKill, Rank: 1, At: time.Second, Signal: syscall.SIGKILL}},
		{"stop:rank=1:at=1s:for=5s", Fault{Kind: FaultStop, Rank: 1, At: time.Second, For: 5 * time.Second, Signal: syscall.SIGKILL}},
		{"stop:rank=1:at=1s", Fault{Kind: FaultStop, Rank: 1, At: time.Second, Signal: syscall.SIGKILL}},
		{"cont:rank=1:at=6s", Fault{Kind: FaultCont, Rank: 1, At: 6 * time.Second, Signal: syscall.SIGKILL}},
		{"kill-host:host=h2:at=3s", Fault{Kind: FaultKillHost, Host: "h2", At: 3 * time.Second, Signal: syscall.SIGKILL}},
		{"random:mtbf=10s:seed=7", Fault{Kind: FaultRandom, MTBF: 10 * time.Second, Seed: 7, Signal: syscall.SIGKILL}},
		{"kill:rank=1:after-steps=5", Fault{Kind: FaultKill, Rank: 1, AfterSteps: 5, Signal: syscall.SIGKILL}},
		{"stop:rank=0:after-steps=2:for=1s", Fault{Kind: FaultStop, AfterSteps: 2, For: time.Second, Signal: syscall.SIGKILL}},
		{"kill-host:host=h2:after-steps=7", Fault{Kind: FaultKillHost, Host: "h2", AfterSteps: 7, Signal: syscall.SIGKILL}},
	} {
		got, err := ParseFault(tc.spec)
		if err != nil {
			t.Errorf("ParseFault(%q): %v", tc.spec, err)
			continue
		}
		tc.want.Spec = tc.spec
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseFault(%q) = %+v, want %+v", tc.spec, got, tc.want)
		}
	}
}

func TestParseFaultRefuses(t *testing.T) {
	for _, tc := range []struct{ spec, why string }{
		{"", `unknown kind ""`},
		{"explode:rank=1:at=1s", `unknown kind "explode"`},
		{"kill:rank=2", "kill needs at= or after-steps="},
		{"kill:rank=1:at=1s:after-steps=5", "at= and after-steps= both given"},
		{"kill:rank=1:after-steps=0", "after-steps=0: must be at least 1"},
		{"kill:rank=1:after-steps=x", "after-steps=x: invalid syntax"},
		{"random:mtbf=1s:seed=1:after-steps=3", `key "after-steps" does not apply to random`},
		{"kill:at=2s", "kill needs rank="},
		{"kill-host:at=2s", "kill-host needs host="},
		{"random:mtbf=10s", "random needs seed="},
		{"kill:rank=x:at=2s", "rank=x: invalid syntax"},
		{"kill:rank=-1:at=2s", "rank=-1: must not be negative"},
		{"kill:rank=1:at=soon", "at=soon: not a duration"},
		{"kill:rank=1:at=-2s", "at=-2s: must not be negative"},
		{"kill:rank=1:at=2s:for=1s", `key "for" does not apply to kill`},
		{"stop:rank=1:at=2s:sig=TERM", `key "sig" does not apply to stop`},
		{"stop:rank=1:at=1s:for=0s", "for=0s: must be positive"},
		{"kill:rank=1:rank=2:at=1s", `key "rank" given twice`},
		{"kill:rank=1:at=1s:sig=NOPE", "sig=NOPE: no such signal"},
		{"kill:rank=1:at=1s:sig=99", "sig=99: no such signal number"},
		{"kill:rank=1:at", `field "at": expected key=value`},
		{"kill:rank=1:at=", "at= has no value"},
		{"random:mtbf=0s:seed=1", "mtbf=0s: must be at least 1ms"},
		{"random:mtbf=1s:seed=-3", "seed=-3: invalid syntax"},
	} {
		_, err := ParseFault(tc.spec)
		var se *FaultSpecError
		if !errors.As(err, &se) {
			t.Errorf("ParseFault(%q) = %v, want a *FaultSpecError", tc.spec, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), "--inject \""+tc.spec+"\"") {
			t.Errorf("ParseFault(%q) error %q, want it to name the spec and say %q", tc.spec, err, tc.why)
		}
	}
}

func TestParseFaultFile(t *testing.T) {
	fs, err := ParseFaultFile(strings.NewReader("# chaos\n\nkill:rank=1:at=1s\n  stop:rank=0:at=2s:for=1s  \n"), "f.txt")
	if err != nil || len(fs) != 2 || fs[0].Kind != FaultKill || fs[1].For != time.Second {
		t.Fatalf("ParseFaultFile = %+v, %v", fs, err)
	}
	_, err = ParseFaultFile(strings.NewReader("kill:rank=1:at=1s\n\nkill:rank=1\n"), "f.txt")
	if err == nil || !strings.Contains(err.Error(), "(f.txt:3)") {
		t.Fatalf("a bad third line: %v, want it named f.txt:3", err)
	}
}

// testPlan is a plan of two hosts with two ranks each.
func testPlan(t *testing.T) *Plan {
	t.Helper()
	p, err := NewPlan(PlanConfig{
		Hosts: []Host{{Name: "h1", Slots: 2}, {Name: "h2", Slots: 2}}, JobID: "j", Secret: "s",
		MasterAddr: "127.0.0.1", MasterPort: 1, RdzvPort: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustFaults(t *testing.T, specs ...string) []Fault {
	t.Helper()
	var out []Fault
	for _, s := range specs {
		f, err := ParseFault(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func TestSchedule(t *testing.T) {
	plan := testPlan(t)
	inj, err := schedule(mustFaults(t, "kill-host:host=h2:at=3s", "stop:rank=1:at=1s:for=5s", "kill:rank=0:at=1s:sig=TERM", "cont:rank=1:at=2s"), plan, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		kind  FaultKind
		at    time.Duration
		ranks []int
		host  string
		sig   syscall.Signal
		cont  time.Duration
	}
	var got []row
	for i, in := range inj {
		if in.id != i {
			t.Errorf("injection %d has id %d", i, in.id)
		}
		got = append(got, row{in.kind, in.at, in.ranks, in.host, in.sig, in.cont})
	}
	want := []row{
		// Ties keep the order the faults were given in.
		{FaultStop, time.Second, []int{1}, "h1", syscall.SIGSTOP, 5 * time.Second},
		{FaultKill, time.Second, []int{0}, "h1", syscall.SIGTERM, 0},
		{FaultCont, 2 * time.Second, []int{1}, "h1", syscall.SIGCONT, 0},
		{FaultKillHost, 3 * time.Second, []int{2, 3}, "h2", syscall.SIGKILL, 0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("schedule =\n%+v\nwant\n%+v", got, want)
	}
}

func TestScheduleRefuses(t *testing.T) {
	plan := testPlan(t)
	for _, tc := range []struct{ spec, why string }{
		{"kill:rank=4:at=1s", "rank 4 does not exist (the job has ranks 0-3)"},
		{"stop:rank=9:at=1s", "rank 9 does not exist"},
		{"kill-host:host=h3:at=1s", `host "h3" runs no rank of this job (its hosts: h1, h2)`},
	} {
		_, err := schedule(mustFaults(t, tc.spec), plan, time.Hour)
		var se *FaultSpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("schedule(%q) = %v, want a *FaultSpecError saying %q", tc.spec, err, tc.why)
		}
	}
}

// A random fault is reproducible from its seed, differs between seeds, and
// its mean gap is near the MTBF.
func TestScheduleRandom(t *testing.T) {
	plan := testPlan(t)
	run := func(spec string) []injection {
		inj, err := schedule(mustFaults(t, spec), plan, 1000*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return inj
	}
	a, b, c := run("random:mtbf=1s:seed=7"), run("random:mtbf=1s:seed=7"), run("random:mtbf=1s:seed=8")
	if !reflect.DeepEqual(a, b) {
		t.Error("the same seed gave two schedules")
	}
	if reflect.DeepEqual(a, c) {
		t.Error("seeds 7 and 8 gave the same schedule")
	}
	// 1000 s at a mean of 1 s: about 1000 kills (Poisson, sd ≈ 32).
	if len(a) < 850 || len(a) > 1150 {
		t.Errorf("%d kills in 1000 s with mtbf 1s", len(a))
	}
	seen := map[int]bool{}
	for i, in := range a {
		if in.kind != FaultKill || in.sig != syscall.SIGKILL || len(in.ranks) != 1 || in.at > 1000*time.Second {
			t.Fatalf("injection %d: %+v", i, in)
		}
		if i > 0 && in.at < a[i-1].at {
			t.Fatalf("injection %d at %s before %s", i, in.at, a[i-1].at)
		}
		seen[in.ranks[0]] = true
	}
	if len(seen) != plan.WorldSize {
		t.Errorf("random kills hit ranks %v, want every one of %d", seen, plan.WorldSize)
	}
}
