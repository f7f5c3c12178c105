package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/rankenv"
)

// setChildSubreaper makes orphaned descendants of the calling process
// reparent to it instead of to init, so that a rank's grandchild that
// double-forks or calls setsid stays findable in our process tree.
func setChildSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// procState returns a process's state letter from /proc/PID/stat (R, S,
// D, T stopped, t traced, Z...), or 0 when it cannot be read.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces and ')': the state follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) {
		return b[i+2]
	}
	return 0
}

// procInfo is what descendant scanning needs from /proc/PID/stat.
type procInfo struct {
	pid, ppid int
	zombie    bool
}

// readProcs lists every process visible in /proc with its parent. Processes
// that vanish while being read are skipped.
func readProcs() []procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]procInfo, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue
		}
		// The command name in parentheses may contain spaces and ')': the
		// fields we want follow the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		f := bytes.Fields(b[i+2:])
		if len(f) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(string(f[1]))
		if err != nil {
			continue
		}
		out = append(out, procInfo{pid: pid, ppid: ppid, zombie: f[0][0] == 'Z'})
	}
	return out
}

// descendants returns the live (non-zombie) descendants of root. Because the
// supervisor is a child subreaper, every process its ranks ever started is in
// this tree, whatever session or process group it moved to.
//
// For the calling process itself it first asks the kernel whether it has
// any child at all (noChildren): every descendant's chain of parents runs
// through a child of root, so with none there is nothing to find, and the
// /proc scan — one open and read per process on the host, 2.5-3 ms for
// the 118 processes of the reference VM, measured at the end of every job
// in the supervisor and again in gorun — is skipped.
func descendants(root int) []int {
	if root == os.Getpid() && noChildren() {
		return nil
	}
	procs := readProcs()
	children := map[int][]procInfo{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if !c.zombie {
				out = append(out, c.pid)
			}
			queue = append(queue, c.pid)
		}
	}
	return out
}

// noChildren reports whether the calling process has no child process,
// alive or zombie, by any exit signal (__WALL). WNOWAIT leaves an exited
// child waitable, so the probe never reaps a child that another goroutine
// (an exec.Cmd's Wait) is about to collect; any answer but ECHILD, an error
// included, says "maybe" and the caller scans.
func noChildren() bool {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT|unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return errors.Is(err, unix.ECHILD)
	}
}

// closeOnExecAbove marks every open descriptor above minFD close-on-exec.
func closeOnExecAbove(minFD int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > minFD {
			unix.CloseOnExec(fd)
		}
	}
}

var subreaperOnce sync.Once

// AdoptOrphans makes this process a child subreaper, once: when a job's
// supervisor dies (SIGKILL, the OOM killer), the processes its ranks left
// in other sessions are orphaned, and they come to the nearest subreaper
// above them — this process, instead of init, where nothing would find
// them. KillLeftovers then ends them. The setting is process-wide and
// stays: orphans of anything this process started come here, which is
// harmless (KillLeftovers reaps what it kills; other zombies go with the
// process).
func AdoptOrphans() {
	subreaperOnce.Do(func() { _ = setChildSubreaper() })
}

// KillLeftovers SIGKILLs and reaps the descendants of this process that
// carry job's GORUN_JOB_ID — what survived a supervisor that died before
// it could kill them — and returns how many it found. It is the backstop
// behind the supervisor's own descendant scan, so it may rely on the
// environment marker (a process that cleared its environment escapes it);
// it gives up after a bounded time.
func KillLeftovers(jobID string) int {
	if jobID == "" {
		return 0
	}
	needle := []byte(rankenv.JobID + "=" + jobID + "\x00")
	found := map[int]bool{}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		var left []int
		for _, pid := range descendants(os.Getpid()) {
			env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if err == nil && bytes.Contains(append(env, 0), needle) {
				left = append(left, pid)
			}
		}
		for _, pid := range left {
			found[pid] = true
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Reap those that are our children now (adopted orphans), or they
	// stay zombies as long as this process lives; a pid that is not ours
	// answers ECHILD.
	pids := make([]int, 0, len(found))
	for pid := range found {
		pids = append(pids, pid)
	}
	reapPids(pids, deadline)
	return len(found)
}
