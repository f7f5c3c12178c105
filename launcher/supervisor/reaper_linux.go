package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/internal/liveness"
)

// The job reaper: who ends a job whose two watchers died together.
//
// A job on a host has two watchers: its supervisor (supervisor.go) and
// the supervisor's client (gorun on its own host, a host agent on the
// others). Either one, left alone, ends the job and removes its cgroup:
// the client after the supervisor exited (ReleaseCgroup), the supervisor
// after its command pipe ended (removeOwnCgroup). Both SIGKILLed at once —
// `pkill -9 -f gorun` matches both, so does a node epilog, and a host
// agent dies with its supervisor when a host's processes are killed —
// leave nobody: the ranks die by Pdeathsig, but what they started (a
// plain `&` child, a setsid'd daemon, one that cleared its environment)
// is reparented to init and runs on in a cgroup nobody kills.
//
// So each job cgroup gets a third watcher, the reaper: a small process of
// the same executable (started with supervisorEnv=reaperProtocol), in its
// own session, outside the job's cgroup, that does nothing but wait. It
// holds the read end of a pipe whose only writer is the client, and a
// pidfd of the supervisor. When the pipe ends — the client closed it
// after releasing the cgroup, or the client died — and the cgroup is
// still there, it waits for the supervisor to be gone too (the supervisor
// may be busy ending the job itself), then kills every process left in
// the cgroup (cgroup.kill, or v1's freeze-kill-thaw) and removes it. A
// supervisor that is stopped (SIGSTOP, state T) is not waited for: with
// its client gone nobody is left to continue it, and until someone did,
// the job's ranks would run on; it is killed with the cgroup. With
// the reaper, any one or two of {client, supervisor, reaper} killed at
// once leaves a survivor that ends the job, and so does the triple
// {gorun, host agent, supervisor} of a remote host, whose reaper is not
// one of them.
//
// Why not a kernel mechanism: a PID namespace (kill its init and the
// kernel kills every member) would need the ranks to see namespace pids,
// which the job's reports and the ranks' own pid-named files rely on not
// to; cgroup v2 kills nothing by itself, and v1's release_agent is a
// host-wide setting. A cgroup needs a survivor to trigger its kill; the
// reaper is that survivor, and costs one sleeping process per job and
// host, and only where job cgroups are on.
//
// Its command line is "job-reaper", without the launcher's name: an
// operator's `pkill -9 -f gorun` is meant to end gorun's jobs, and the
// reaper is what ends them after it.

// reaperProtocol is supervisorEnv's value that makes the process a reaper.
const reaperProtocol = "reaper"

// reaperArgv0 is the reaper's command line (see above).
const reaperArgv0 = "job-reaper"

// Environment of a reaper: its cgroup's directory and version.
const (
	reaperCgroupEnv = "GORUN_INTERNAL_REAPER_CGROUP"
	reaperV2Env     = "GORUN_INTERNAL_REAPER_V2"
	reaperSupEnv    = "GORUN_INTERNAL_REAPER_SUPERVISOR" // its pid, to read its state
)

// How the reaper looks at a supervisor it waits for: every reaperLook,
// and it gives up waiting once the supervisor was seen stopped at every
// look for reaperStopped (a debugger's brief stop of a supervisor that is
// ending its job is not taken for a frozen one).
const (
	reaperLook    = 100 * time.Millisecond
	reaperStopped = 500 * time.Millisecond
)

// reaperClient is the client's handle on a started reaper.
type reaperClient struct {
	cmd *exec.Cmd
	w   *os.File // the pipe whose end tells the reaper its client is done
}

// startReaper starts the reaper of cgroup g, whose supervisor is sup (a
// started, unreaped child of this process: its pid cannot be reused while
// the pidfd is made). path is the executable, "" for this one.
func startReaper(path string, g *jobCgroup, sup int, stderr io.Writer) (*reaperClient, error) {
	if path == "" {
		path = "/proc/self/exe"
	}
	pidfd, err := unix.PidfdOpen(sup, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of the supervisor: %w", err)
	}
	pf := os.NewFile(uintptr(pidfd), "supervisor-pidfd")
	defer pf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	v2 := "0"
	if g.v2 {
		v2 = "1"
	}
	cmd := &exec.Cmd{
		Path: path,
		Args: []string{reaperArgv0},
		Env: []string{
			supervisorEnv + "=" + reaperProtocol,
			reaperCgroupEnv + "=" + g.dir,
			reaperV2Env + "=" + v2,
			reaperSupEnv + "=" + strconv.Itoa(sup),
		},
		Stdin:      r,
		Stderr:     stderr,
		ExtraFiles: []*os.File{pf}, // descriptor 3
		Dir:        "/",
		// A session of its own: no terminal's Ctrl-C, no kill of
		// gorun's process group reaches it. No Pdeathsig: it must
		// outlive its client.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return &reaperClient{cmd: cmd, w: w}, nil
}

// done tells the reaper that the client released the cgroup (or never
// will: it gave the job up alive) and reaps it. The reaper exits at once
// when the cgroup is gone; otherwise it ends the cgroup first. Idempotent
// on a nil reaper.
func (r *reaperClient) done() {
	if r == nil {
		return
	}
	r.w.Close()
	_ = r.cmd.Wait()
}

// reaperMain is the reaper process: it returns its exit code.
func reaperMain() int {
	// Its stderr is the client's, which may be an ssh channel that
	// closes with the client: a warning must then fail, not kill it.
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
	dir := os.Getenv(reaperCgroupEnv)
	if dir == "" || !filepath.IsAbs(dir) {
		fmt.Fprintf(os.Stderr, "gorun job reaper: %s=%q is not a cgroup directory\n", reaperCgroupEnv, dir)
		return 2
	}
	g := &jobCgroup{dir: dir, v2: os.Getenv(reaperV2Env) == "1"}
	// Blocks until the client closes the pipe or dies: nothing to do
	// meanwhile, and no CPU spent.
	_, _ = io.Copy(io.Discard, os.Stdin)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return 0 // released by the client: the normal end
	}
	// The client is gone without releasing. A supervisor still alive
	// ends the job itself (its command pipe ended too); wait for it, so
	// as not to kill it mid-report, then make sure. A stopped one ends
	// nothing: kill it (through its pidfd, so never another process of a
	// reused pid; it is in the cgroup too, unless it was already leaving).
	sup, _ := strconv.Atoi(os.Getenv(reaperSupEnv))
	if waitSupervisor(3, sup, liveness.ReadProc) {
		_ = unix.PidfdSendSignal(3, unix.SIGKILL, nil, 0)
	}
	killed, err := g.remove()
	reapPids(killed, time.Now().Add(time.Second))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gorun job reaper: %v\n", err)
		return 1
	}
	return 0
}

// waitSupervisor blocks until the process of pidfd fd, pid sup, has
// exited (or fd is no pidfd: nothing to wait for), or until it has stayed
// stopped for reaperStopped: then it returns true. Its state is read
// (through sample) only while the pidfd says it has not exited, so a
// reused pid is at worst read once, by a look that races its exit, and
// either answer ends the wait. sup 0: its state is unknown, the wait is
// for its exit alone.
func waitSupervisor(fd, sup int, sample liveness.Sampler) (stopped bool) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	var since time.Time // first look of the current stop, zero: not stopped
	for {
		timeout := -1
		if sup > 0 {
			timeout = int(reaperLook / time.Millisecond)
		}
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n > 0 {
			return false
		}
		s, ok := sample(sup)
		switch {
		case ok && s.Gone:
			return false
		case !ok || !s.Stopped():
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= reaperStopped:
			return true
		}
	}
}
