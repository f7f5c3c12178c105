//go:build linux

package comm

import "testing"

// The cpu hierarchy of cgroup v1 and the v2 mount are found in mountinfo,
// escapes undone; other cgroup v1 hierarchies are not the cpu one.
func TestCgroupMounts(t *testing.T) {
	hybrid := `24 20 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
25 24 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw
27 24 0:25 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
28 24 0:26 / /sys/fs/cgroup/cpu\040x rw,relatime - cgroup cgroup rw,cpu
29 24 0:27 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
`
	if v1, v2 := cgroupMounts(hybrid); v1 != "/sys/fs/cgroup/cpu x" || v2 != "/sys/fs/cgroup/unified" {
		t.Errorf("hybrid: v1 cpu %q, v2 %q", v1, v2)
	}
	combined := "30 24 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
	if v1, v2 := cgroupMounts(combined); v1 != "/sys/fs/cgroup/cpu,cpuacct" || v2 != "" {
		t.Errorf("cpu,cpuacct: v1 cpu %q, v2 %q", v1, v2)
	}
	pure := "31 1 0:29 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	if v1, v2 := cgroupMounts(pure); v1 != "" || v2 != "/sys/fs/cgroup" {
		t.Errorf("pure v2: v1 cpu %q, v2 %q", v1, v2)
	}
}

// Below the root of the cpu controller's hierarchy the cgroup is the
// process's CFS group; at the root (or where the controller does not
// reach) it is not, and autogroup decides.
func TestCPUCgroupOf(t *testing.T) {
	withCPU := func(paths ...string) func(string) bool {
		return func(p string) bool {
			for _, q := range paths {
				if p == q {
					return true
				}
			}
			return false
		}
	}
	for _, tc := range []struct {
		name, proc string
		v2CPU      func(string) bool
		want       string
	}{
		{"v1 root (this reference host)", "4:memory:/x\n1:cpu:/\n0::/\n", withCPU(), ""},
		{"v1 container", "2:cpu,cpuacct:/docker/abc\n0::/\n", withCPU(), "v1:/docker/abc"},
		{"v1 job group", "1:cpu:/gorun-sched-j1\n0::/gorun-j1-5-1\n", withCPU("/gorun-j1-5-1"), "v1:/gorun-sched-j1"},
		{"v1 cpuacct alone is not cpu", "2:cpuacct:/a\n0::/\n", withCPU(), ""},
		{"v2 slice with cpu", "0::/user.slice/session-1.scope\n", withCPU("/user.slice/session-1.scope"), "v2:/user.slice/session-1.scope"},
		{"v2 without cpu controller", "0::/user.slice/session-1.scope\n", withCPU(), ""},
		{"v2 namespace root of a container", "0::/\n", withCPU("/"), "v2:/"},
		{"v2 host root", "0::/\n", withCPU(), ""},
		{"unreadable", "", nil, ""},
	} {
		if got := cpuCgroupOf(tc.proc, tc.v2CPU); got != tc.want {
			t.Errorf("%s: cpuCgroupOf(%q) = %q, want %q", tc.name, tc.proc, got, tc.want)
		}
	}
}

// A job id becomes a cgroup name only if it cannot leave the directory.
func TestSchedGroupName(t *testing.T) {
	if n, err := schedGroupName("0123abcd-x.y_z"); err != nil || n != "gorun-sched-0123abcd-x.y_z" {
		t.Errorf("good id: %q %v", n, err)
	}
	for _, bad := range []string{"", "../x", "a/b", "a b", "a\x00"} {
		if _, err := schedGroupName(bad); err == nil {
			t.Errorf("schedGroupName(%q) accepted", bad)
		}
	}
}
