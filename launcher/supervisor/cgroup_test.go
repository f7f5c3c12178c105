package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
