// Package cgroupfs reads the kernel's description of the cgroup
// hierarchies a process sees: the cgroup mounts in /proc/self/mountinfo.
// The launcher looks there for a hierarchy in which to contain a job
// (launcher/supervisor/cgroup_linux.go) and comm for the cpu controller's
// hierarchy that decides which ranks share a scheduling group
// (comm/schedgroup_linux.go); both parse the same format here.
package cgroupfs

import (
	"strconv"
	"strings"
)

// Mount is one line of /proc/self/mountinfo (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//	id par dev root point  options   [optional] - fstype source superoptions
type Mount struct {
	Root    string // the mount's root within its file system ("/" for a whole hierarchy)
	Point   string // the mount point, unescaped
	Options string // per-mount options (ro or rw, ...)
	FSType  string // "cgroup" (v1) or "cgroup2" for the hierarchies
	Super   string // per-superblock options: a v1 hierarchy's controllers
}

// Mounts parses mountinfo's text into its mounts, in order, skipping lines
// that do not have the format's fields (an empty last line, say).
func Mounts(mountinfo string) []Mount {
	var ms []Mount
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 6 || len(g) < 1 {
			continue
		}
		m := Mount{Root: Unescape(f[3]), Point: Unescape(f[4]), Options: f[5], FSType: g[0]}
		if len(g) >= 3 {
			m.Super = g[2]
		}
		ms = append(ms, m)
	}
	return ms
}

// HasOption reports whether the comma-separated option list opts holds o
// exactly ("cpu" is not "cpuacct" nor "cpuset").
func HasOption(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// Unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash (\040 for a space), including one that ends the string.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
