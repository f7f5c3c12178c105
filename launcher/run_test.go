package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/program"
)

// syncBuffer is shared with the other process tests.
type syncBuffer = launchertest.SyncBuffer

// testLogger writes through t.Log.
func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.ConsoleWriter{Out: zerolog.TestWriter{T: t}, NoColor: true}).Level(zerolog.DebugLevel)
}

// jobRun is one in-process launch of the test binary as rank program.
type jobRun struct {
	t      *testing.T
	token  string
	cfg    Config
	job    Job
	stdout *syncBuffer
	stderr *syncBuffer
}

func newJobRun(t *testing.T, np int, mode string, perRank map[int]string) *jobRun {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	j := &jobRun{t: t, token: launchertest.NewToken(t.Name()), stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	j.cfg = DefaultConfig()
	j.cfg.Logger = testLogger(t)
	j.cfg.Stdout, j.cfg.Stderr = j.stdout, j.stderr
	j.cfg.TagOutput = true
	j.cfg.Grace = 5 * time.Second
	j.cfg.Env = launchertest.Env(j.token, mode, perRank)
	j.job = Job{Argv: []string{exe}, NP: np}
	return j
}

// launch runs the job and checks that nothing of it survives.
func (j *jobRun) launch(ctx context.Context) error {
	err := Launch(ctx, j.cfg, j.job)
	if s := launchertest.Survivors(j.token); len(s) > 0 {
		j.t.Errorf("processes of the job survive Launch: %v", s)
	}
	return err
}

// readyCount counts the "ready" lines the helpers printed.
func (j *jobRun) readyCount() int { return strings.Count(j.stdout.String(), "] ready ") }

// rankEnvs parses tagged print-env output into one map per rank.
func rankEnvs(t *testing.T, out string, np int) []map[string]string {
	t.Helper()
	envs := make([]map[string]string, np)
	for i := range envs {
		envs[i] = map[string]string{}
	}
	re := regexp.MustCompile(`^\[(\d+)\] ([^=]+)=(.*)$`)
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		r, _ := strconv.Atoi(m[1])
		envs[r][m[2]] = m[3]
	}
	return envs
}

func TestRunEnvironment(t *testing.T) {
	j := newJobRun(t, 3, "print-env", nil)
	j.job.Export = []string{"GORUN_TEST_FOO=bar"}
	// Variables inherited from gorun's environment (say, gorun started
	// inside another launcher's rank) must not shadow the plan's.
	j.cfg.Env = append(j.cfg.Env, "RANK=99", "WORLD_SIZE=99")
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	envs := rankEnvs(t, j.stdout.String(), 3)
	hex64 := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for r, env := range envs {
		for k, v := range map[string]string{
			"RANK": strconv.Itoa(r), "WORLD_SIZE": "3", "LOCAL_RANK": strconv.Itoa(r),
			"LOCAL_WORLD_SIZE": "3", "NODE_RANK": "0", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
			"PMI_RANK": strconv.Itoa(r), "PMI_SIZE": "3", "PMI_FD": "3", "GORUN_RANK": strconv.Itoa(r),
			"GORUN_WORLD_SIZE": "3", "GORUN_LOCAL_RANK": strconv.Itoa(r), "GORUN_TEST_FOO": "bar",
		} {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
		// Variables that would claim protocols gorun does not serve
		// (Open MPI's launch, the PMI_PORT mode when PMI_FD is served).
		for _, k := range []string{"CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_PORT", "PMI_ID"} {
			if _, ok := env[k]; ok {
				t.Errorf("rank %d: %s set", r, k)
			}
		}
		if !hex64.MatchString(env["GORUN_SECRET"]) {
			t.Errorf("rank %d: GORUN_SECRET %q is not 64 hex digits", r, env["GORUN_SECRET"])
		}
		for _, k := range []string{"MASTER_PORT", "GORUN_RDZV_ENDPOINT", "GORUN_JOB_ID", "GORUN_SECRET"} {
			if env[k] == "" || env[k] != envs[0][k] {
				t.Errorf("rank %d: %s=%q differs from rank 0's %q", r, k, env[k], envs[0][k])
			}
		}
	}
	if "127.0.0.1:"+envs[0]["MASTER_PORT"] == envs[0]["GORUN_RDZV_ENDPOINT"] {
		t.Errorf("MASTER_PORT and the rendezvous endpoint share a port")
	}
}

// Ranks start with default signal dispositions: nothing gorun or the agent
// does with signals (the agent must survive EPIPE) may leak into them.
func TestRunRanksStartWithDefaultSignals(t *testing.T) {
	// Not the Go test binary: the Go runtime replaces an inherited SIG_IGN
	// for SIGPIPE with its own handler and would hide a leak.
	j := newJobRun(t, 1, "", nil)
	j.job.Argv = []string{"/bin/sh", "-c", "exec grep SigIgn: /proc/self/status | tr -s ' \t' ' '"}
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(j.stdout.String())
	hex, ok := strings.CutPrefix(got, "[0] SigIgn: ")
	if !ok {
		t.Fatalf("rank printed %q, want its SigIgn line", got)
	}
	mask, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		t.Fatalf("rank's SigIgn %q: %v", hex, err)
	}
	// Bit n-1 stands for signal n. Only the standard signals 1–31 are
	// checked: 32 and 33 are reserved by glibc's thread library, and the
	// race-enabled agent (linked with libc) was once seen, under heavy load,
	// to hand signal 32 ignored to a child. No program observes them.
	if std := mask & (1<<31 - 1); std != 0 {
		t.Fatalf("rank's ignored standard signals: %#x (SigIgn %s), want none", std, hex)
	}
}

// A rank has exactly stdin, stdout and stderr open, plus its PMI socket at
// 3 when PMI is served, plus the collateral pipe (rankenv.CollateralFD)
// after them: no other rank's pipes or sockets, nothing gorun inherited.
func TestRunRanksInheritOnlyStdio(t *testing.T) {
	for _, tc := range []struct {
		pmi  PMIMode
		want string // ls itself opens the next descriptor to read the directory
	}{{PMINone, "0 1 2 3 4 "}, {PMIFD, "0 1 2 3 4 5 "}, {PMIPort, "0 1 2 3 4 "}} {
		t.Run(string(tc.pmi), func(t *testing.T) {
			j := newJobRun(t, 3, "", nil)
			j.cfg.PMI = tc.pmi
			j.job.Argv = []string{"/bin/sh", "-c", "exec ls /proc/self/fd | tr '\\n' ' '"}
			if err := j.launch(context.Background()); err != nil {
				t.Fatal(err)
			}
			for r := range 3 {
				if want := fmt.Sprintf("[%d] %s\n", r, tc.want); !strings.Contains(j.stdout.String(), want) {
					t.Fatalf("rank %d's descriptors: %q, want %q", r, j.stdout.String(), want)
				}
			}
		})
	}
}

// Two jobs planned at the same time must get four distinct ports.
func TestRunConcurrentJobsGetDistinctPorts(t *testing.T) {
	var wg sync.WaitGroup
	jobs := []*jobRun{newJobRun(t, 1, "print-env", nil), newJobRun(t, 1, "print-env", nil)}
	errs := make([]error, len(jobs))
	for i, j := range jobs {
		wg.Go(func() { errs[i] = j.launch(context.Background()) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, j := range jobs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		env := rankEnvs(t, j.stdout.String(), 1)[0]
		_, rdzv, _ := strings.Cut(env["GORUN_RDZV_ENDPOINT"], ":")
		for _, p := range []string{env["MASTER_PORT"], rdzv} {
			if p == "" || seen[p] {
				t.Fatalf("port %q given twice (or empty) across two concurrent jobs", p)
			}
			seen[p] = true
		}
	}
}

func TestRunStdinGoesToRankZeroOnly(t *testing.T) {
	j := newJobRun(t, 3, "cat", nil)
	j.cfg.Stdin = strings.NewReader("hello\nworld\n")
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := j.stdout.String(), "[0] hello\n[0] world\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

// Megabytes from several ranks at once: every line whole, in order per
// rank, nothing lost, no deadlock.
func TestRunOutputFloodKeepsLinesWhole(t *testing.T) {
	const np, lines = 3, 20000 // about 2.3 MB per rank
	j := newJobRun(t, np, fmt.Sprintf("flood:%d", lines), nil)
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := make([]int, np)
	pad := strings.Repeat("x", 100)
	// A plain parse rather than a regexp: 60000 lines under -race.
	for _, line := range strings.Split(strings.TrimSuffix(j.stdout.String(), "\n"), "\n") {
		head, rest, ok := strings.Cut(line, " l")
		idx, tail, ok2 := strings.Cut(rest, " ")
		r, err1 := strconv.Atoi(strings.TrimPrefix(head[strings.IndexByte(head, ' ')+1:], "r"))
		i, err2 := strconv.Atoi(idx)
		if !ok || !ok2 || err1 != nil || err2 != nil || r < 0 || r >= np || head != fmt.Sprintf("[%d] r%d", r, r) || tail != pad {
			t.Fatalf("mangled line %q", line)
		}
		if i != next[r] {
			t.Fatalf("rank %d: line %d after line %d", r, i, next[r]-1)
		}
		next[r]++
	}
	for r, n := range next {
		if n != lines {
			t.Errorf("rank %d: %d lines, want %d", r, n, lines)
		}
	}
}

func TestRunPrintsFinalPartialLine(t *testing.T) {
	j := newJobRun(t, 2, "partial", nil)
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := j.stdout.String()
	for r := range 2 {
		if !strings.Contains(out, fmt.Sprintf("[%d] partial-line\n", r)) {
			t.Errorf("rank %d's unterminated line missing from %q", r, out)
		}
	}
}

func TestRunOutputDirAndTimestamps(t *testing.T) {
	dir := t.TempDir()
	j := newJobRun(t, 2, "flood:3", nil)
	j.cfg.TagOutput = false // output-dir alone tags the terminal copy
	j.cfg.OutputDir = filepath.Join(dir, "logs")
	j.cfg.TimestampOutput = true
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts := `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z `
	term := regexp.MustCompile(`^\[(\d)\] ` + ts + `r(\d) l\d x+$`)
	lines := strings.Split(strings.TrimSuffix(j.stdout.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("terminal got %d lines, want 6: %q", len(lines), lines)
	}
	for _, l := range lines {
		if m := term.FindStringSubmatch(l); m == nil || m[1] != m[2] {
			t.Errorf("terminal line %q not tagged and timestamped", l)
		}
	}
	file := regexp.MustCompile(`^` + ts + `r(\d) l(\d) x+$`)
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, "logs", fmt.Sprintf("rank.%d.log", r)))
		if err != nil {
			t.Fatal(err)
		}
		fl := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(fl) != 3 {
			t.Fatalf("rank.%d.log has %d lines, want 3: %q", r, len(fl), b)
		}
		for i, l := range fl {
			if m := file.FindStringSubmatch(l); m == nil || m[1] != strconv.Itoa(r) || m[2] != strconv.Itoa(i) {
				t.Errorf("rank.%d.log line %q", r, l)
			}
		}
	}
}

func TestRunFirstFailureStopsTheOthers(t *testing.T) {
	j := newJobRun(t, 4, "hang", map[int]string{2: "exit:3"})
	err := j.launch(context.Background())
	var re *outcome.RankExitError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want *outcome.RankExitError", err)
	}
	if re.Rank != 2 || re.Code != 3 || re.Signal != 0 || re.Host != "localhost" || re.PID <= 0 || re.ExitCode() != 3 || re.Stopped != 3 {
		t.Fatalf("got %+v", re)
	}
	want := fmt.Sprintf("rank 2 (host localhost, pid %d) exited with code 3; stopped 3 other ranks", re.PID)
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

func TestRunSignalDeathExitCode(t *testing.T) {
	j := newJobRun(t, 2, "hang", map[int]string{1: "kill-self:9"})
	err := j.launch(context.Background())
	var re *outcome.RankExitError
	if !errors.As(err, &re) || re.Rank != 1 || re.Signal != syscall.SIGKILL || re.ExitCode() != 137 {
		t.Fatalf("err = %#v, want rank 1 killed by SIGKILL, exit code 137", err)
	}
	if !strings.Contains(err.Error(), "killed by signal 9 (killed); stopped 1 other rank") {
		t.Fatalf("message %q", err)
	}
}

// A rank that ignores SIGTERM is SIGKILLed after the grace period.
func TestRunGraceThenSIGKILL(t *testing.T) {
	j := newJobRun(t, 3, "ignore-sigterm", map[int]string{0: "exit:1"})
	j.cfg.Grace = 200 * time.Millisecond
	err := j.launch(context.Background())
	var re *outcome.RankExitError
	if !errors.As(err, &re) || re.Rank != 0 || re.Code != 1 || re.Stopped != 2 {
		t.Fatalf("err = %v, want rank 0 code 1 with 2 stopped", err)
	}
}

func TestRunTimeout(t *testing.T) {
	j := newJobRun(t, 2, "hang", nil)
	j.cfg.Timeout = 300 * time.Millisecond
	err := j.launch(context.Background())
	var te *outcome.TimeoutError
	if !errors.As(err, &te) || te.ExitCode() != 124 || te.Stopped != 2 {
		t.Fatalf("err = %v, want a timeout with 2 ranks stopped and exit code 124", err)
	}
}

func TestRunForwardsSIGTERM(t *testing.T) {
	j := newJobRun(t, 2, "hang", nil)
	sigs := make(chan os.Signal, 1)
	j.cfg.Signals = sigs
	errc := make(chan error, 1)
	go func() { errc <- j.launch(context.Background()) }()
	if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 2 }) {
		t.Fatalf("ranks not ready: %q", j.stdout.String())
	}
	sigs <- syscall.SIGTERM
	err := <-errc
	var ie *outcome.InterruptedError
	if !errors.As(err, &ie) || ie.Signal != syscall.SIGTERM || ie.Stopped != 2 || ie.ExitCode() != 143 {
		t.Fatalf("err = %v, want interrupted by SIGTERM, 2 stopped", err)
	}
}

// Ranks that ignore SIGINT, a grace period longer than any test: only the
// second SIGINT's escalation to SIGKILL can end this job.
func TestRunSecondSIGINTKills(t *testing.T) {
	j := newJobRun(t, 2, "ignore-sigterm", nil)
	j.cfg.Grace = time.Hour
	sigs := make(chan os.Signal, 2)
	j.cfg.Signals = sigs
	errc := make(chan error, 1)
	go func() { errc <- j.launch(context.Background()) }()
	if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 2 }) {
		t.Fatalf("ranks not ready: %q", j.stdout.String())
	}
	sigs <- syscall.SIGINT
	sigs <- syscall.SIGINT
	err := <-errc
	var ie *outcome.InterruptedError
	if !errors.As(err, &ie) || ie.Signal != syscall.SIGINT || ie.ExitCode() != 130 {
		t.Fatalf("err = %v, want interrupted by SIGINT", err)
	}
}

// Signals other than INT/TERM/HUP (SLURM's pre-timeout SIGUSR1) reach the
// ranks and the job goes on.
func TestRunForwardsSIGUSR1(t *testing.T) {
	j := newJobRun(t, 2, "wait-usr1", nil)
	sigs := make(chan os.Signal, 1)
	j.cfg.Signals = sigs
	errc := make(chan error, 1)
	go func() { errc <- j.launch(context.Background()) }()
	if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 2 }) {
		t.Fatalf("ranks not ready: %q", j.stdout.String())
	}
	sigs <- syscall.SIGUSR1
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(j.stdout.String(), "] usr1\n"); n != 2 {
		t.Fatalf("%d ranks saw SIGUSR1, want 2: %q", n, j.stdout.String())
	}
}

// If the agent itself is killed, its ranks die with it (Pdeathsig), gorun
// says so and stops what is left of the ranks' process groups.
func TestRunAgentDeath(t *testing.T) {
	j := newJobRun(t, 2, "spawn-grandchild", nil)
	errc := make(chan error, 1)
	// Not j.launch: without the agent nobody can wait for the killed
	// processes, so they may still be dying when Launch returns.
	go func() { errc <- Launch(context.Background(), j.cfg, j.job) }()
	if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 2 }) {
		t.Fatalf("ranks not ready: %q", j.stdout.String())
	}
	agents := agentsOf(t, j.token)
	if len(agents) != 1 {
		t.Fatalf("found %d agents, want 1", len(agents))
	}
	syscall.Kill(agents[0], syscall.SIGKILL)
	err := <-errc
	var ae *outcome.SupervisorError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want *outcome.SupervisorError", err)
	}
	if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(j.token)) == 0 }) {
		t.Fatalf("processes survive the agent's death: %v", launchertest.Survivors(j.token))
	}
}

// agentsOf finds the agent that runs token's ranks: the parent of a rank.
func agentsOf(t *testing.T, token string) []int {
	seen := map[int]bool{}
	var out []int
	for _, pid := range launchertest.Survivors(token) {
		pp := ppidOf(t, pid)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pp))
		// The supervisor's marker (package supervisor's supervisorEnv).
		if err == nil && strings.Contains(string(b), "GORUN_INTERNAL_SUPERVISOR=") && !seen[pp] {
			seen[pp] = true
			out = append(out, pp)
		}
	}
	return out
}

// ppidOf is pid's parent, from /proc/PID/stat (0 once pid is gone).
func ppidOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func TestRunContextCancel(t *testing.T) {
	j := newJobRun(t, 2, "hang", nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- j.launch(ctx) }()
	if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 2 }) {
		t.Fatalf("ranks not ready: %q", j.stdout.String())
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestRunBadProgramFailsBeforeStart(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, prog := range []string{filepath.Join(dir, "missing"), notExec, dir, "gorun-no-such-command"} {
		j := newJobRun(t, 2, "hang", nil)
		j.job.Argv = []string{prog}
		err := j.launch(context.Background())
		var pe *program.Error
		if !errors.As(err, &pe) || pe.ExitCode() != 127 {
			t.Errorf("%s: err = %v, want *program.Error with exit code 127", prog, err)
		}
	}
}

// A rank that leaves a setsid'd daemon behind and exits 0: the job still
// ends, and the daemon with it.
func TestRunStopsStraysOfSuccessfulRanks(t *testing.T) {
	j := newJobRun(t, 2, "exit:0", map[int]string{0: "setsid-orphan"})
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j.stdout.String(), "child") {
		t.Fatalf("the helper did not start its child: %q", j.stdout.String())
	}
}

// An agent binary that forgot the supervisor.Is hook must not launch again.
func TestRunRefusesToRecurseInAnAgent(t *testing.T) {
	t.Setenv("GORUN_INTERNAL_SUPERVISOR", "1") // what supervisor.Is looks for
	j := newJobRun(t, 1, "exit:0", nil)
	if err := j.launch(context.Background()); !errors.Is(err, ErrSupervisorNotDispatched) {
		t.Fatalf("err = %v, want ErrSupervisorNotDispatched", err)
	}
}

// A host whose agent cannot be started fails the launch with an error
// naming the host, before any rank starts. The agent launcher here
// pretends to be an ssh that cannot connect, so no network is involved.
func TestRunUnreachableHostIsNamed(t *testing.T) {
	j := newJobRun(t, 1, "exit:0", nil)
	j.job.Hosts = []Host{{Name: "gorun-test-remote-host", Slots: 1}}
	j.cfg.Iface = "127.0.0.0/8" // no name lookup of the made-up host
	j.cfg.StarterCommand = []string{"sh", "-c", `echo "ssh: connect to host $0 port 22: Connection refused" >&2; exit 255`, "{host}"}
	var he *outcome.HostError
	err := j.launch(context.Background())
	if !errors.As(err, &he) || he.Host != "gorun-test-remote-host" || he.ExitCode() != 255 ||
		!strings.Contains(err.Error(), "host gorun-test-remote-host: ssh: connect to host gorun-test-remote-host port 22: Connection refused") {
		t.Fatalf("err = %v, want a *outcome.HostError naming the host and the ssh failure", err)
	}
}

// helperGorunEnv makes the test binary act as gorun (see TestMain): it
// carries a JSON helperGorunSpec.
const helperGorunEnv = "GORUN_TEST_ACT_AS_GORUN"

type helperGorunSpec struct {
	NP    int
	Grace time.Duration
}

func helperGorun() int {
	var s helperGorunSpec
	if err := json.Unmarshal([]byte(os.Getenv(helperGorunEnv)), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	exe, _ := os.Executable()
	cfg := DefaultConfig()
	cfg.Grace = s.Grace
	cfg.TagOutput = true
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, helperGorunEnv+"=") {
			env = append(env, kv)
		}
	}
	cfg.Env = env
	if err := Launch(context.Background(), cfg, Job{Argv: []string{exe}, NP: s.NP}); err != nil {
		fmt.Fprintln(os.Stderr, "gorun:", err)
		return 1
	}
	return 0
}

// SIGKILL gorun itself, then look in /proc for anything of the job: ranks,
// their children, children that moved to their own session, and the agent.
func TestGorunSIGKILLLeavesNoOrphans(t *testing.T) {
	tests := []struct {
		name    string
		np      int
		mode    string
		perRank map[int]string
		// procs is how many processes carry the token once everything
		// started: gorun, the agent, ranks and grandchildren.
		procs int
	}{
		{"ranks", 3, "hang", nil, 2 + 3},
		{"grandchildren", 2, "spawn-grandchild", nil, 2 + 2 + 2},
		{"setsid grandchildren", 2, "setsid-grandchild", nil, 2 + 2 + 2},
		{"setsid orphan of an exited rank", 3, "hang", map[int]string{0: "setsid-orphan"}, 2 + 2 + 1},
		{"rank ignoring SIGTERM", 2, "ignore-sigterm", nil, 2 + 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			token := launchertest.NewToken(t.Name())
			spec, _ := json.Marshal(helperGorunSpec{NP: tc.np, Grace: time.Hour})
			exe, _ := os.Executable()
			cmd := exec.Command(exe)
			cmd.Env = append(launchertest.Env(token, tc.mode, tc.perRank), helperGorunEnv+"="+string(spec))
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, pid := range launchertest.Survivors(token) {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}()
			if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(token)) >= tc.procs }) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("job did not start: %d processes, want %d; stderr %q", len(launchertest.Survivors(token)), tc.procs, stderr.String())
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(token)) == 0 }) {
				t.Fatalf("processes survive gorun's SIGKILL: %v", launchertest.Survivors(token))
			}
		})
	}
}

// Every rank leads its own session (and so its own process group): the
// teardown signals the group, and the kernel's autogroup scheduler gives
// each session its own CPU share, as Hydra's ranks get (supervisor/bind.go).
// Oversubscribed ranks of a program on gorun's runtime (this test binary)
// lead their own process groups in one session, where sched_yield can hand
// a core from one to another; other programs (a shell here, MPICH ranks in
// practice) keep their own sessions (supervisor/bind.go), unless GORUN_SESSION
// says otherwise.
func TestRunRanksOwnSession(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Skip(err)
	}
	ncpu := set.Count()
	for _, tc := range []struct {
		name       string
		np         int
		export     []string
		ownSession bool
		shell      bool // the rank is /bin/sh, not a program on gorun's runtime
	}{
		{"one CPU each", min(2, ncpu), nil, true, false},
		{"oversubscribed", ncpu + 1, nil, false, false},
		{"oversubscribed, not on gorun's runtime", ncpu + 1, nil, true, true},
		{"oversubscribed, --bind-to none", ncpu + 1, []string{"GORUN_BIND=none"}, true, false},
		{"oversubscribed, not on gorun's runtime, --session shared", ncpu + 1, []string{"GORUN_SESSION=shared"}, false, true},
		{"oversubscribed, --session own", ncpu + 1, []string{"GORUN_SESSION=own"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJobRun(t, tc.np, "stat", nil)
			if tc.shell {
				j.job.Argv = []string{"/bin/sh", "-c", "exec cat /proc/self/stat"}
			}
			j.job.Export = tc.export
			j.job.Oversubscribe = tc.np > ncpu
			if err := j.launch(context.Background()); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(j.stdout.String()), "\n")
			if len(lines) != tc.np {
				t.Fatalf("want %d stat lines, got %q", tc.np, j.stdout.String())
			}
			sessions := map[string]bool{}
			for _, l := range lines {
				_, stat, _ := strings.Cut(l, "] ")
				pid, rest, _ := strings.Cut(stat, " (")
				_, after, _ := strings.Cut(rest, ") ")
				f := strings.Fields(after) // state ppid pgrp session ...
				if len(f) < 4 || f[2] != pid || (f[3] == pid) != tc.ownSession {
					t.Errorf("rank %q: pid %s, pgrp and session %v; want the pid as pgrp, and as session: %v", l, pid, f[2:4], tc.ownSession)
				}
				sessions[f[3]] = true
			}
			if !tc.ownSession && len(sessions) != 1 {
				t.Errorf("oversubscribed ranks in sessions %v, want one", sessions)
			}
		})
	}
}
