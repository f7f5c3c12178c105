package launcher

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"golang.org/x/sys/unix"
)

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
	all := supervisor.CPUShares(1)[0]
	if ncpu < 2 {
		t.Skipf("needs 2 CPUs, has %d", ncpu)
	}
	shares := supervisor.CPUShares(2)
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
