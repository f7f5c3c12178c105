package launcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/internal/cgroupfs"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// The local supervisor is SIGKILLed while each rank has started a child
// that left its session and cleared its environment ("sleep 3600" with
// setsid and no environment): nothing but the job's cgroup marks those
// children as the job's. Every one of them must be gone when Launch
// returns, the cgroup removed, and the error must count them. Run for
// each cgroup version this host lets gorun write; skipped, naming why,
// where it has none (gorun then runs without job cgroups, as `gorun
// doctor` reports).
func TestCgroupKillsEscapedDescendants(t *testing.T) {
	for _, v := range []string{"v2", "v1"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("GORUN_CGROUP", v) // the supervisor's knob: this version only
			where, err := supervisor.CgroupSupport()
			if err != nil {
				t.Skipf("no writable cgroup %s hierarchy on this host (%v): job cgroups are off here", v, err)
			}
			// "cgroup v2 (cgroup.kill) under DIR" or "cgroup v1 freezer under DIR".
			_, parent, ok := strings.Cut(where, " under ")
			if !ok || parent == "" {
				t.Fatalf("CgroupSupport = %q: names no directory", where)
			}
			v2 := v == "v2"
			j := newJobRun(t, 3, "setsid-clearenv", nil)
			errc := make(chan error, 1)
			go func() { errc <- j.launch(context.Background()) }()
			if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 3 }) {
				t.Fatalf("ranks not ready: %s%s", j.stdout, j.stderr)
			}
			var children []int
			for _, c := range regexp.MustCompile(`\] ready \d+ \d+ child (\d+)`).FindAllStringSubmatch(j.stdout.String(), -1) {
				pid, _ := strconv.Atoi(c[1])
				children = append(children, pid)
			}
			if len(children) != 3 {
				t.Fatalf("want 3 children, got %v:\n%s", children, j.stdout)
			}
			// Whatever happens below, none outlives the test.
			t.Cleanup(func() {
				for _, pid := range launchertest.Alive(children) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			sup := supervisorOf(t, j)
			cg := ownCgroupOf(t, sup, v2)
			if !strings.Contains(cg, "/gorun-") {
				t.Fatalf("supervisor %d is in cgroup %q, not a job cgroup", sup, cg)
			}
			for _, pid := range children {
				if got := ownCgroupOf(t, pid, v2); got != cg {
					t.Fatalf("child %d is in cgroup %q, want the job's %q", pid, got, cg)
				}
			}
			if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case err = <-errc:
			case <-time.After(20 * time.Second):
				t.Fatal("gorun still waiting 20s after its supervisor was SIGKILLed")
			}
			var se *outcome.SupervisorError
			if !errors.As(err, &se) || se.Leftovers < 3 {
				t.Errorf("got %T %v, want a outcome.SupervisorError counting at least the 3 escaped children", err, err)
			}
			if alive := launchertest.Alive(children); len(alive) > 0 {
				t.Errorf("%d of 3 children that left their session and cleared their environment survive: %v", len(alive), alive)
			}
			if _, err := os.Stat(filepath.Join(parent, filepath.Base(cg))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("job cgroup %s left behind (%v)", cg, err)
			}
			t.Logf("%s: %v", v, err)
		})
	}
}

// ownCgroupOf returns pid's cgroup path in the v2 hierarchy, or in v1's
// freezer.
func ownCgroupOf(t *testing.T, pid int, v2 bool) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && ((v2 && parts[0] == "0") || (!v2 && cgroupfs.HasOption(parts[1], "freezer"))) {
			return parts[2]
		}
	}
	return ""
}
