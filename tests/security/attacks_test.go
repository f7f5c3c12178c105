package security

import (
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
)

// The bounds a rank or gorun must stay within while the attacker holds
// thousands of connections: the gates admit at most 128 from one source,
// so a few hundred descriptors and well under 100 MiB resident (without
// the gates, 8000 connections took 236 MB).
const (
	maxFDs    = 400
	maxRSSKiB = 100 << 10
)

// A job of 4 ranks on this host (one host leader, three attached ranks):
// the second user holds 1500 connections to two ranks' data ports, connects
// to every gorun attach socket it can see, and tries to read the ranks'
// secrets from /proc and /dev/shm. The ranks' descriptors and memory stay
// bounded, the attach connections are refused, nothing is readable, and the
// all-reduce is right.
func TestAttacksOnASingleHostJob(t *testing.T) {
	requireSetUp(t)
	j := startJob(t, "-np", "4")
	addrs, pids := j.ready(4)
	attach := attack(t, "", append([]string{"attach", "3s"}, attachNames(t, pids)...)...)
	var holds []func() string
	for _, r := range []int{0, 3} {
		holds = append(holds, attack(t, "", "hold", addrs[r], "1500", "8s"))
	}
	waitHeld(t, holds, 2)
	checkBounded(t, "rank", pids)
	// Rank 0 is the host leader, the host's only gossip member: its
	// gossip port gets 3000 connections kept open.
	seed := envOf(t, pids[0], "GORUN_RDZV_ENDPOINT")
	churn := attack(t, "", "churn", seed, "3000", "5s")
	time.Sleep(time.Second)
	checkGossipBounded(t, pids[0])
	out := attack(t, "", "read-secrets")()
	if !strings.Contains(out, "environ-with-secret=0 shm-openable=0 tmp-listable=0") {
		t.Errorf("the second user read a job's secret from /proc, opened its shared memory or listed its temporary files: %s", out)
	}
	checkShm(t)
	checkTempDirs(t)
	if c := churn(); !regexp.MustCompile(`dials=[1-9]\d{3,}`).MatchString(c) {
		t.Errorf("gossip churn made fewer than 1000 connections: %s", c)
	}
	if a := attach(); !attachRefused(a) {
		t.Errorf("attach sockets: %s, want connections made and all closed by the leader", a)
	}
	j.finish(4)
}

// A job across two namespace hosts, 2 ranks each. While it starts, the
// second user watches ps for the host agents' command lines (the job id,
// the host names and gorun's address are in them) and: floods gorun's agent
// port with hellos that claim protocol 9 for the job's hosts and holds 300
// silent connections to it; on every host binds the attach socket name a
// job once used (@gorun-<job>-<host>) and connects to every gorun attach
// socket there; and holds 1500 connections to a rank's data port on each
// host. The job must start, run and give the right all-reduce, gorun and
// the ranks stay bounded, the job secret is in no process's arguments, and
// it never crosses the hosts' network in clear (every frame on the bridge
// is captured and searched).
func TestAttacksAcrossHosts(t *testing.T) {
	h := requireHosts(t)
	agentPort := attack(t, "", "agent-port", "10s", h.Set)
	var squats []func() string
	for _, host := range h.Hosts {
		squats = append(squats, attack(t, host, "squat-watch", host, "60s"))
	}
	time.Sleep(300 * time.Millisecond) // the watchers are up
	sn := sniff(t, h.Bridge)
	j := startJob(t, slowSSH(h), "-H", h.Hosts[0]+":2,"+h.Hosts[1]+":2")
	addrs, pids := j.ready(4)
	var holds []func() string
	for i, host := range h.Hosts {
		holds = append(holds, attack(t, host, "hold", addrs[2*i], "1500", "8s"))
	}
	waitHeld(t, holds, 2)
	checkBounded(t, "rank", pids)
	checkBounded(t, "gorun", []int{j.cmd.Process.Pid})
	secret := checkSecretNotInArgs(t, pids[0])
	j.finish(4)
	sn.close()
	if found, n := sn.contains(secret); found || n < 100 {
		t.Errorf("%d frames captured on %s; the job secret crossed the network in clear: %v", n, h.Bridge, found)
	}
	out := agentPort()
	if !regexp.MustCompile(`hellos=[1-9]\d* held=300 still-open=0 `).MatchString(out) {
		t.Errorf("agent-port attack: %s\nwant hellos sent, 300 connections made and none left open by gorun", out)
	}
	t.Log(strings.TrimSpace(out))
	for i, s := range squats {
		out := s()
		if !strings.Contains(out, "squatted=1 ") {
			t.Errorf("host %s: the old attach name was not taken first (attack not run): %s", h.Hosts[i], out)
		}
		if !attachRefused(out) {
			t.Errorf("host %s: %s, want attach connections made and all closed by the leader", h.Hosts[i], out)
		}
	}
	if s := j.stderr.String(); !strings.Contains(s, "refused a connection to the host-agent port") {
		// gorun logs refusals at warn, shown by default.
		t.Logf("gorun's stderr shows no refused agent connection:\n%s", s)
	}
}

// The second user, on the second job host (so with the address that host's
// agent connects from), reads gorun's host-agent port from the first
// agent's command line and keeps 1100 silent connections to it open,
// redialing each one gorun closes, before the second agent connects: more
// than the port's bound in all and than any per-source share. The launch
// must succeed every time and take at most about a second longer than the
// same launch without the flood.
func TestAgentPortFloodFromAJobHost(t *testing.T) {
	h := requireHosts(t)
	// The second host's agent starts 2 s after the first's, so the
	// flood is in place when it connects.
	template := fmt.Sprintf(`--launch-agent=sh -c 'sleep 0.5; case "$*" in *%s*) sleep 2;; esac; exec "$0" "$@"' %s`,
		h.Hosts[1], strings.Join(h.SSHArgs(), " "))
	hostsArg := h.Hosts[0] + ":2," + h.Hosts[1] + ":2"
	launch := func(flood bool) time.Duration {
		t.Helper()
		var out func() string
		if flood {
			out = attack(t, h.Hosts[1], "agent-flood", h.Set, "1100", "6s")
		}
		start := time.Now()
		j := startJob(t, template, "-H", hostsArg)
		j.ready(4)
		took := time.Since(start)
		j.finish(4)
		if flood {
			o := out()
			if !regexp.MustCompile(`dials=\d+ peak-open=(1[01]\d\d)`).MatchString(o) {
				t.Errorf("the flood did not hold over 1000 connections at once: %s", o)
			}
			t.Log(strings.TrimSpace(o))
		}
		return took
	}
	clean := launch(false)
	best := time.Duration(1 << 62)
	var delays []time.Duration
	for i := range floodRuns() {
		if i > 0 && measuring() {
			clean = launch(false) // each flooded launch beside its own anchor
		}
		flooded := launch(true)
		t.Logf("launch to 4 ranks ready: %v clean, %v flooded (run %d)", clean, flooded, i+1)
		best = min(best, flooded-clean)
		delays = append(delays, flooded-clean)
	}
	t.Logf("agent-port flood: median delay %v over %d runs", median(delays), len(delays))
	// The promise is about a second. The machine is shared, and one
	// launch can differ from another by more than that in noise alone, so
	// the better of the two flooded launches is held to 1.5 s. Without
	// eviction the flood keeps the second agent out for its whole length,
	// and both flooded launches come 3 s late.
	if best > 1500*time.Millisecond {
		t.Errorf("the flood delayed the launch by %v at best of 2 runs (clean %v)", best, clean)
	}
}

// --preload-binary while the second user has created the preload trees a
// job once used in the shared /tmp (world-writable, a planted prog.sh with
// the program's hash as directory name): the genuine program runs on every
// host from a 0700 directory of root's, and the planted one never runs.
func TestPreloadTreePlanted(t *testing.T) {
	h := requireHosts(t)
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog.sh")
	script := "#!/bin/sh\necho \"GENUINE $0\"\n"
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(script))
	sha := hex.EncodeToString(sum[:])
	os.Remove("/tmp/gorun-security-pwned")
	var planted []string
	for _, d := range []string{
		fmt.Sprintf("/tmp/gorun-preload-%d/%s", os.Getuid(), sha),
		fmt.Sprintf("/tmp/gorun-%d/preload/%s", os.Getuid(), sha),
	} {
		planted = append(planted, d)
		t.Cleanup(func() { os.RemoveAll(strings.Join(strings.Split(d, "/")[:3], "/")) })
	}
	if out := attack(t, "", append([]string{"plant"}, planted...)...)(); !strings.Contains(out, "plant done") {
		t.Fatalf("planting failed: %s", out)
	}
	cmd := exec.Command(gorunBin, "--launch-agent", strings.Join(h.SSHArgs(), " "), "-H", strings.Join(h.Hosts, ","),
		"--preload-binary", prog)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Count(string(out), "GENUINE ") != len(h.Hosts) || strings.Contains(string(out), "PWNED") {
		t.Fatalf("gorun: %v\n%s\nwant GENUINE from every host and no PWNED", err, out)
	}
	if _, err := os.Stat("/tmp/gorun-security-pwned"); err == nil {
		t.Fatal("the planted program ran")
	}
	m := regexp.MustCompile(`GENUINE (\S+)/prog\.sh`).FindStringSubmatch(string(out))
	cache := m[1]
	t.Cleanup(func() { os.RemoveAll(cache) })
	for _, d := range []string{cache, filepath.Dir(cache)} {
		st, err := os.Lstat(d)
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("cache directory %s: %v %v, want root's 0700 directory", d, st.Mode(), err)
		}
	}
}

// --output-dir naming a directory in which the second user made
// rank.0.log a symlink to a file of root's (mode 0600): a directory of the
// second user's, and one of root's that the second user's group may write.
// The root job must not write through the link: gorun refuses with an
// error that names the directory or the file, and root's file keeps its
// content.
func TestOutputDirForeignSymlink(t *testing.T) {
	requireSetUp(t)
	for _, shared := range []bool{false, true} {
		victim := filepath.Join(t.TempDir(), "root-only")
		if err := os.WriteFile(victim, []byte("ROOT SECRET\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		dir := fmt.Sprintf("/tmp/gorun-sec-out-%d-%v", os.Getpid(), shared)
		t.Cleanup(func() { os.RemoveAll(dir) })
		if shared {
			// root's, group-writable by the second user's group.
			if err := os.Mkdir(dir, 0o770); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("chgrp", attacker, dir).CombinedOutput(); err != nil {
				t.Fatalf("chgrp: %v %s", err, out)
			}
			_ = os.Chmod(dir, 0o770)
		}
		if out := attack(t, "", "link", dir, "rank.0.log", victim)(); !strings.Contains(out, "link done") {
			t.Fatalf("planting the link failed: %s", out)
		}
		cmd := exec.Command(gorunBin, "-np", "1", "--output-dir", dir, "-x", modeEnv+"=show", selfBin)
		out, err := cmd.CombinedOutput()
		if b, _ := os.ReadFile(victim); string(b) != "ROOT SECRET\n" {
			t.Fatalf("root's 0600 file was overwritten through the second user's symlink in %s: now %q\ngorun: %v\n%s", dir, b, err, out)
		}
		want := dir + " belongs to uid"
		if shared {
			want = "rank.0.log is a symbolic link"
		}
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("gorun: %v\n%s\nwant a refusal saying %q", err, out, want)
		}
		t.Logf("gorun: %v: %s", err, strings.TrimSpace(string(out)))
	}
}

// --preload-files into a working directory of the second user's, where it
// already put a file of the same content (so the same hash), mode 0666: the
// root job must not keep that file, which its owner can rewrite before or
// while the ranks read it. gorun either refuses the directory with a clear
// error or replaces the file with root's own copy.
func TestPreloadFilesForeignCopy(t *testing.T) {
	h := requireHosts(t)
	src := t.TempDir()
	const content = "genuine input\n"
	if err := os.WriteFile(filepath.Join(src, "input.txt"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	work := fmt.Sprintf("/tmp/gorun-sec-work-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(work) })
	if out := attack(t, "", "put", work, "input.txt", content)(); !strings.Contains(out, "put done") {
		t.Fatalf("planting the copy failed: %s", out)
	}
	cmd := exec.Command(gorunBin, "--launch-agent", strings.Join(h.SSHArgs(), " "), "-H", h.Hosts[0],
		"--preload-files", filepath.Join(src, "input.txt"), "-x", modeEnv+"=show", selfBin, "input.txt")
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	st, serr := os.Lstat(filepath.Join(work, "input.txt"))
	foreign := serr == nil && st.Sys().(*syscall.Stat_t).Uid != 0
	switch {
	case err == nil && foreign:
		t.Fatalf("the rank ran with the second user's copy of input.txt (uid %d, mode %v) kept:\n%s",
			st.Sys().(*syscall.Stat_t).Uid, st.Mode(), out)
	case err == nil && st.Mode().Perm()&0o022 != 0:
		t.Fatalf("input.txt is root's now but writable by others (%v):\n%s", st.Mode(), out)
	case err != nil && !strings.Contains(string(out), work):
		t.Fatalf("gorun: %v\n%s\nwant the refusal to name the directory %s", err, out, work)
	}
	t.Logf("gorun: %v: %s", err, strings.TrimSpace(string(out)))
}

// attachNames finds the abstract attach sockets the given processes
// listen on (socket inodes in /proc/PID/fd matched with /proc/net/unix),
// so that the attack on this shared host targets only this job.
func attachNames(t *testing.T, pids []int) []string {
	t.Helper()
	inodes := map[string]bool{}
	for _, pid := range pids {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, e := range ents {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			if ino, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = true
			}
		}
	}
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && f[5] == "01" && inodes[f[6]] && strings.HasPrefix(f[7], "@gorun-") {
			names = append(names, f[7][1:])
		}
	}
	if len(names) == 0 {
		t.Fatal("found no attach socket of the job's leader")
	}
	return names
}

// slowSSH is a launch-agent template that waits a second before ssh, so
// the agent command lines sit in ps long enough for the watchers.
func slowSSH(h interface{ SSHArgs() []string }) string {
	return "--launch-agent=sh -c 'sleep 1; exec \"$0\" \"$@\"' " + strings.Join(h.SSHArgs(), " ")
}

// waitHeld waits until each hold attack says how many connections it
// opened.
func waitHeld(t *testing.T, holds []func() string, n int) {
	t.Helper()
	_ = n
	// The attackers print once they opened their connections; their
	// output is read at the end, so give them time to dial 1500 each.
	time.Sleep(3 * time.Second)
}

// checkBounded: descriptors and memory of each pid stay within the bounds.
func checkBounded(t *testing.T, what string, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if n := fds(pid); n > maxFDs {
			t.Errorf("%s pid %d holds %d descriptors under the flood, want ≤ %d", what, pid, n, maxFDs)
		}
		if k := rssKiB(pid); k > maxRSSKiB {
			t.Errorf("%s pid %d resident %d KiB under the flood, want ≤ %d", what, pid, k, maxRSSKiB)
		}
		t.Logf("%s pid %d under the flood: %d descriptors, %d KiB resident", what, pid, fds(pid), rssKiB(pid))
	}
}

// maxGossipFDs bounds a gossip member's descriptors under the churn:
// memberlist's streams are admitted up to 1024 per source
// (rendezvous/gossipnet.go), plus the rank's own.
const maxGossipFDs = 1024 + maxFDs

// checkGossipBounded samples pid's descriptors for two seconds while its
// gossip port is churned and checks the peak.
func checkGossipBounded(t *testing.T, pid int) {
	t.Helper()
	peak := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		peak = max(peak, fds(pid))
	}
	t.Logf("gossip member pid %d under the churn: peak %d descriptors", pid, peak)
	if peak > maxGossipFDs {
		t.Errorf("gossip member pid %d peaked at %d descriptors under the churn, want ≤ %d", pid, peak, maxGossipFDs)
	}
}

// envOf reads one variable of pid's environment (as root).
func envOf(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	t.Fatalf("pid %d has no %s", pid, name)
	return ""
}

// checkShm: every gorun segment in /dev/shm is 0600.
func checkShm(t *testing.T) {
	t.Helper()
	ents, _ := os.ReadDir("/dev/shm")
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "gorun") {
			continue
		}
		if st, err := os.Stat("/dev/shm/" + e.Name()); err == nil && st.Mode().Perm()&0o077 != 0 {
			t.Errorf("/dev/shm/%s has mode %04o, want 0600", e.Name(), st.Mode().Perm())
		}
	}
}

// checkTempDirs: gorun's temporary directories of root's are 0700 (the
// flight-record directory of a single-host job is one).
func checkTempDirs(t *testing.T) {
	t.Helper()
	dirs, _ := filepath.Glob("/tmp/gorun-flight-*")
	if len(dirs) == 0 {
		t.Error("no flight-record directory in /tmp during a single-host job")
	}
	for _, d := range dirs {
		st, err := os.Lstat(d)
		if err == nil && st.Sys().(*syscall.Stat_t).Uid == 0 && st.Mode().Perm() != 0o700 {
			t.Errorf("%s has mode %04o, want 0700", d, st.Mode().Perm())
		}
	}
}

// checkSecretNotInArgs reads the job secret from a rank's environment (as
// root) and looks for it in every process's command line.
func checkSecretNotInArgs(t *testing.T, rankPid int) string {
	t.Helper()
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", rankPid))
	if err != nil {
		t.Fatal(err)
	}
	var secret string
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "GORUN_SECRET="); ok {
			secret = v
		}
	}
	if len(secret) < 16 {
		t.Fatalf("rank %d has no GORUN_SECRET", rankPid)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(b), secret) {
			t.Errorf("pid %s has the job secret in its arguments: %q", e.Name(), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return secret
}

// attachRefused: the squat-watch attacker connected to attach sockets and
// the leaders closed every one of those connections.
func attachRefused(out string) bool {
	m := regexp.MustCompile(`attached=(\d+) closed-by-leader=(\d+)`).FindStringSubmatch(out)
	return m != nil && m[1] != "0" && m[1] == m[2]
}
