package limits

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/launcher/plan"
)

// Per-rank costs on the machine that runs the ranks. The supervisor holds
// the write ends of each rank's two output pipes (stdout, stderr) and, with
// PMI, one socketpair per rank until the ranks started. gorun (or the host
// agent) holds only the read ends, two per rank: it is a process of its own
// with the same hard limit, so the supervisor's count is the one that binds.
const (
	fdsPerRankSupervisor = 4
	// fdsBase covers everything else a job holds open (logs, listeners,
	// the supervisor's pipes, the runtime's own descriptors).
	fdsBase = 64
)

// Machine is the limits of a machine that the rank count of a job it runs
// meets, with what is in use already; 0 means no limit.
type Machine struct {
	// files is RLIMIT_NOFILE's hard limit: Go raises the soft limit to it
	// at start-up, in gorun and in its supervisor (the same binary).
	files int
	// userProcs is RLIMIT_NPROC (not enforced for root), userInUse the
	// processes and threads counted against it now (approximated by every
	// thread on the machine, as /proc does not say whose cheaply).
	userProcs, procsInUse int
	// pidMax is kernel.pid_max, threadsMax kernel.threads-max.
	pidMax, threadsMax int
	// cgroupPids is the pids controller's limit of gorun's cgroup and
	// cgroupInUse its current count.
	cgroupPids, cgroupInUse int
}

// Check refuses ranks ranks on a machine with the limits lim, with a
// *plan.CapacityError naming the resource and the limit. Pure, so that
// tests can give it any limits.
func Check(ranks int, lim Machine) error {
	if ranks > plan.MaxRanks {
		return &plan.CapacityError{Ranks: ranks, Resource: "ranks", Need: ranks, Limit: plan.MaxRanks}
	}
	if need := fdsPerRankSupervisor*ranks + fdsBase; lim.files > 0 && need > lim.files {
		return &plan.CapacityError{Ranks: ranks, Resource: "open files", Need: need, Limit: lim.files,
			Where: fmt.Sprintf("ulimit -n, hard limit %d; %d per rank in gorun's supervisor", lim.files, fdsPerRankSupervisor)}
	}
	for _, l := range []struct {
		limit, inUse int
		where        string
	}{
		{lim.userProcs, lim.procsInUse, "ulimit -u"},
		{lim.pidMax, lim.procsInUse, "kernel.pid_max"},
		{lim.threadsMax, lim.procsInUse, "kernel.threads-max"},
		{lim.cgroupPids, lim.cgroupInUse, "pids.max of gorun's cgroup"},
	} {
		if l.limit <= 0 {
			continue
		}
		// One process per rank, plus the supervisor.
		if need := ranks + 1; l.inUse+need > l.limit {
			return &plan.CapacityError{Ranks: ranks, Resource: "processes", Need: need, Limit: l.limit - l.inUse,
				Where: fmt.Sprintf("%s is %d with %d in use", l.where, l.limit, l.inUse)}
		}
	}
	return nil
}

// Read reads this machine's limits; a limit it cannot read is left at 0
// (unchecked).
func Read() Machine {
	var lim Machine
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Max != unix.RLIM_INFINITY && rl.Max < 1<<40 {
		lim.files = int(rl.Max)
	}
	if os.Geteuid() != 0 && unix.Getrlimit(unix.RLIMIT_NPROC, &rl) == nil && rl.Cur != unix.RLIM_INFINITY && rl.Cur < 1<<40 {
		lim.userProcs = int(rl.Cur)
	}
	lim.pidMax = readIntFile("/proc/sys/kernel/pid_max")
	lim.threadsMax = readIntFile("/proc/sys/kernel/threads-max")
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		lim.procsInUse = int(si.Procs) // threads, as the limits count them
	}
	lim.cgroupPids, lim.cgroupInUse = cgroupPids()
	return lim
}

// cgroupPids returns the pids controller's limit and count for this
// process's cgroup (v2, or v1's pids hierarchy); 0, 0 when there is none.
func cgroupPids() (limit, inUse int) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir = "/sys/fs/cgroup" + parts[2]
		case parts[1] == "pids":
			dir = "/sys/fs/cgroup/pids" + parts[2]
		default:
			continue
		}
		if l := readIntFile(dir + "/pids.max"); l > 0 {
			return l, readIntFile(dir + "/pids.current")
		}
	}
	return 0, 0
}

// readIntFile reads a file holding one integer ("max" and errors give 0).
func readIntFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}
