package cgroupfs

import (
	"reflect"
	"testing"
)

func TestMounts(t *testing.T) {
	// A hybrid host: v1 controllers (one mount point with a space), the
	// unified v2 hierarchy, an optional field, a non-cgroup mount, and
	// lines without the separator or fields.
	const text = `25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
29 25 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
31 25 0:28 / /sys/fs/cgroup/cpu\040x ro,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct
32 25 0:29 /job\134one /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
garbage without a separator
1 2 3 - short
`
	want := []Mount{
		{Root: "/", Point: "/sys", Options: "rw,nosuid", FSType: "sysfs", Super: "rw"},
		{Root: "/", Point: "/sys/fs/cgroup/unified", Options: "rw,nosuid", FSType: "cgroup2", Super: "rw,nsdelegate"},
		{Root: "/", Point: "/sys/fs/cgroup/cpu x", Options: "ro,nosuid", FSType: "cgroup", Super: "rw,cpu,cpuacct"},
		{Root: `/job\one`, Point: "/sys/fs/cgroup/freezer", Options: "rw", FSType: "cgroup", Super: "rw,freezer"},
	}
	if got := Mounts(text); !reflect.DeepEqual(got, want) {
		t.Errorf("Mounts:\n got %+v\nwant %+v", got, want)
	}
}

func TestHasOption(t *testing.T) {
	for _, tc := range []struct {
		opts, o string
		want    bool
	}{
		{"rw,cpu,cpuacct", "cpu", true},
		{"rw,cpuacct", "cpu", false},
		{"rw,cpuset", "cpu", false},
		{"ro", "ro", true},
		{"", "ro", false},
	} {
		if got := HasOption(tc.opts, tc.o); got != tc.want {
			t.Errorf("HasOption(%q, %q) = %v, want %v", tc.opts, tc.o, got, tc.want)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:            "/plain",
		`/with\040space`:    "/with space",
		`/ends\040`:         "/ends ",        // an escape that ends the string
		`/tab\011and\134bs`: "/tab\tand\\bs", // tab and backslash
		`/not\09escape`:     `/not\09escape`,
		`/short\04`:         `/short\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
