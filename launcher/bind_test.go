package launcher

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestBindPolicyAndParse(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, BindAuto},
		{[]string{"A=1", "GORUN_BIND=none"}, BindNone},
		{[]string{"GORUN_BIND=none", "GORUN_BIND=auto"}, BindAuto}, // the last wins, as in exec
		{[]string{"GORUN_BINDX=none"}, BindAuto},
	} {
		if got := bindPolicy(tc.env); got != tc.want {
			t.Errorf("bindPolicy(%q) = %q, want %q", tc.env, got, tc.want)
		}
	}
	for in, want := range map[string]string{"": BindAuto, "auto": BindAuto, "none": BindNone, "core": ""} {
		got, err := ParseBind(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("ParseBind(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestOwnSessionAndParse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		crowded   bool
		env       []string
		onRuntime bool
		want      bool
	}{
		{"a CPU each", false, []string{"GORUN_SESSION=shared"}, true, true},
		{"crowded, gorun's runtime", true, nil, true, false},
		{"crowded, another program", true, nil, false, true},
		{"crowded, another program, shared", true, []string{"GORUN_SESSION=shared"}, false, false},
		{"crowded, gorun's runtime, own", true, []string{"GORUN_SESSION=own"}, true, true},
		{"crowded, shared, then auto", true, []string{"GORUN_SESSION=shared", "GORUN_SESSION=auto"}, false, true},
		{"crowded, --bind-to none", true, []string{"GORUN_BIND=none"}, true, true},
		{"crowded, --bind-to none, shared", true, []string{"GORUN_BIND=none", "GORUN_SESSION=shared"}, false, false},
		{"crowded, unknown value", true, []string{"GORUN_SESSION=bogus"}, true, false},
	} {
		asked := false
		got := ownSession(tc.crowded, tc.env, func() bool { asked = true; return tc.onRuntime })
		if got != tc.want {
			t.Errorf("%s: ownSession = %v, want %v", tc.name, got, tc.want)
		}
		if asked && !tc.crowded {
			t.Errorf("%s: read the program's build info for a rank with a CPU of its own", tc.name)
		}
	}
	for in, want := range map[string]string{"": SessionAuto, "auto": SessionAuto, "shared": SessionShared, "own": SessionOwn, "none": ""} {
		got, err := ParseSession(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("ParseSession(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// cpuList formats CPUs as the kernel's Cpus_allowed_list does for the
// cases here (single CPUs and one range).
func cpuList(cpus []int) string {
	if len(cpus) == 1 {
		return fmt.Sprint(cpus[0])
	}
	return fmt.Sprintf("%d-%d", cpus[0], cpus[len(cpus)-1])
}

// Ranks on a host with at least as many CPUs get disjoint equal shares of
// them; --bind-to none (GORUN_BIND=none) and more ranks than CPUs leave
// every rank the whole set.
func TestRunBindsRanksToCPUShares(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Skip(err)
	}
	ncpu := set.Count()
	all := cpuShares(1)[0]
	if ncpu < 2 {
		t.Skipf("needs 2 CPUs, has %d", ncpu)
	}
	shares := cpuShares(2)
	// Oversubscribed ranks get GOMAXPROCS=1 unless the environment (the
	// test's own, or -x) sets it.
	inherited := os.Getenv("GOMAXPROCS")
	crowdedProcs := cmp.Or(inherited, "1")
	for _, tc := range []struct {
		name   string
		np     int
		export []string
		want   func(r int) string
		procs  string // GOMAXPROCS in the rank's environment
	}{
		{"auto", 2, nil, func(r int) string { return cpuList(shares[r]) }, inherited},
		{"none", 2, []string{"GORUN_BIND=none"}, func(int) string { return cpuList(all) }, inherited},
		{"oversubscribed", ncpu + 1, nil, func(int) string { return cpuList(all) }, crowdedProcs},
		{"oversubscribed, none", ncpu + 1, []string{"GORUN_BIND=none"}, func(int) string { return cpuList(all) }, inherited},
		{"oversubscribed, GOMAXPROCS set", ncpu + 1, []string{"GOMAXPROCS=3"}, func(int) string { return cpuList(all) }, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJobRun(t, tc.np, "print-env", nil)
			j.job.Export = tc.export
			j.job.Oversubscribe = tc.np > ncpu
			if err := j.launch(context.Background()); err != nil {
				t.Fatal(err)
			}
			for r, env := range rankEnvs(t, j.stdout.String(), tc.np) {
				if got := env["GORUN_TEST_CPUS"]; got != tc.want(r) {
					t.Errorf("rank %d runs on CPUs %q, want %q", r, got, tc.want(r))
				}
				if got := env["GOMAXPROCS"]; got != tc.procs {
					t.Errorf("rank %d has GOMAXPROCS=%q, want %q", r, got, tc.procs)
				}
			}
		})
	}
}
