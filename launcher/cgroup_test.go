package launcher

import (
	"context"
	"errors"
	"fmt"
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
			t.Setenv(cgroupEnv, v)
			if _, err := CgroupSupport(); err != nil {
				t.Skipf("no writable cgroup %s hierarchy on this host (%v): job cgroups are off here", v, err)
			}
			m, err := findCgroupMount()
			if err != nil {
				t.Fatal(err)
			}
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
			cg := ownCgroupOf(t, sup, m.v2)
			if !strings.Contains(cg, "/gorun-") {
				t.Fatalf("supervisor %d is in cgroup %q, not a job cgroup", sup, cg)
			}
			for _, pid := range children {
				if got := ownCgroupOf(t, pid, m.v2); got != cg {
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
			var se *SupervisorError
			if !errors.As(err, &se) || se.Leftovers < 3 {
				t.Errorf("got %T %v, want a SupervisorError counting at least the 3 escaped children", err, err)
			}
			if alive := launchertest.Alive(children); len(alive) > 0 {
				t.Errorf("%d of 3 children that left their session and cleared their environment survive: %v", len(alive), alive)
			}
			if _, err := os.Stat(filepath.Join(m.parent, filepath.Base(cg))); !errors.Is(err, os.ErrNotExist) {
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

// Where a job cgroup goes: below this process's own cgroup of the
// hierarchy, found from /proc/self/cgroup relative to the mount's root;
// the mount point when the path is not visible there.
func TestOwnCgroupDir(t *testing.T) {
	point := t.TempDir()
	for _, d := range []string{"a/b", "b", "slurm/job_1/step_0"} {
		if err := os.MkdirAll(filepath.Join(point, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, root, procCgroup, controller, want string
	}{
		{"v2", "/", "0::/a/b\n", "", "a/b"},
		{"v2 root", "/", "0::/\n", "", ""},
		{"v2 mount of a subtree", "/a", "0::/a/b\n", "", "b"},
		{"v2 path outside the mount", "/x", "0::/a/b\n", "", ""},
		{"v2 path not there", "/", "0::/gone\n", "", ""},
		{"v1 freezer under slurm", "/", "6:freezer:/slurm/job_1/step_0\n4:memory:/other\n0::/\n", "freezer", "slurm/job_1/step_0"},
		{"v1 co-mounted", "/", "3:cpu,cpuacct,freezer:/a/b\n", "freezer", "a/b"},
		{"v1 not v2's line", "/", "0::/a/b\n", "freezer", ""},
		{"v2 not a v1 line", "/", "6:freezer:/a/b\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ownCgroupDir(point, tc.root, []byte(tc.procCgroup), tc.controller)
			if want := filepath.Join(point, tc.want); got != want {
				t.Errorf("ownCgroupDir = %q, want %q", got, want)
			}
		})
	}
}

func TestCgroupSafe(t *testing.T) {
	for in, want := range map[string]string{"3f7f3d05": "3f7f3d05", "a/b c": "a_b_c", "": "job", strings.Repeat("x", 80): strings.Repeat("x", 64)} {
		if got := cgroupSafe(in); got != want {
			t.Errorf("cgroupSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

// Empty job cgroups whose client is gone are removed when the next job
// cgroup is made; a live client's, a non-empty one and a young one stay.
func TestSweepStaleCgroups(t *testing.T) {
	parent := t.TempDir()
	old := time.Now().Add(-2 * time.Minute)
	mk := func(name string, age time.Time, file bool) string {
		d := filepath.Join(parent, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if file { // stands in for members: a non-empty directory cannot be removed
			if err := os.WriteFile(filepath.Join(d, "member"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(d, age, age); err != nil {
			t.Fatal(err)
		}
		return d
	}
	const deadPid = 1 << 30 // above pid_max: never a live process
	stale := mk(fmt.Sprintf("gorun-job-%d-1", deadPid), old, false)
	live := mk(fmt.Sprintf("gorun-job-%d-1", os.Getpid()), old, false)
	busy := mk(fmt.Sprintf("gorun-job-%d-2", deadPid), old, true)
	young := mk(fmt.Sprintf("gorun-job-%d-3", deadPid), time.Now(), false)
	other := mk("someone-else", old, false)
	sweepStaleCgroups(parent)
	for d, want := range map[string]bool{stale: false, live: true, busy: true, young: true, other: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(d), err == nil, want)
		}
	}
}
