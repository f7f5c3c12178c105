//go:build linux

package comm

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/internal/cgroupfs"
)

// Scheduling groups of crowded ranks.
//
// A crowded shared-memory waiter hands its core to the peer queued behind
// it with sched_yield, which works only inside one CFS group (shmLink.wait,
// yieldOK). Which group a process is in: the cgroup of the cpu controller
// when that is not the hierarchy's root (the kernel then ignores autogroup),
// else its session's autogroup when autogroup is on, else the root group.
// schedGroup tags a process accordingly, and two ends of a link yield to
// each other when their tags match.
//
// The launcher starts the ranks of programs on gorun's runtime in one
// session on a crowded host (launcher/supervisor/bind.go) and every other
// program's in sessions of their own. A program that loads the runtime as a
// library (libgorun: Python with the torch backend) looks like any other
// program to the launcher, so its ranks get sessions of their own, and at the
// root cpu cgroup with autogroup on, each is alone in its group: 3-4x slower
// small collectives (notes/torch-backend.md). JoinSchedGroup lets such a rank
// put itself into one cpu cgroup with the job's other ranks on its host, which
// is one CFS group whatever the sessions.

// schedGroupPrefix starts the name of a job's scheduling cgroup; the job id
// follows (see schedGroupName).
const schedGroupPrefix = "gorun-sched-"

// schedGroupName is the cgroup a job's crowded ranks share on one host:
// the same name for every rank of the job, so the first to arrive makes it.
func schedGroupName(job string) (string, error) {
	if job == "" {
		return "", errors.New("comm: scheduling group: no job id")
	}
	for _, c := range job {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", fmt.Errorf("comm: scheduling group: job id %q: only letters, digits, '-', '_' and '.' make a cgroup name", job)
		}
	}
	return schedGroupPrefix + job, nil
}

// cgroupMounts finds in mountinfo (/proc/self/mountinfo's text) the mount
// point of cgroup v1's cpu hierarchy and of the cgroup v2 hierarchy ("" for
// one that is not mounted); the first of each wins.
func cgroupMounts(mountinfo string) (v1CPU, v2 string) {
	for _, m := range cgroupfs.Mounts(mountinfo) {
		switch {
		case m.FSType == "cgroup2" && v2 == "":
			v2 = m.Point
		case m.FSType == "cgroup" && v1CPU == "" && cgroupfs.HasOption(m.Super, "cpu"):
			v1CPU = m.Point
		}
	}
	return v1CPU, v2
}

// cpuCgroupOf returns the cgroup whose CFS group this process runs in, as
// a path, when the cpu controller applies to it below the root of its
// hierarchy; "" at the root (where autogroup decides) or when unknown.
// procCgroup is /proc/self/cgroup's text; v2CPU reports whether the v2
// cgroup at a path (relative to the v2 mount) has the cpu controller, i.e.
// a cpu.weight file, which the root cgroup lacks. A cgroup v1 cpu line wins
// (a hybrid host binds cpu to v1). Under a cgroup namespace a container's
// own cgroup reads "/": v2's cpu.weight still tells it from the root; on
// v1 it counts as the root, as before this check existed.
func cpuCgroupOf(procCgroup string, v2CPU func(path string) bool) string {
	v2Path := ""
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2Path = f[2]
		case cgroupfs.HasOption(f[1], "cpu"):
			if f[2] == "/" {
				return ""
			}
			return "v1:" + f[2]
		}
	}
	if v2Path != "" && v2CPU != nil && v2CPU(v2Path) {
		return "v2:" + v2Path
	}
	return ""
}

// ownCPUCgroup is cpuCgroupOf for this process.
func ownCPUCgroup() string {
	pc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	_, v2 := cgroupMounts(string(mi))
	return cpuCgroupOf(string(pc), func(path string) bool {
		if v2 == "" {
			return false
		}
		_, err := os.Stat(filepath.Join(v2, path, "cpu.weight"))
		return err == nil
	})
}

// cgroupTag is schedGroupTag's tag for a cpu cgroup path: a hash in
// [2^30, 2^31), apart from the session tags (bit 31 set) and, in practice,
// from autogroup numbers.
func cgroupTag(path string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(path))
	return h.Sum32()&(1<<30-1) | 1<<30
}

// JoinSchedGroup moves this process into its job's scheduling cgroup on
// this host (below the root of cgroup v1's cpu hierarchy), where every rank
// of the job that calls it shares one CFS group, when all of these hold:
// the host runs more of the job's ranks than it has online CPUs
// (localRanks), autogroup is on, and the cpu controller puts it at its
// hierarchy's root, so that its session's autogroup is its group.
// Otherwise it does nothing (joined "", nil error): nothing would be
// gained. The caller decides that this process's session holds no other
// rank of the job (gorun gave it one of its own: it leads it, or a wrapper
// of it such as a shell or a profiler does); ranks that share a session
// share its autogroup already, and a move of some of them would split
// them. Call it before any communicator is made, since a process's tag is
// read once.
//
// Only cgroup v1's cpu hierarchy is used: on cgroup v2 the rank's cgroup is
// also the job's containment cgroup (the launcher kills a job through it),
// which a move would escape; there, with the cpu controller enabled, the
// job's cgroup is already one group and the tags say so.
//
// leave moves the process back to the hierarchy's root and removes the
// cgroup if it is empty (the last rank out); a rank that dies first leaves
// it to RemoveSchedGroup, which the launcher calls once the job's ranks on
// the host are gone. An error (no permission: not root) leaves the process
// where it was; the caller may log it.
func JoinSchedGroup(job string, localRanks int) (joined string, leave func(), err error) {
	leave = func() {}
	if localRanks <= onlineCPUs() {
		return "", leave, nil
	}
	if en, _ := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); strings.TrimSpace(string(en)) != "1" {
		return "", leave, nil
	}
	if ownCPUCgroup() != "" {
		return "", leave, nil
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", leave, fmt.Errorf("comm: scheduling group: %w", err)
	}
	root, _ := cgroupMounts(string(mi))
	if root == "" {
		return "", leave, nil
	}
	name, err := schedGroupName(job)
	if err != nil {
		return "", leave, err
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", leave, fmt.Errorf("comm: scheduling group: %w", err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		_ = os.Remove(dir) // fails while another rank is in it
		return "", leave, fmt.Errorf("comm: scheduling group: %w", err)
	}
	return dir, func() {
		_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), pid, 0)
		_ = os.Remove(dir)
	}, nil
}

// RemoveSchedGroup removes the job's scheduling cgroup on this host if one
// is left (JoinSchedGroup); the launcher calls it once the job's ranks on
// the host are gone. A cgroup with members is not removed (an error).
func RemoveSchedGroup(job string) error {
	name, err := schedGroupName(job)
	if err != nil {
		return err
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	root, _ := cgroupMounts(string(mi))
	if root == "" {
		return nil
	}
	if err := os.Remove(filepath.Join(root, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("comm: scheduling group: %w", err)
	}
	return nil
}
