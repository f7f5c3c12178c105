package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// actAsGorun makes the test binary run main() with its arguments: the tests
// drive the real command line, signal handling and exit codes.
const actAsGorun = "GORUN_TEST_ACT_AS_GORUN_MAIN"

func TestMain(m *testing.M) {
	if supervisor.Is() {
		os.Exit(supervisor.Main())
	}
	if os.Getenv(actAsGorun) != "" {
		os.Unsetenv(actAsGorun)
		main()
	}
	launchertest.MaybeRunHelper()
	launchertest.FastRaceExit()
	goleak.VerifyTestMain(m)
}

// gorunCmd returns the command `gorun args...` where the rank program "RANK"
// in args is replaced by the test binary, which runs helper mode for every
// rank (perRank overrides).
func gorunCmd(t *testing.T, token, mode string, perRank map[int]string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range args {
		if a == "RANK" {
			args[i] = exe
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(launchertest.Env(token, mode, perRank), actAsGorun+"=1")
	return cmd
}

type result struct {
	code           int
	stdout, stderr string
}

func runGorun(t *testing.T, mode string, perRank map[int]string, args ...string) result {
	t.Helper()
	token := launchertest.NewToken(t.Name())
	cmd := gorunCmd(t, token, mode, perRank, args...)
	tmp := privateTmp(t, cmd)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if s := launchertest.Survivors(token); len(s) > 0 {
		t.Errorf("processes survive gorun: %v", s)
	}
	if left := leftInTmp(tmp); len(left) > 0 {
		t.Errorf("gorun left %v in its temporary directory", left)
	}
	return result{code, stdout.String(), stderr.String()}
}

// privateTmp gives cmd (and the ranks it starts) a TMPDIR of its own, so
// that what gorun leaves behind is told apart from other tests' files in
// /tmp.
func privateTmp(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	dir := t.TempDir()
	cmd.Env = append(cmd.Env, "TMPDIR="+dir)
	return dir
}

// leftInTmp lists what is in dir.
func leftInTmp(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		name    string
		mode    string
		perRank map[int]string
		args    []string
		code    int
		stdout  string // substring
		stderr  string // substring
	}{
		{name: "program flags are the program's", mode: "args", args: []string{"-np", "2", "--tag-output", "RANK", "-lr", "0.1", "--np", "9"},
			stdout: "[1] -lr 0.1 --np 9\n"},
		{name: "double dash ends flags", mode: "args", args: []string{"--np=1", "--", "RANK", "x"}, stdout: "x\n"},
		{name: "exit code passes through", mode: "exit:0", perRank: map[int]string{1: "exit:3"}, args: []string{"-np", "3", "RANK"},
			code: 3, stderr: "gorun: rank 1 (host localhost, pid "},
		{name: "signal death is 128+n", mode: "kill-self:9", args: []string{"-np", "1", "RANK"}, code: 137, stderr: "killed by signal 9 (killed)"},
		{name: "missing program", args: []string{"-np", "2", "./no-such-program"}, code: 127, stderr: "gorun: cannot run ./no-such-program: no such file\n"},
		{name: "timeout", mode: "hang", args: []string{"-np", "2", "--timeout", "200ms", "RANK"}, code: 124, stderr: "gorun: job timed out after 200ms; stopped 2 ranks\n"},
		{name: "too many ranks", args: []string{"-np", "3", "-H", "localhost:2", "RANK"}, code: 1, stderr: "3 ranks requested but only 2 slots"},
		{name: "oversubscribe", mode: "exit:0", args: []string{"-np", "3", "-H", "localhost:2", "--oversubscribe", "RANK"}},
		{name: "unreachable host", args: []string{"-H", "node[01-02]:2", "--iface", "127.0.0.0/8", "--launch-agent", "sh -c 'exit 255' {host}", "RANK"},
			code: 255, stderr: ": ssh: ssh failed (exit code 255)\n"},
		{name: "bad launcher", args: []string{"--launcher", "rsh", "RANK"}, code: 2, stderr: "expected auto, ssh or srun"},
		{name: "export", mode: "print-env", args: []string{"-np", "1", "-x", "GORUN_T_A=1", "-x", "GORUN_TEST_HELPER", "RANK"},
			stdout: "GORUN_T_A=1\n"},
		{name: "export of an unset name", args: []string{"-x", "GORUN_T_UNSET_NAME", "RANK"}, code: 2, stderr: "not set"},
		{name: "export of a per-rank variable", args: []string{"-np", "2", "-x", "RANK=5", "RANK"}, code: 2,
			stderr: "gorun: -x RANK: gorun sets RANK to the rank on every rank; it cannot be exported\n"},
		{name: "gpus per host", mode: "print-env", args: []string{"-np", "3", "--gpus-per-host", "2", "--tag-output", "RANK"},
			stdout: "[2] CUDA_VISIBLE_DEVICES=0\n"},
		{name: "exit policy flag", args: []string{"--exit-policy", "worst", "RANK"}, code: 2, stderr: "expected first, lowest or max"},
		{name: "unknown flag", args: []string{"--frobnicate", "RANK"}, code: 2, stderr: "gorun: unknown flag -frobnicate; see gorun --help\n"},
		{name: "no program", args: []string{"-np", "2"}, code: 2, stderr: "no program given"},
		{name: "version", args: []string{"--version"}, stdout: "gorun dev (commit "},
		{name: "zero ranks", args: []string{"-np", "0", "RANK"}, code: 2,
			stderr: "gorun: -np 0: the number of ranks must be at least 1 (leave -np out for one rank per slot)\n"},
		{name: "negative ranks", args: []string{"-n", "-1", "RANK"}, code: 2, stderr: "gorun: -n -1: the number of ranks must be at least 1"},
		{name: "help", args: []string{"--help"}, stderr: "Examples:"},
		{name: "doctor bad launcher", args: []string{"doctor", "-H", "n1", "--launcher", "rsh"}, code: 2, stderr: `gorun doctor: --launcher "rsh": expected auto, ssh or srun`},
		{name: "doctor bad ssh-kex", args: []string{"doctor", "-H", "n1", "--ssh-kex", "pq"}, code: 2, stderr: `gorun doctor: --ssh-kex "pq": expected fast or default`},
		{name: "bad ssh-kex", args: []string{"--ssh-kex", "pq", "-np", "1", "true"}, code: 2, stderr: `gorun: --ssh-kex "pq": expected fast or default`},
		{name: "bad pmi", args: []string{"--pmi", "pmix", "-np", "1", "true"}, code: 2, stderr: `gorun: launcher: --pmi "pmix": expected fd, port or none`},
		{name: "malformed inject", args: []string{"--inject", "kill:rank=2", "-np", "1", "true"}, code: 2,
			stderr: "gorun: --inject \"kill:rank=2\": kill needs at= or after-steps=\n"},
		{name: "inject after-steps rank out of range", args: []string{"--inject", "kill:rank=1:after-steps=5", "-np", "1", "true"}, code: 1,
			stderr: "gorun: --inject \"kill:rank=1:after-steps=5\": rank 1 does not exist (the job has ranks 0-0)\n"},
		{name: "inject file missing", args: []string{"--inject-file", "/nonexistent/faults", "-np", "1", "true"}, code: 2,
			stderr: "gorun: --inject-file: open /nonexistent/faults: no such file or directory\n"},
		{name: "inject rank out of range", args: []string{"--inject", "kill:rank=5:at=1s", "-np", "2", "true"}, code: 1,
			stderr: "gorun: --inject \"kill:rank=5:at=1s\": rank 5 does not exist (the job has ranks 0-1)\n"},
		{name: "negative max restarts", args: []string{"--max-restarts", "-1", "-np", "1", "true"}, code: 2, stderr: "must not be negative"},
		{name: "inject kill restarts", mode: "restart-aware", args: []string{"--inject", "kill:rank=0:at=100ms", "--max-restarts", "1", "-np", "2", "RANK"},
			stdout: "world 1 torch 1 job ", stderr: "#0 kill:rank=0:at=100ms (SIGKILL to ranks [0] on localhost, due 0.100s): injected at "},
		{name: "agent without gorun", args: []string{"agent"}, code: 2, stderr: "--connect and --job are required"},
		{name: "json log", mode: "exit:0", args: []string{"-vv", "--log-format", "json", "-np", "1", "RANK"}, stderr: `"message":"rank started"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runGorun(t, tc.mode, tc.perRank, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout ⊇ %q, stderr ⊇ %q",
					r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

// An executable file the kernel cannot run fails at exec time, in every
// rank: one line, exit 127, nothing counted as stopped.
func TestExecFormatError(t *testing.T) {
	bad := t.TempDir() + "/bad"
	if err := os.WriteFile(bad, []byte("\x00\x01 not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runGorun(t, "", nil, "-np", "2", bad)
	if r.code != 127 || !strings.Contains(r.stderr, "gorun: rank 0 (host localhost) could not start: ") ||
		!strings.Contains(r.stderr, "exec format error; stopped 0 other ranks") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestHostfile(t *testing.T) {
	hf := t.TempDir() + "/hosts"
	if err := os.WriteFile(hf, []byte("# two slots here\nlocalhost slots=2\n127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runGorun(t, "print-env", nil, "--hostfile", hf, "--tag-output", "RANK")
	for _, want := range []string{"[2] NODE_RANK=1\n", "[2] LOCAL_RANK=0\n", "[1] LOCAL_RANK=1\n", "[2] WORLD_SIZE=3\n"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("exit %d, stdout lacks %q; stderr %q", r.code, want, r.stderr)
		}
	}
	if err := os.WriteFile(hf, []byte("localhost slots=many\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = runGorun(t, "", nil, "-hostfile", hf, "RANK")
	if r.code != 1 || !strings.Contains(r.stderr, hf+":1:") {
		t.Fatalf("bad hostfile: exit %d, stderr %q", r.code, r.stderr)
	}
}

// startJob starts gorun in the background and waits until want processes
// of the job exist.
func startJob(t *testing.T, want int, mode string, perRank map[int]string, args ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	token := launchertest.NewToken(t.Name())
	cmd := gorunCmd(t, token, mode, perRank, args...)
	tmp := privateTmp(t, cmd)
	t.Cleanup(func() {
		// After the survivors are gone (cleanups run last first): a gorun
		// that was killed leaves its flight directory to its supervisor.
		if !launchertest.WaitFor(10*time.Second, func() bool { return len(leftInTmp(tmp)) == 0 }) {
			t.Errorf("gorun's job left %v in its temporary directory", leftInTmp(tmp))
		}
	})
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pid := range launchertest.Survivors(token) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(token)) >= want }) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("job did not start: stderr %q", stderr.String())
	}
	return cmd, token, &stderr
}

// The real command, SIGKILLed, with ranks whose children moved to their
// own sessions: nothing may survive.
func TestSIGKILLedGorunLeavesNoProcess(t *testing.T) {
	cmd, token, _ := startJob(t, 2+2*2, "setsid-grandchild", nil, "-np", "2", "RANK")
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if !launchertest.WaitFor(30*time.Second, func() bool { return len(launchertest.Survivors(token)) == 0 }) {
		t.Fatalf("processes survive: %v", launchertest.Survivors(token))
	}
}

// A real SIGINT to gorun is forwarded; gorun exits 130 and nothing of the
// job remains.
func TestSIGINTIsForwarded(t *testing.T) {
	cmd, token, stderr := startJob(t, 2+3, "hang", nil, "-np", "3", "RANK")
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 130 || !strings.Contains(stderr.String(), "gorun: received signal 2 (interrupt); stopped 3 ranks") {
		t.Fatalf("err %v, stderr %q; want exit 130 and the interrupt line", err, stderr.String())
	}
	if s := launchertest.Survivors(token); len(s) > 0 {
		t.Fatalf("processes survive: %v", s)
	}
}

func TestRankInfoExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds examples/rankinfo")
	}
	dir := launchertest.Build(t, "examples/rankinfo")
	r := runGorun(t, "", nil, "-np", "4", dir+"/rankinfo")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 4 {
		t.Fatalf("exit %d, %d lines: %q %q", r.code, len(lines), r.stdout, r.stderr)
	}
	for i := range 4 {
		if !strings.Contains(r.stdout, fmt.Sprintf("rank %d/4 ", i)) {
			t.Errorf("no line for rank %d in %q", i, r.stdout)
		}
	}
	if strings.Contains(r.stdout, os.Getenv("GORUN_SECRET")+" ") && os.Getenv("GORUN_SECRET") != "" {
		t.Errorf("secret printed")
	}
}

// A mistyped flag gets one line naming it and the closest flag, not the
// whole usage; --help lists every subcommand meant for users.
func TestUsageErrorsAreOneLine(t *testing.T) {
	tests := []struct {
		args []string
		want string // the whole of stderr
	}{
		{[]string{"--npp", "4", "true"}, "gorun: unknown flag -npp (did you mean -np?); see gorun --help\n"},
		{[]string{"-tag-ouptut", "true"}, "gorun: unknown flag -tag-ouptut (did you mean -tag-output?); see gorun --help\n"},
		{[]string{"--time=1s", "true"}, "gorun: unknown flag -time (did you mean -timeout?); see gorun --help\n"},
		{[]string{"--zzzzzz", "true"}, "gorun: unknown flag -zzzzzz; see gorun --help\n"},
		{[]string{"-np", "four", "true"}, "gorun: invalid value \"four\" for flag -np: parse error; see gorun --help\n"},
		{[]string{"doctor", "--hostfle", "h"}, "gorun doctor: unknown flag -hostfle (did you mean -hostfile?); see gorun doctor --help\n"},
		{[]string{"plan", "--pases", "x"}, "gorun plan: unknown flag -pases (did you mean -passes?); see gorun plan --help\n"},
		{[]string{"bench", "allreduce", "--bogus"}, "gorun bench: unknown flag -bogus; see gorun bench --help\n"},
		{[]string{"bench", "allreduce", "--iter", "3"}, "gorun bench: unknown flag -iter (did you mean -iters?); see gorun bench --help\n"},
		{[]string{"--session", "shard", "true"}, "gorun: --session \"shard\": expected auto, shared or own\n"},
		{[]string{"-x", "GORUN_SESSION=shard", "true"}, "gorun: -x GORUN_SESSION=shard: expected auto, shared or own\n"},
		{[]string{"-x", "GORUN_FT_FORK_SERVER=yes", "true"}, "gorun: -x GORUN_FT_FORK_SERVER=yes: expected 1 (fork Python replacements from a server) or 0\n"},
	}
	for _, tc := range tests {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, nil, &stdout, &stderr); code != exitUsage || stderr.String() != tc.want {
			t.Errorf("gorun %q: code %d, stderr %q; want %d, %q", tc.args, code, stderr.String(), exitUsage, tc.want)
		}
	}

	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: code %d", code)
	}
	for name := range subcommands {
		if name == "agent" {
			if strings.Contains(stderr.String(), "\n  agent ") {
				t.Errorf("--help lists the internal host agent subcommand")
			}
			continue
		}
		if subcommandSummaries[name] == "" {
			t.Errorf("subcommand %q has no summary for --help", name)
		}
		if !strings.Contains(stderr.String(), "\n  "+name+" ") {
			t.Errorf("--help does not list subcommand %q:\n%s", name, stderr.String())
		}
	}
}

// Rank counts this machine cannot serve are refused at once, naming the
// limit, before any rank starts or anything is allocated per rank.
func TestAbsurdRankCountsRefused(t *testing.T) {
	start := time.Now()
	r := runGorun(t, "exit:0", nil, "-np", "99999999999", "RANK")
	if r.code != exitFailure || r.stderr != "gorun: 99999999999 ranks requested; gorun runs at most 262144 ranks in one job\n" {
		t.Errorf("-np 99999999999: code %d, stderr %q", r.code, r.stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("refusal took %v", d)
	}
	r = runGorun(t, "exit:0", nil, "-H", "localhost:2000000000", "RANK")
	if r.code == 0 || !strings.Contains(r.stderr, "slots is too large") {
		t.Errorf("slots=2000000000: code %d, stderr %q", r.code, r.stderr)
	}

	// Under a low descriptor limit, a count that would run out of
	// descriptors part-way is refused naming the limit.
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("no prlimit (util-linux) to lower the descriptor limit")
	}
	token := launchertest.NewToken(t.Name())
	cmd := gorunCmd(t, token, "exit:0", nil, "-np", "100", "RANK")
	cmd.Args = append([]string{prlimit, "--nofile=256:256", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = prlimit
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	want := "gorun: 100 ranks on this machine need about 464 open files, but the limit is 256 (ulimit -n, hard limit 256; 4 per rank in gorun's supervisor); run fewer ranks or raise the limit\n"
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFailure || stderr.String() != want {
		t.Errorf("-np 100 under ulimit -n 256: %v, stderr %q; want exit %d and %q", err, stderr.String(), exitFailure, want)
	}
	if s := launchertest.Survivors(token); len(s) > 0 {
		t.Errorf("processes survive gorun: %v", s)
	}
}

// A write error on a per-rank log (here rank 0's log is /dev/full, which
// fails every write with ENOSPC) is reported once, naming the file and the
// error, and the exit status says that output was lost although every
// rank exited 0; the other rank's log is whole.
func TestOutputDirWriteErrorIsReported(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/full", dir+"/rank.0.log"); err != nil {
		t.Fatal(err)
	}
	r := runGorun(t, "flood:50", nil, "-np", "2", "--output-dir", dir, "RANK")
	file := dir + "/rank.0.log"
	if r.code != 74 {
		t.Errorf("exit code %d, want 74 (output lost); stderr:\n%s", r.code, r.stderr)
	}
	report := "gorun: writing " + file + ": write " + file + ": no space left on device; the rest of that rank's log is lost\n"
	if n := strings.Count(r.stderr, report); n != 1 {
		t.Errorf("the write error is reported %d times, want once as %q; stderr:\n%s", n, report, r.stderr)
	}
	if !strings.HasSuffix(r.stderr, "gorun: output lost: writing "+file+": write "+file+": no space left on device\n") {
		t.Errorf("final line does not say output was lost; stderr:\n%s", r.stderr)
	}
	b, err := os.ReadFile(dir + "/rank.1.log")
	if err != nil || strings.Count(string(b), "\n") != 50 {
		t.Errorf("rank 1's log: %d lines, %v; want 50", strings.Count(string(b), "\n"), err)
	}
}

// A hostfile line that expands to a million hosts is refused at once
// (its slots exceed what one job may have), not resolved name by name.
func TestMillionHostHostfileRefused(t *testing.T) {
	hf := t.TempDir() + "/hosts"
	if err := os.WriteFile(hf, []byte("n[01-1000000]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := runGorun(t, "exit:0", nil, "-hostfile", hf, "RANK")
	if r.code != exitFailure || r.stderr != "gorun: the hosts' slots make more than 262144 ranks, gorun's limit for one job; give -np\n" {
		t.Errorf("code %d, stderr %q", r.code, r.stderr)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Errorf("refusal took %v", d)
	}
}

// --version names the commit: the one make build passes at link time, else
// the one Go stamped into the build.
func TestDescribeVersion(t *testing.T) {
	stamped := []debug.BuildSetting{{Key: "vcs.revision", Value: "573a5c1d2e4f0123456789abcdef0123456789ab"}, {Key: "vcs.modified", Value: "true"}}
	for _, c := range []struct {
		commit   string
		settings []debug.BuildSetting
		want     string
	}{
		{"", nil, "dev (commit unknown: built without make build or VCS stamping)"},
		{"", stamped[:1], "dev (commit 573a5c1d2e4f)"},
		{"", stamped, "dev (commit 573a5c1d2e4f, modified)"},
		{"0123456789ab-modified", stamped, "dev (commit 0123456789ab-modified)"},
	} {
		if got := describeVersion("dev", c.commit, c.settings); got != c.want {
			t.Errorf("describeVersion(dev, %q, %v) = %q, want %q", c.commit, c.settings, got, c.want)
		}
	}
}

// gorun doctor without hosts checks this host, as a job without -H runs
// here. It needs the real binary: the host agent is gorun re-executed.
func TestDoctorWithoutHostsChecksThisHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/gorun")
	}
	dir := launchertest.Build(t, "cmd/gorun")
	cmd := exec.Command(dir+"/gorun", "doctor")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\nlocalhost ") || !strings.Contains(string(out), "all 1 host ready") {
		t.Fatalf("gorun doctor: %v\n%s", err, out)
	}
}
