package limits

import (
	"errors"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/plan"
)

func TestCheck(t *testing.T) {
	roomy := Machine{files: 1 << 20, userProcs: 1 << 20, pidMax: 1 << 22, threadsMax: 1 << 22, procsInUse: 300}
	tests := []struct {
		name     string
		ranks    int
		lim      Machine
		resource string // "" when allowed
		want     string
	}{
		{name: "fits", ranks: 64, lim: roomy},
		{name: "no limits known", ranks: 1000, lim: Machine{}},
		{name: "absurd", ranks: 99999999999, lim: roomy, resource: "ranks", want: "99999999999 ranks requested; gorun runs at most 262144 ranks in one job"},
		{name: "open files", ranks: 5000, lim: Machine{files: 20000}, resource: "open files",
			want: "5000 ranks on this machine need about 20064 open files, but the limit is 20000 (ulimit -n, hard limit 20000"},
		{name: "open files just fit", ranks: 4984, lim: Machine{files: 20000}},
		{name: "user processes", ranks: 500, lim: Machine{userProcs: 512, procsInUse: 40}, resource: "processes",
			want: "500 ranks on this machine need about 501 processes, but the limit is 472 (ulimit -u is 512 with 40 in use)"},
		{name: "pid_max", ranks: 40000, lim: Machine{pidMax: 32768, procsInUse: 300}, resource: "processes", want: "kernel.pid_max is 32768"},
		{name: "threads-max", ranks: 40000, lim: Machine{threadsMax: 30000}, resource: "processes", want: "kernel.threads-max is 30000"},
		{name: "cgroup", ranks: 100, lim: Machine{cgroupPids: 128, cgroupInUse: 30}, resource: "processes", want: "pids.max of gorun's cgroup is 128 with 30 in use"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.ranks, tc.lim)
			if tc.resource == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ce *plan.CapacityError
			if !errors.As(err, &ce) || ce.Resource != tc.resource || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a %s CapacityError containing %q", err, tc.resource, tc.want)
			}
		})
	}
}
