package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/cgroupfs"
)

// Job cgroups: containment that does not depend on a supervisor surviving.
//
// The supervisor (supervisor.go) is a child subreaper and kills every
// descendant of its ranks, wherever they moved (setsid, double fork).
// When the supervisor itself is SIGKILLed, its ranks die by Pdeathsig,
// and their orphans come to the next subreaper up: gorun, or the host
// agent, whose KillLeftovers finds them by GORUN_JOB_ID in their
// environment. A process that both leaves its session and clears its
// environment (setsid env -i daemon) escapes that scan: nothing left marks
// it as the job's.
//
// A cgroup marks it: membership is inherited at fork and cannot be left
// without write access to the cgroup tree, whatever the process does to
// its session or environment. So, where this process may write a cgroup
// hierarchy (root, with it mounted read-write), the client that starts a
// supervisor (Start: gorun on its host, a host agent on the
// others) makes a cgroup for that supervisor's job, moves the supervisor
// into it before sending its spec (so before any rank is forked), and,
// after the supervisor has exited for any reason, kills whatever is left
// in it and removes it (Client.ReleaseCgroup). Why the client
// and not a separate reaper process: the client is already the level
// that detects a dead or stopped supervisor (event pipe EOF, the beat
// lease), already reaps what it kills (it is a subreaper too), and a
// further process would be one more thing to be killed. A client that is
// itself SIGKILLed is covered by the supervisor, which then kills its
// subtree and removes the cgroup on its way out (removeOwnCgroup). Both
// killed at once are covered by the cgroup's reaper (reaper_linux.go), a
// sleeping third watcher that ends the cgroup once neither is left.
//
// Which hierarchy: cgroup v2 where one is mounted writable (its
// cgroup.kill kills every member in one kernel step), else cgroup v1's
// freezer (freeze, SIGKILL every member while none can fork or exit, thaw,
// until empty). Neither: gorun runs as before, and `gorun doctor` and
// the log say so.

// cgroupEnv lets a user turn job cgroups off ("off"): a site whose
// resource manager owns the cgroup tree (a SLURM cgroup plugin) may not
// want jobs' processes moved out of the step's cgroup. "v1" or "v2" uses
// only that version.
const cgroupEnv = "GORUN_CGROUP"

// jobCgroup is one job's cgroup on one host.
type jobCgroup struct {
	dir string // absolute path of the cgroup directory
	v2  bool   // cgroup v2 (cgroup.kill); else v1 freezer
}

// cgroupMount is a cgroup hierarchy this process could use: where it is
// mounted and the directory new cgroups are made in.
type cgroupMount struct {
	v2     bool
	parent string // directory to create job cgroups in
}

// findCgroupMount looks for a writable hierarchy: cgroup v2 first, then
// v1's freezer. It returns why there is none otherwise.
func findCgroupMount() (cgroupMount, error) {
	only := os.Getenv(cgroupEnv) // "v1" or "v2" picks one (tests cover both)
	if only == "off" || only == "0" {
		return cgroupMount{}, fmt.Errorf("%s=%s", cgroupEnv, only)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return cgroupMount{}, err
	}
	own, _ := os.ReadFile("/proc/self/cgroup")
	var v2, v1 *cgroupMount
	var why []string
	for _, mt := range cgroupfs.Mounts(string(mi)) {
		root, point, opts, fstype, super := mt.Root, mt.Point, mt.Options, mt.FSType, mt.Super
		switch {
		case fstype == "cgroup2" && v2 == nil && only != "v1":
			m := cgroupMount{v2: true, parent: ownCgroupDir(point, root, own, "")}
			if err := writableMount(opts, m.parent); err != nil {
				why = append(why, fmt.Sprintf("cgroup v2 at %s: %v", point, err))
				continue
			}
			v2 = &m
		case fstype == "cgroup" && v1 == nil && only != "v2" && cgroupfs.HasOption(super, "freezer"):
			// Below this process's own freezer cgroup, never at the
			// root: under a resource manager (SLURM's step cgroup) the
			// job must stay inside what the manager freezes and kills.
			m := cgroupMount{parent: ownCgroupDir(point, root, own, "freezer")}
			if err := writableMount(opts, m.parent); err != nil {
				why = append(why, fmt.Sprintf("cgroup v1 freezer at %s: %v", point, err))
				continue
			}
			v1 = &m
		}
	}
	switch {
	case v2 != nil:
		return *v2, nil
	case v1 != nil:
		return *v1, nil
	case len(why) > 0:
		return cgroupMount{}, errors.New(strings.Join(why, "; "))
	}
	return cgroupMount{}, errors.New("no cgroup v2 or cgroup v1 freezer hierarchy mounted")
}

// ownCgroupDir is this process's own cgroup directory in a hierarchy
// mounted at point (mount root root), from /proc/self/cgroup ("0::/p"
// for v2, controller ""; "N:freezer:/p" for v1's, controller "freezer"):
// new cgroups are made below one's own, so that a container's delegated
// subtree, or a resource manager's cgroup, still holds the job. Falls
// back to the mount point when the path is not visible there.
func ownCgroupDir(point, root string, procCgroup []byte, controller string) string {
	for _, line := range strings.Split(string(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (controller == "" && (parts[0] != "0" || parts[1] != "")) || (controller != "" && !cgroupfs.HasOption(parts[1], controller)) {
			continue
		}
		p := parts[2]
		if root != "/" {
			rel, ok := strings.CutPrefix(p, root)
			if !ok {
				return point
			}
			p = rel
		}
		dir := filepath.Join(point, p)
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
	}
	return point
}

// writableMount reports why cgroups cannot be made under dir: a read-only
// mount, or no write permission (not root, nothing delegated).
func writableMount(opts, dir string) error {
	if cgroupfs.HasOption(opts, "ro") {
		return errors.New("mounted read-only")
	}
	if err := syscall.Access(dir, 2 /* W_OK */); err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	return nil
}

// cgroupSeq numbers the job cgroups this process makes.
var cgroupSeq atomic.Int64

// newJobCgroup makes the cgroup for one supervisor's job: gorun-<job>-<pid
// of this client>-<n>, so that two jobs, two agents of one job on one
// machine (namespace test hosts), or two supervisors of one client never
// share one. A nil cgroup and the reason when this host offers none.
func newJobCgroup(jobID string) (*jobCgroup, error) {
	m, err := findCgroupMount()
	if err != nil {
		return nil, err
	}
	sweepStaleCgroups(m.parent)
	// The sequence number keeps two supervisors of one client apart
	// (a world restarted under the same job id): releasing one must never
	// kill the other's processes, so an existing directory is refused.
	name := fmt.Sprintf("gorun-%s-%d-%d", cgroupSafe(jobID), os.Getpid(), cgroupSeq.Add(1))
	dir := filepath.Join(m.parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	g := &jobCgroup{dir: dir, v2: m.v2}
	if g.v2 {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
			// A kernel before 5.14: no cgroup.kill; v1's freezer may do.
			_ = os.Remove(dir)
			return nil, fmt.Errorf("%s has no cgroup.kill (kernel before 5.14)", dir)
		}
	}
	return g, nil
}

// sweepStaleCgroups removes the empty job cgroups under parent whose
// client is gone: a client and its supervisor killed together (a host's
// processes SIGKILLed at once, as the chaos tests' kill-host does) leave
// their cgroup behind, and nothing else would ever remove it. Only empty
// ones: the kernel refuses to remove a cgroup with members, and a
// non-empty one may belong to a live job whose client runs in another PID
// namespace, where its pid means nothing here; for the same reason a
// directory younger than a minute is left alone (a live client moves its
// supervisor in within milliseconds of making it).
func sweepStaleCgroups(parent string) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, "gorun-") {
			continue
		}
		f := strings.Split(name, "-")
		if len(f) < 4 {
			continue
		}
		pid, err := strconv.Atoi(f[len(f)-2])
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			continue
		}
		if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		_ = os.Remove(filepath.Join(parent, name)) // fails, harmlessly, unless empty
	}
}

// cgroupSafe keeps a job id usable as one path element.
func cgroupSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	if len(b) == 0 {
		return "job"
	}
	return string(b)
}

// add moves pid (the supervisor, before it forks anything) into the
// cgroup; every process it starts after that is born there.
func (g *jobCgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// procs lists the processes in the cgroup.
func (g *jobCgroup) procs() []int {
	b, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// kill SIGKILLs every process in the cgroup until it is empty (bounded),
// and returns the pids it found there. v2 writes cgroup.kill, which the
// kernel applies to every member and to anything they fork meanwhile. v1
// freezes the group first, so that no member can fork a process the kill
// would miss, and no pid can be freed and reused between reading the list
// and the kill; killed members die only once thawed.
func (g *jobCgroup) kill() []int {
	found := map[int]bool{}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		pids := g.procs()
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			found[p] = true
		}
		if g.v2 {
			_ = os.WriteFile(filepath.Join(g.dir, "cgroup.kill"), []byte("1"), 0)
		} else {
			g.freezeKillThaw(deadline)
		}
		time.Sleep(5 * time.Millisecond)
	}
	out := make([]int, 0, len(found))
	for p := range found {
		out = append(out, p)
	}
	return out
}

// freezeKillThaw is one v1 round: FROZEN, SIGKILL each member, THAWED.
// The thaw comes whatever happens: a group left frozen would keep its
// processes alive and stuck for ever.
func (g *jobCgroup) freezeKillThaw(deadline time.Time) {
	state := filepath.Join(g.dir, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
		// Cannot freeze: kill what is listed now and let the loop
		// catch what was forked meanwhile.
		for _, p := range g.procs() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		return
	}
	defer func() { _ = os.WriteFile(state, []byte("THAWED"), 0) }()
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(state)
		if strings.TrimSpace(string(b)) == "FROZEN" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, p := range g.procs() {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// remove kills what is left and removes the cgroup; it returns the pids
// killed. An rmdir may fail with EBUSY while the last members are still
// exiting: it is retried, bounded.
func (g *jobCgroup) remove() ([]int, error) {
	killed := g.kill()
	var err error
	for range 200 {
		if err = os.Remove(g.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return killed, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return killed, fmt.Errorf("removing job cgroup %s: %w", g.dir, err)
}

// removeOwnCgroup is the supervisor's side, on its way out after its
// client died: it moves itself to the parent cgroup and removes the job's
// (empty by then: it killed every descendant). dir comes from the spec.
func removeOwnCgroup(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(dir), "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return err
	}
	g := &jobCgroup{dir: dir}
	_, err := g.remove()
	return err
}

// reapPids reaps those of pids that are this process's children (adopted
// orphans it killed), bounded by deadline; others answer ECHILD at once.
func reapPids(pids []int, deadline time.Time) {
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			var ws syscall.WaitStatus
			wpid, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			if wpid == pid || (err != nil && !errors.Is(err, syscall.EINTR)) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// CgroupSupport says where this host's jobs get their cgroups ("cgroup
// v2 (cgroup.kill) under DIR" or "cgroup v1 freezer under DIR"), or why
// they get none.
func CgroupSupport() (string, error) {
	m, err := findCgroupMount()
	if err != nil {
		return "", err
	}
	// Writable by the mount's flags and permissions is not yet proof (a
	// security module, a full cgroup.max.descendants): make one and
	// remove it, as a job would.
	probe := filepath.Join(m.parent, fmt.Sprintf("gorun-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return "", fmt.Errorf("cannot make a cgroup under %s: %w", m.parent, err)
	}
	if err := os.Remove(probe); err != nil {
		return "", fmt.Errorf("cannot remove the probe cgroup %s: %w", probe, err)
	}
	if m.v2 {
		return "cgroup v2 (cgroup.kill) under " + m.parent, nil
	}
	return "cgroup v1 freezer under " + m.parent, nil
}

// CgroupStatus is gorun doctor's line: where job cgroups go on this
// host, or why there are none.
func CgroupStatus() string {
	where, err := CgroupSupport()
	if err != nil {
		return "off: " + err.Error() + "; a process that leaves its session and clears its environment can outlive a SIGKILLed supervisor"
	}
	return "on: " + where
}
