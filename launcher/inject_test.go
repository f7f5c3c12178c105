package launcher

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/fault"
	"github.com/gorun-hpc/gorun/launcher/plan"
)

// testPlan is a plan of two hosts with two ranks each.
func testPlan(t *testing.T) *Plan {
	t.Helper()
	p, err := plan.New(plan.Config{
		Hosts: []Host{{Name: "h1", Slots: 2}, {Name: "h2", Slots: 2}}, JobID: "j", Secret: "s",
		MasterAddr: "127.0.0.1", MasterPort: 1, RdzvPort: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustFaults(t *testing.T, specs ...string) []fault.Fault {
	t.Helper()
	var out []fault.Fault
	for _, s := range specs {
		f, err := fault.Parse(s)
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
		kind  fault.Kind
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
		{fault.Stop, time.Second, []int{1}, "h1", syscall.SIGSTOP, 5 * time.Second},
		{fault.Kill, time.Second, []int{0}, "h1", syscall.SIGTERM, 0},
		{fault.Cont, 2 * time.Second, []int{1}, "h1", syscall.SIGCONT, 0},
		{fault.KillHost, 3 * time.Second, []int{2, 3}, "h2", syscall.SIGKILL, 0},
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
		var se *fault.SpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("schedule(%q) = %v, want a *fault.SpecError saying %q", tc.spec, err, tc.why)
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
		if in.kind != fault.Kill || in.sig != syscall.SIGKILL || len(in.ranks) != 1 || in.at > 1000*time.Second {
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
