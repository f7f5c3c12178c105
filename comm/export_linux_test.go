//go:build linux

package comm

import "os"

// SchedGroupTag is this process's scheduling-group tag as shared-memory
// links publish it (read once).
func SchedGroupTag() uint32 { return schedGroup() }

// SchedGroupHost says why JoinSchedGroup cannot move a process on this
// host ("" if it can): the conditions it checks itself, seen from outside.
func SchedGroupHost() string {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	v1, _ := cgroupMounts(string(mi))
	en, _ := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled")
	switch {
	case os.Geteuid() != 0:
		return "not root"
	case string(en) != "1\n":
		return "autogroup is off"
	case v1 == "":
		return "no cgroup v1 cpu hierarchy"
	case ownCPUCgroup() != "":
		return "this process's cpu cgroup is not the root: " + ownCPUCgroup()
	}
	return ""
}

// OnlineCPUs is the host's online CPU count.
func OnlineCPUs() int { return onlineCPUs() }

// HomeCPU is the CPU spreadOnce moved this process to (-1: none).
func HomeCPU() int { return int(homeCPU.Load()) - 1 }

// AllowedCPUs lists the CPUs this thread may run on (spreadTo's list).
func AllowedCPUs() []int { return allowedCPUs() }
