package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/gorun-hpc/gorun/internal/cgroupfs"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"golang.org/x/sys/unix"
)

// The watchers rows of the chaos matrix: the processes that watch a job
// — gorun, the per-job supervisor, the host agent of a remote host — are
// SIGKILLed in every pair and triple at once, while every rank has
// started processes that try to outlive it: a plain child (`&`), one in a
// session of its own (setsid), one that also cleared its environment
// (setsid env -i) and keeps a child of its own, and an orphan (its parent
// exited at once). After each kill no process of the job may be left
// running, and no job cgroup left behind, within watchersBound.
//
// A stop row SIGSTOPs some watchers first and SIGKILLs the others: a
// stopped supervisor whose client is dead can never end its job, so the
// job (and the stopped supervisor with it) must still be gone within the
// bound, not left waiting for someone to continue the supervisor. Such a
// row runs gorun under an init stand-in (initEnv) in the test's session,
// as a container's init or a batch script's shell runs it: the stopped
// supervisor is then reparented to a process of its own session, and
// stays stopped. Reparented to a process of another session (pid 1 on a
// host), its process group is orphaned with a stopped member, and the
// kernel continues it itself (SIGHUP, SIGCONT).
//
// make test runs one pass of the covering rows (watcherRow.ci);
// GORUN_WATCHERS_RUNS=N (make test-watchers: 50) runs every row N times
// and prints the survivors and leftover cgroups of each.

// spawnEnv makes this test binary the spawning rank: the value is the
// directory it writes "rank-R.pids" to.
const spawnEnv = "GORUN_CHAOS_SPAWN"

// watchersBound is how long the job may take to be gone after the kill.
const watchersBound = 10 * time.Second

// initEnv makes this test binary the init stand-in: a child subreaper
// that runs its arguments as a child in a process group of its own, reaps
// whatever comes to it, and exits once it has no child left.
const initEnv = "GORUN_CHAOS_INIT"

// maybeInit runs the init stand-in when initEnv is set.
func maybeInit() {
	if os.Getenv(initEnv) == "" {
		return
	}
	os.Exit(runInit(os.Args[1:]))
}

func runInit(argv []string) int {
	if len(argv) == 0 {
		return fail(fmt.Errorf("init stand-in: no command"))
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, initEnv+"=") {
			env = append(env, kv)
		}
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Env, c.Stdout, c.Stderr = env, os.Stdout, os.Stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		return fail(err)
	}
	for {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(-1, &ws, 0, nil); errors.Is(err, syscall.ECHILD) {
			return 0
		}
	}
}

// maybeSpawner runs the spawning rank when spawnEnv is set.
func maybeSpawner() {
	dir := os.Getenv(spawnEnv)
	if dir == "" {
		return
	}
	os.Exit(runSpawner(dir))
}

// runSpawner starts the rank's would-be survivors, records them (pid and
// start time, so that a reused pid is never mistaken for one) with its
// own, then waits to be killed.
func runSpawner(dir string) int {
	start := func(setsid bool, env []string, name string, args ...string) (*exec.Cmd, error) {
		c := exec.Command(name, args...)
		c.Env = env
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
		return c, c.Start()
	}
	pids := []int{os.Getpid()}
	// A plain child: same session and process group as the rank.
	c, err := start(false, nil, "sleep", "3600")
	if err != nil {
		return fail(err)
	}
	pids = append(pids, c.Process.Pid)
	// A session of its own.
	if c, err = start(true, nil, "sleep", "3600"); err != nil {
		return fail(err)
	}
	pids = append(pids, c.Process.Pid)
	// A session of its own and no environment at all, with a child.
	// An orphan: its parent exits once it started it, so it is
	// reparented to the nearest subreaper at once.
	for _, script := range []string{"sleep 3600 & echo $!; exec sleep 3600", "setsid sleep 3600 & echo $!"} {
		c = exec.Command("/bin/sh", "-c", script)
		c.Env = []string{} // empty, not nil: nothing inherited
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		out, err := c.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := c.Start(); err != nil {
			return fail(err)
		}
		var line [32]byte
		n, _ := out.Read(line[:])
		child, err := strconv.Atoi(strings.TrimSpace(string(line[:n])))
		if err != nil {
			return fail(fmt.Errorf("child pid %q: %v", line[:n], err))
		}
		pids = append(pids, c.Process.Pid, child)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "job %s\n", os.Getenv("GORUN_JOB_ID"))
	for _, p := range pids {
		fmt.Fprintf(&b, "%d %d\n", p, startTime(p))
	}
	name := filepath.Join(dir, "rank-"+os.Getenv("RANK")+".pids")
	if err := os.WriteFile(name+".tmp", []byte(b.String()), 0o644); err != nil {
		return fail(err)
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		return fail(err)
	}
	time.Sleep(time.Hour)
	return 0
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "spawner:", err)
	return 5
}

// startTime is a process's start time in clock ticks since boot (field 22
// of /proc/PID/stat), 0 if it is gone; stateOf its state letter.
func startTime(pid int) uint64 {
	f := statFields(pid)
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

func stateOf(pid int) string {
	if f := statFields(pid); len(f) > 0 {
		return f[0]
	}
	return ""
}

// statFields are /proc/PID/stat's fields after the command (state first).
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// tracked is one process a rank started (or the rank), by pid and start
// time.
type tracked struct {
	pid   int
	start uint64
}

// alive reports whether it still runs: same pid, same start, not a zombie.
func (p tracked) alive() bool {
	st := stateOf(p.pid)
	return st != "" && st != "Z" && st != "X" && startTime(p.pid) == p.start
}

// readSpawned reads every rank's record once all np exist.
func readSpawned(dir string, np int) (job string, procs []tracked, ok bool) {
	for r := range np {
		b, err := os.ReadFile(filepath.Join(dir, "rank-"+strconv.Itoa(r)+".pids"))
		if err != nil {
			return "", nil, false
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == "job" {
				job = f[1]
				continue
			}
			if len(f) != 2 {
				continue
			}
			pid, _ := strconv.Atoi(f[0])
			st, _ := strconv.ParseUint(f[1], 10, 64)
			procs = append(procs, tracked{pid, st})
		}
	}
	return job, procs, true
}

// jobCgroups lists the job's cgroup directories (gorun-JOB-*) in every
// cgroup hierarchy mounted here, a few levels deep.
func jobCgroups(job string) []string {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range cgroupfs.Mounts(string(mi)) {
		root := m.Point
		if (m.FSType != "cgroup" && m.FSType != "cgroup2") || seen[root] {
			continue
		}
		seen[root] = true
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if strings.Count(strings.TrimPrefix(p, root), "/") > 4 {
				return fs.SkipDir
			}
			if strings.HasPrefix(d.Name(), "gorun-"+job+"-") {
				out = append(out, p)
				return fs.SkipDir
			}
			return nil
		})
	}
	return out
}

// watcherRow is one set of watchers killed together.
type watcherRow struct {
	hosts bool     // across the namespace hosts (one rank each), else on this host
	kill  []string // "gorun", "supervisor", "agent"; "pkill": every process whose command line names gorun's binary, as pkill -9 -f PATH
	stop  []string // SIGSTOPped just before the kill (same names); counted as survivors until gone
	init  bool     // gorun runs under the init stand-in (local rows)
	ci    bool
}

func (r watcherRow) name() string {
	where := "local"
	if r.hosts {
		where = "hosts"
	}
	s := where + "/kill-watchers/" + strings.Join(r.kill, "+")
	if len(r.stop) > 0 {
		s += "/stopped-" + strings.Join(r.stop, "+")
	}
	if r.init {
		s += "/under-init"
	}
	return s
}

func watcherRows() []watcherRow {
	return []watcherRow{
		{kill: []string{"gorun"}},
		{kill: []string{"supervisor"}},
		{kill: []string{"gorun", "supervisor"}, ci: true},
		{kill: []string{"pkill"}},
		{hosts: true, kill: []string{"gorun", "agent"}},
		{hosts: true, kill: []string{"gorun", "supervisor"}},
		{hosts: true, kill: []string{"agent", "supervisor"}, ci: true},
		{hosts: true, kill: []string{"gorun", "agent", "supervisor"}, ci: true},
		{hosts: true, kill: []string{"pkill"}},
		// A stopped supervisor outlives its killed client.
		{kill: []string{"gorun"}, stop: []string{"supervisor"}, init: true, ci: true},
		// On a namespace host the killed agent's supervisor goes to
		// another session: the kernel continues it (see above).
		{hosts: true, kill: []string{"agent"}, stop: []string{"supervisor"}},
	}
}

// watcherResult is one run of a row.
type watcherResult struct {
	survivors, cgroups int
	gone               time.Duration // kill to nothing left (or to the bound)
	err                string
}

func TestKillWatchers(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes; skipped in -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("the job cgroups that hold what ranks leave need root")
	}
	runs := 1
	if v, err := strconv.Atoi(os.Getenv("GORUN_WATCHERS_RUNS")); err == nil && v > 0 {
		runs = v
	}
	var rows []watcherRow
	for _, r := range watcherRows() {
		if runs > 1 || r.ci || os.Getenv("GORUN_CHAOS") == "full" {
			rows = append(rows, r)
		}
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\truns\tbad runs\tsurvivors\tleft cgroups\tgone (median, max)")
	for _, r := range rows {
		t.Run(r.name(), func(t *testing.T) {
			if r.hosts && hosts == nil {
				t.Skipf("no namespace hosts: %v", hostsErr)
			}
			var res []watcherResult
			for i := range runs {
				o := runWatchers(t, r)
				res = append(res, o)
				if o.survivors > 0 || o.cgroups > 0 || o.err != "" {
					t.Errorf("run %d: %d survivors, %d job cgroups left %s", i+1, o.survivors, o.cgroups, o.err)
				}
			}
			bad, surv, cgs := 0, 0, 0
			var gone []time.Duration
			for _, o := range res {
				if o.survivors > 0 || o.cgroups > 0 || o.err != "" {
					bad++
				}
				surv += o.survivors
				cgs += o.cgroups
				gone = append(gone, o.gone)
			}
			slices.Sort(gone)
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.2fs, %.2fs\n", r.name(), runs, bad, surv, cgs,
				gone[len(gone)/2].Seconds(), gone[len(gone)-1].Seconds())
		})
	}
	tw.Flush()
	t.Logf("watchers killed together:\n%s", b.String())
	if p := os.Getenv("GORUN_WATCHERS_TABLE"); p != "" {
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// runWatchers runs one job of spawning ranks, kills the row's watchers
// once every rank recorded its spawn, and counts what is left.
func runWatchers(t *testing.T, r watcherRow) watcherResult {
	const np = 3
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-np", strconv.Itoa(np), "--grace", "2s"}
	if r.hosts {
		hf, err := hosts.WriteHostfile(t.TempDir(), 1)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--launch-agent", strings.Join(hosts.SSHArgs(), " "), "-hostfile", hf,
			"-x", spawnEnv+"="+dir, "-x", "GORACE=atexit_sleep_ms=0")
	}
	args = append([]string{gorunBin}, append(args, selfBin)...)
	env := append(os.Environ(), spawnEnv+"="+dir)
	if r.init {
		args = append([]string{selfBin}, args...)
		env = append(env, initEnv+"=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = env
	var out launchertest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	gorunPid := cmd.Process.Pid
	if r.init {
		// gorun is the stand-in's child, in a process group of its own.
		if gorunPid = initChild(cmd.Process.Pid); gorunPid == 0 {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waited
			return watcherResult{err: "the init stand-in started no gorun: " + lastLines(out.String(), 10)}
		}
	}
	defer func() {
		// Whatever happened, gorun and every recorded process go.
		_ = syscall.Kill(-gorunPid, syscall.SIGKILL)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
	}()
	var job string
	var procs []tracked
	if !launchertest.WaitFor(40*time.Second, func() bool {
		var ok bool
		job, procs, ok = readSpawned(dir, np)
		return ok
	}) {
		return watcherResult{err: "ranks never recorded their processes: " + lastLines(out.String(), 10)}
	}
	defer func() {
		for _, p := range procs {
			if p.alive() {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	}()
	targets, err := watcherPids(gorunPid, r.hosts, r.kill)
	if err != nil {
		return watcherNotFound(err, gorunPid, out.String())
	}
	stopped, err := watcherPids(gorunPid, r.hosts, r.stop)
	if err != nil {
		return watcherNotFound(err, gorunPid, out.String())
	}
	for _, p := range stopped {
		procs = append(procs, tracked{p, startTime(p)}) // the deferred cleanup kills it too
	}
	if err := stopAll(stopped); err != nil {
		return watcherResult{err: err.Error()}
	}
	t0 := time.Now()
	for _, p := range targets {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	left := func() (int, int) {
		n := 0
		for _, p := range procs {
			if p.alive() {
				n++
			}
		}
		return n, len(jobCgroups(job))
	}
	var res watcherResult
	launchertest.WaitFor(watchersBound, func() bool {
		s, c := left()
		return s == 0 && c == 0
	})
	res.gone = time.Since(t0)
	res.survivors, res.cgroups = left()
	if res.survivors > 0 || res.cgroups > 0 {
		res.err = fmt.Sprintf("(killed %v, stopped %v; cgroups %v)", targets, stopped, jobCgroups(job))
	}
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		res.err += " gorun (or the init stand-in's last child) still running 20s after the kill"
	}
	if r.hosts && res.err == "" {
		for _, h := range hosts.Hosts {
			if s, _ := hosts.StrayPids(h); len(s) > 0 && !launchertest.WaitFor(5*time.Second, func() bool {
				s, _ = hosts.StrayPids(h)
				return len(s) == 0
			}) {
				res.err += fmt.Sprintf(" host %s still runs %v", h, s)
			}
		}
	}
	return res
}

// watcherNotFound is the result of a run whose watchers were not all
// found: it says what gorun was doing (a gorun that ended the job early
// leaves no supervisor below it).
func watcherNotFound(err error, gorunPid int, out string) watcherResult {
	return watcherResult{err: fmt.Sprintf("%v (gorun pid %d state %q); gorun's output:\n%s",
		err, gorunPid, stateOf(gorunPid), lastLines(out, 10))}
}

// initChild waits for the init stand-in's child that runs gorun (not
// merely the first child listed: /proc lists pids as names, so 12000
// comes before 9000, and the stand-in, a subreaper, also adopts orphans;
// before its exec the child still runs the stand-in) and returns its pid,
// 0 if none came within 10 s.
func initChild(init int) int {
	pid := 0
	launchertest.WaitFor(10*time.Second, func() bool {
		for _, c := range childrenOf(init) {
			if args := cmdline(c); len(args) > 0 && args[0] == gorunBin {
				pid = c
			}
		}
		return pid != 0
	})
	return pid
}

// stopAll SIGSTOPs pids and waits until every one shows as stopped.
func stopAll(pids []int) error {
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGSTOP)
	}
	if !launchertest.WaitFor(5*time.Second, func() bool {
		for _, p := range pids {
			if stateOf(p) != "T" {
				return false
			}
		}
		return true
	}) {
		return fmt.Errorf("watchers %v never showed as stopped", pids)
	}
	return nil
}

// watcherPids finds the named watchers of a row (its kill or stop list;
// hosts: across the namespace hosts): gorun is gorunPid; a supervisor is
// a process whose environment marks it so, below gorun (locally) or below
// an agent; an agent is a "gorun agent" process on a namespace host.
// Every supervisor and agent found is taken (hosts rows run one rank, so
// one of each, per host).
func watcherPids(gorunPid int, onHosts bool, names []string) ([]int, error) {
	var out []int
	if len(names) == 0 {
		return nil, nil
	}
	if slices.Contains(names, "pkill") {
		// What `pkill -9 -f PATH` kills: every process whose command
		// line names gorun's binary (gorun, its supervisors, agents).
		d, err := os.ReadDir("/proc")
		if err != nil {
			return nil, err
		}
		for _, e := range d {
			if p, err := strconv.Atoi(e.Name()); err == nil && strings.Contains(strings.Join(cmdline(p), " "), gorunBin) {
				out = append(out, p)
			}
		}
		return out, nil
	}
	if slices.Contains(names, "gorun") {
		out = append(out, gorunPid)
	}
	var agents []int
	if onHosts {
		for _, h := range hosts.Hosts {
			pids, err := hosts.Pids(h)
			if err != nil {
				return nil, err
			}
			for _, p := range pids {
				if args := cmdline(p); len(args) > 1 && args[1] == "agent" && strings.HasSuffix(args[0], "gorun") {
					agents = append(agents, p)
				}
			}
		}
		if len(agents) != len(hosts.Hosts) {
			return nil, fmt.Errorf("found agents %v, want one on each of %d hosts", agents, len(hosts.Hosts))
		}
		if slices.Contains(names, "agent") {
			out = append(out, agents...)
		}
	}
	if slices.Contains(names, "supervisor") {
		parents := []int{gorunPid}
		if onHosts {
			parents = agents
		}
		n := 0
		for _, pp := range parents {
			for _, c := range childrenOf(pp) {
				if hasEnv(c, "GORUN_INTERNAL_SUPERVISOR=1") {
					out = append(out, c)
					n++
				}
			}
		}
		if n != len(parents) {
			return nil, fmt.Errorf("found %d supervisors below %v, want %d", n, parents, len(parents))
		}
	}
	return out, nil
}

func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func hasEnv(pid int, kv string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	return err == nil && slices.Contains(strings.Split(string(b), "\x00"), kv)
}

func childrenOf(pid int) []int {
	d, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range d {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(p); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}
