package multihost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// 4 hosts × 2 ranks: every rank runs on the host the plan says, its lines
// are tagged [rank,host], MASTER_ADDR is rank 0's host's address on the
// interface the hosts share, and the socket interface variables name that
// interface. gorun's own side listens on the bridge, the interface that
// routes to the hosts.
func TestFourHostsTwoRanksEach(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "print-env", nil, "--tag-output", "-v")
	if code := j.run(); code != 0 {
		t.Fatalf("gorun exited %d\nstderr:\n%s", code, j.stderr.String())
	}
	envs := map[int]map[string]string{}
	for _, line := range strings.Split(j.stdout.String(), "\n") {
		if line == "" {
			continue
		}
		tag, kv, ok := strings.Cut(line, "] ")
		rankStr, host, ok2 := strings.Cut(strings.TrimPrefix(tag, "["), ",")
		rank, err := strconv.Atoi(rankStr)
		if !ok || !ok2 || err != nil {
			t.Fatalf("untagged line %q", line)
		}
		if want := h.Hosts[rank/2]; host != want {
			t.Errorf("rank %d tagged with host %q, want %q", rank, host, want)
		}
		if envs[rank] == nil {
			envs[rank] = map[string]string{}
		}
		k, v, _ := strings.Cut(kv, "=")
		envs[rank][k] = v
	}
	if len(envs) != 8 {
		t.Fatalf("output from %d ranks, want 8\nstderr:\n%s", len(envs), j.stderr.String())
	}
	for rank, env := range envs {
		host := h.Hosts[rank/2]
		want := map[string]string{
			"RANK": strconv.Itoa(rank), "WORLD_SIZE": "8", "LOCAL_RANK": strconv.Itoa(rank % 2),
			"NODE_RANK": strconv.Itoa(rank / 2), "GORUN_HOST": host,
			"MASTER_ADDR": h.Addrs[0], "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", rank, k, env[k], v)
			}
		}
		if !strings.HasPrefix(env["GORUN_RDZV_ENDPOINT"], h.Addrs[0]+":") {
			t.Errorf("rank %d: GORUN_RDZV_ENDPOINT=%q, want on %s", rank, env["GORUN_RDZV_ENDPOINT"], h.Addrs[0])
		}
		if env["HOSTNAME"] != "" && env["HOSTNAME"] != host {
			t.Errorf("rank %d ran on %q, want %q", rank, env["HOSTNAME"], host)
		}
	}
	if s := j.stderr.String(); !strings.Contains(s, "iface="+h.Bridge) {
		t.Errorf("-v output does not show gorun listening on the bridge %s:\n%s", h.Bridge, s)
	}
	j.noSurvivors()
}

// A rank's exit code is gorun's, and the message names rank and host.
func TestExitCodeNamesRankAndHost(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "hang", map[int]string{5: "exit:7"})
	code := j.run()
	want := fmt.Sprintf("gorun: rank 5 (host %s, pid ", h.Hosts[2])
	if code != 7 || !strings.Contains(j.stderr.String(), want) || !strings.Contains(j.stderr.String(), "stopped 7 other ranks") {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 7 and %q", code, j.stderr.String(), want)
	}
	j.noSurvivors()
}

// A program missing on the hosts is reported before any rank starts,
// naming a host, with a shell's 127.
func TestMissingProgramNamesHost(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 1, "exit:0", nil)
	j.cmd.Args[len(j.cmd.Args)-1] = "/nonexistent/trainer"
	code := j.run()
	if code != 127 || !strings.Contains(j.stderr.String(), "cannot run /nonexistent/trainer: no such file") ||
		!strings.Contains(j.stderr.String(), "gorun: host "+h.Set+"-h") {
		t.Errorf("exit %d, stderr:\n%s", code, j.stderr.String())
	}
	j.noSurvivors()
}

// A remote gorun without agent mode (an older release) is a version error
// naming the host, not a hang.
func TestOldRemoteGorunIsAVersionError(t *testing.T) {
	h := requireHosts(t)
	old := t.TempDir() + "/old-gorun"
	script := "#!/bin/sh\necho 'gorun: subcommand \"agent\" is not available yet' >&2\nexit 2\n"
	if err := os.WriteFile(old, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	j := newJob(t, h, 1, "exit:0", nil)
	j.cmd.Args = append(j.cmd.Args[:1], append([]string{"--agent-path", old}, j.cmd.Args[1:]...)...)
	code := j.run()
	if code == 0 || !strings.Contains(j.stderr.String(), "runs gorun without agent mode") || !strings.Contains(j.stderr.String(), "host "+h.Set+"-h") {
		t.Errorf("exit %d, stderr:\n%s", code, j.stderr.String())
	}
	j.noSurvivors()
}

// A host that does not answer ssh fails the launch, naming the host. The
// other hosts' ranks may have started meanwhile (each host's ranks start
// as soon as it is up); they are stopped, and nothing survives.
func TestUnreachableHostIsNamed(t *testing.T) {
	h := requireHosts(t)
	down := h.Hosts[3]
	if err := h.CutLink(down); err != nil {
		t.Fatal(err)
	}
	defer restore(t, down)
	j := newJob(t, h, 1, "hang", nil)
	code := j.run()
	if code != 255 || !strings.Contains(j.stderr.String(), "gorun: host "+down+": ssh: ") {
		t.Errorf("exit %d, stderr:\n%s\nwant 255 and an ssh error naming %s", code, j.stderr.String(), down)
	}
	if s := launchertest.Survivors(j.token); len(s) > 0 {
		t.Errorf("ranks %v outlived gorun", s)
	}
	j.noSurvivors()
}

// Each host's ranks start as soon as that host is up, and a host that
// fails after them ends the launch naming it, with the started ranks
// stopped before gorun returns. The last host's launcher is held until the
// other hosts' ranks said ready — which they can only do if they started
// before every host was up — and then fails.
func TestLaterHostFailureStopsStartedRanks(t *testing.T) {
	h := requireHosts(t)
	victim := h.Hosts[len(h.Hosts)-1]
	dir := t.TempDir()
	flag := filepath.Join(dir, "others-ready")
	wrap := filepath.Join(dir, "launch")
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
  if [ "$a" = %q ]; then
    while [ ! -e %q ]; do sleep 0.05; done
    echo "test launcher: refusing %s on purpose" >&2
    exit 255
  fi
done
exec %s "$@"
`, victim, flag, victim, strings.Join(h.SSHArgs(), " "))
	if err := os.WriteFile(wrap, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	j := newJob(t, h, 2, "note-sigterm", nil)
	for i, a := range j.cmd.Args {
		if a == "--launch-agent" {
			j.cmd.Args[i+1] = wrap
		}
	}
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := 2 * (len(h.Hosts) - 1)
	waitReady(t, j, started)
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code := j.wait()
	if code != 255 || !strings.Contains(j.stderr.String(), "gorun: host "+victim+": ") ||
		!strings.Contains(j.stderr.String(), "refusing "+victim+" on purpose") {
		t.Errorf("exit %d, stderr:\n%s\nwant 255 and an error naming %s with its launcher's words", code, j.stderr.String(), victim)
	}
	// Stopped by the job's teardown (SIGTERM, their last words delivered
	// before their host counted as done), not killed by agents that lost
	// gorun.
	if n := strings.Count(j.stdout.String(), "sigterm "); n != started {
		t.Errorf("%d ranks reported SIGTERM, want %d\nstdout:\n%s", n, started, j.stdout.String())
	}
	// Checked at once, not polled: gorun returns only after the started
	// ranks' supervisors reported them gone.
	if s := launchertest.Survivors(j.token); len(s) > 0 {
		t.Errorf("ranks %v outlived gorun", s)
	}
	j.noSurvivors()
}

// Killing a host's agent ends the job naming the host; nothing survives on
// any host.
func TestAgentKillEndsJob(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "hang", nil)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 8)
	victim := h.Hosts[2]
	pid := agentPid(t, victim)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := j.wait()
	if code != 255 || !strings.Contains(j.stderr.String(), "gorun: lost host "+victim+": ") ||
		!strings.Contains(j.stderr.String(), "ranks 4-5 counted as failed") {
		t.Errorf("exit %d, stderr:\n%s", code, j.stderr.String())
	}
	j.noSurvivors()
}

// Cutting a host's link ends the job within the lease, naming the host;
// the host's agent kills its ranks on its own when its lease runs out.
func TestLinkCutEndsJob(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "hang", nil)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 8)
	victim := h.Hosts[1]
	if err := h.CutLink(victim); err != nil {
		t.Fatal(err)
	}
	defer restore(t, victim)
	code := j.wait()
	if code != 255 || !strings.Contains(j.stderr.String(), "gorun: lost host "+victim+": no word from its agent") {
		t.Errorf("exit %d, stderr:\n%s", code, j.stderr.String())
	}
	j.noSurvivors()
}

func restore(t *testing.T, host string) {
	if err := hosts.RestoreLink(host); err != nil {
		t.Error(err)
	}
}

// restoreAndReach restores host's link and waits until it answers ssh
// again, as the tests after a cut link need.
func restoreAndReach(t *testing.T, h *testhosts.Netns, host string) {
	restore(t, host)
	if !launchertest.WaitFor(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return h.SSHCommand(ctx, host, "true").Run() == nil
	}) {
		t.Errorf("%s does not answer ssh after its link came back", host)
	}
}

func waitReady(t *testing.T, j *job, n int) {
	t.Helper()
	if !launchertest.WaitFor(time.Minute, func() bool { return strings.Count(j.stdout.String(), "ready ") >= n }) {
		_ = j.cmd.Process.Kill()
		t.Fatalf("%d ranks did not get ready\nstdout:\n%s\nstderr:\n%s", n, j.stdout.String(), j.stderr.String())
	}
}

// agentPid finds the gorun host agent running on host.
func agentPid(t *testing.T, host string) int {
	t.Helper()
	pids, err := hosts.Pids(host)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		args := strings.Split(string(b), "\x00")
		if len(args) > 2 && args[0] == gorunBin && args[1] == "agent" {
			return p
		}
	}
	out, _ := exec.Command("ps", "-ef").Output()
	t.Fatalf("no gorun agent on %s; processes there: %v\n%s", host, pids, out)
	return 0
}

// gorun doctor: a table line per host; all ready, then one host's link
// cut makes that host fail and the command exit 1.
func TestDoctor(t *testing.T) {
	h := requireHosts(t)
	hf, err := h.WriteHostfile(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	doctor := func() (int, string) {
		cmd := exec.Command(gorunBin, "doctor", "--launch-agent", strings.Join(h.SSHArgs(), " "), "-hostfile", hf)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	code, out := doctor()
	if code != 0 || !strings.Contains(out, fmt.Sprintf("all %d hosts ready (gorun on %s %s)", len(h.Hosts), h.Bridge, h.BridgeAddr)) {
		t.Fatalf("doctor exit %d:\n%s", code, out)
	}
	for i, host := range h.Hosts {
		want := fmt.Sprintf("eth0 %s", h.Addrs[i])
		if !strings.Contains(out, want) || !strings.Contains(out, "3/3") {
			t.Errorf("no ready line for %s with %q and 3/3 peers:\n%s", host, want, out)
		}
	}
	// Whether jobs get a cgroup, said for every host: on where this
	// machine allows it (the test hosts share its cgroup tree), off with
	// the reason otherwise.
	state := "off: "
	if _, err := supervisor.CgroupSupport(); err == nil {
		state = "on: "
	}
	for _, host := range append([]string{"the launching host"}, h.Hosts...) {
		if !strings.Contains(out, "job cgroups on "+host+": "+state) {
			t.Errorf("doctor does not say %q for %s:\n%s", "job cgroups on "+host+": "+state, host, out)
		}
	}

	down := h.Hosts[2]
	if err := h.CutLink(down); err != nil {
		t.Fatal(err)
	}
	defer restore(t, down)
	code, out = doctor()
	if code != 1 || !strings.Contains(out, "1 of 4 hosts not ready") || !regexpLine(out, down+` +FAIL .*FAIL: ssh: `) {
		t.Errorf("doctor with %s cut: exit %d:\n%s", down, code, out)
	}
}

func regexpLine(out, re string) bool {
	return regexp.MustCompile(`(?m)^` + re).MatchString(out)
}

// Above the fan-out threshold agents start further agents: with a
// threshold of 2, gorun starts 2 agents and each starts one more. The job
// runs the same, and a child host that cannot be reached is still named,
// reported by the parent that ran its ssh.
func TestTreeFanout(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "args", nil, "--fanout-threshold", "2", "--tag-output", "-v")
	if code := j.run(); code != 0 {
		t.Fatalf("gorun exited %d\nstderr:\n%s", code, j.stderr.String())
	}
	if !strings.Contains(j.stderr.String(), "starting agents as a tree") {
		t.Errorf("no tree launch in -v output:\n%s", j.stderr.String())
	}
	for r := range 8 {
		if tag := fmt.Sprintf("[%d,%s] ", r, h.Hosts[r/2]); !strings.Contains(j.stdout.String(), tag) {
			t.Errorf("no line tagged %q:\n%s", tag, j.stdout.String())
		}
	}
	j.noSurvivors()

	down := h.Hosts[3] // started by the agent of h.Hosts[1]
	if err := h.CutLink(down); err != nil {
		t.Fatal(err)
	}
	defer restore(t, down)
	j = newJob(t, h, 2, "hang", nil, "--fanout-threshold", "2")
	if code := j.run(); code != 255 || !strings.Contains(j.stderr.String(), "gorun: host "+down+": ssh: ") {
		t.Errorf("exit %d, stderr:\n%s\nwant 255 and an ssh error naming %s", code, j.stderr.String(), down)
	}
	j.noSurvivors()
}

// --preload-binary and --preload-files: the program runs from the hosts'
// content-addressed cache, the file lands in the working directory, and a
// second run sends nothing because every host already has both.
func TestPreload(t *testing.T) {
	h := requireHosts(t)
	dir := t.TempDir()
	prog := dir + "/prog.sh"
	script := fmt.Sprintf("#!/bin/sh\necho \"ran $0 data=$(cat data-%s.txt)\"\n", h.Set)
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	data := dir + "/data-" + h.Set + ".txt"
	if err := os.WriteFile(data, []byte("payload"), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(script))
	run := func() (int, string, string) {
		var stdout, stderr syncBuffer
		cmd := exec.Command(gorunBin, "-vv", "--launch-agent", strings.Join(h.SSHArgs(), " "), "-H", strings.Join(h.Hosts, ","),
			"--preload-binary", "--preload-files", data, prog)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	// The cache is private to the user (launcher/privdir): root's
	// ~/.cache/gorun/preload here, or $XDG_RUNTIME_DIR/gorun/preload.
	code, out, errOut := run()
	m := regexp.MustCompile(`ran (/\S*/gorun/preload/` + hex.EncodeToString(sum[:]) + `)/prog\.sh data=payload`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("exit %d, stdout:\n%s\nwant the program run from the private cache\nstderr:\n%s", code, out, errOut)
	}
	cache := m[1]
	t.Cleanup(func() { os.RemoveAll(cache) })
	want := "ran " + cache + "/prog.sh data=payload"
	if code != 0 || strings.Count(out, want) != len(h.Hosts) {
		t.Fatalf("exit %d, stdout:\n%s\nwant %q from every host\nstderr:\n%s", code, out, want, errOut)
	}
	for _, d := range []string{cache, filepath.Dir(cache)} {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("cache directory %s: %v %v, want a 0700 directory", d, st.Mode(), err)
		}
	}
	code, out, errOut = run()
	if code != 0 || strings.Count(out, want) != len(h.Hosts) || strings.Contains(errOut, "preloading") {
		t.Errorf("second run: exit %d, stdout:\n%s\nstderr (must not preload again):\n%s", code, out, errOut)
	}
}

// SIGKILL of gorun mid-job: every agent sees its connection close and
// kills its ranks; nothing survives on any host. SIGTERM instead is
// forwarded to every rank on every host.
func TestGorunDeathAndSignals(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 2, "hang", nil)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 8)
	if err := j.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	j.wait()
	j.noSurvivors()

	j = newJob(t, h, 2, "hang", nil)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, j, 8)
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(); code != 143 || !strings.Contains(j.stderr.String(), "gorun: received signal 15 (terminated); stopped 8 ranks") {
		t.Errorf("after SIGTERM: exit %d, stderr:\n%s", code, j.stderr.String())
	}
	j.noSurvivors()
}

// Output floods from every host arrive complete, each line whole and in
// order per rank.
func TestOutputFloodAcrossHosts(t *testing.T) {
	h := requireHosts(t)
	const lines = 20000
	j := newJob(t, h, 2, fmt.Sprintf("flood:%d", lines), nil)
	if code := j.run(); code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, j.stderr.String())
	}
	next := map[string]int{}
	for _, l := range strings.Split(strings.TrimSuffix(j.stdout.String(), "\n"), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || len(f[2]) != 100 {
			t.Fatalf("broken line %q", l)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(f[1], "l"))
		if err != nil || n != next[f[0]] {
			t.Fatalf("rank %s: line %q out of order, want l%d", f[0], l, next[f[0]])
		}
		next[f[0]]++
	}
	for r := range 8 {
		if got := next[fmt.Sprintf("r%d", r)]; got != lines {
			t.Errorf("rank %d: %d lines, want %d", r, got, lines)
		}
	}
	j.noSurvivors()
}

// gorun's stdin reaches rank 0 on its remote host, EOF included; the
// other ranks read /dev/null.
func TestStdinReachesRankZero(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 1, "cat", nil, "--tag-output")
	j.cmd.Stdin = strings.NewReader("first line\nsecond line\n")
	if code := j.run(); code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, j.stderr.String())
	}
	want := fmt.Sprintf("[0,%s] first line\n[0,%s] second line\n", h.Hosts[0], h.Hosts[0])
	if got := j.stdout.String(); got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	j.noSurvivors()
}

// An ssh refusal (here: a user the hosts do not know) names the host and
// says what ssh said.
func TestSSHRefusalIsNamed(t *testing.T) {
	h := requireHosts(t)
	j := newJob(t, h, 1, "hang", nil)
	for i, a := range j.cmd.Args {
		if a == "--launch-agent" {
			j.cmd.Args[i+1] += " -l gorun-no-such-user"
		}
	}
	code := j.run()
	if code != 255 || !regexp.MustCompile(`gorun: host \S+: ssh: .*Permission denied`).MatchString(j.stderr.String()) {
		t.Errorf("exit %d, stderr:\n%s\nwant 255 and ssh's refusal naming a host", code, j.stderr.String())
	}
	j.noSurvivors()
}
