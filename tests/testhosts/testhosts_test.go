package testhosts

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/hostlist"
)

// TestSetName checks the names the scripts accept: [a-z][a-z0-9]{0,7},
// unique within the process.
func TestSetName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)
	seen := map[string]bool{}
	for range 50 {
		name := newSetName()
		if !valid.MatchString(name) || seen[name] {
			t.Fatalf("set name %q invalid or repeated", name)
		}
		seen[name] = true
	}
}

// TestNetns brings up two hosts, uses them the way launcher tests will
// (ssh, name resolution, host-to-host traffic, a link cut, the orphan
// check) and then checks that the cleanup RequireNetns registered removed
// everything, including a process deliberately left behind.
func TestNetns(t *testing.T) {
	var h *Netns
	var leftover int
	t.Run("hosts", func(t *testing.T) {
		h = RequireNetns(t, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		// One ssh per host (a handshake costs seconds on a loaded machine):
		// its name, its address, and from the first host a TCP connection
		// to the second one's sshd by name (/etc/hosts) through the bridge.
		for i, host := range h.Hosts {
			cmd := "hostname; ip -4 -o addr show dev eth0"
			if i == 0 {
				cmd += fmt.Sprintf("; timeout 20 bash -c 'exec 3<>/dev/tcp/%s/22; head -c 4 <&3'", h.Hosts[1])
			}
			out, err := h.SSHCommand(ctx, host, cmd).CombinedOutput()
			if err != nil {
				t.Fatalf("ssh %s: %v\n%s", host, err, out)
			}
			lines := strings.Split(string(out), "\n")
			if lines[0] != host {
				t.Errorf("ssh %s hostname = %q, want %q", host, lines[0], host)
			}
			if !strings.Contains(string(out), " "+h.Addrs[i]+"/24 ") {
				t.Errorf("ssh %s: eth0 does not hold %s:\n%s", host, h.Addrs[i], out)
			}
			if i == 0 && !strings.HasSuffix(string(out), "\nSSH-") {
				t.Errorf("%s -> %s:22 did not answer SSH-:\n%s", host, h.Hosts[1], out)
			}
		}

		// Without ssh, a command sees the same host identity.
		if out, err := h.ExecCommand(ctx, h.Hosts[1], "hostname").Output(); err != nil || strings.TrimSpace(string(out)) != h.Hosts[1] {
			t.Errorf("ExecCommand(%s, hostname) = %q, %v", h.Hosts[1], out, err)
		}

		// A process left running on a host is what the orphan check finds.
		leftoverCmd := h.ExecCommand(ctx, h.Hosts[1], "sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
		if out, err := leftoverCmd.Output(); err != nil {
			t.Fatalf("starting a leftover: %v", err)
		} else if leftover, err = strconv.Atoi(strings.TrimSpace(string(out))); err != nil {
			t.Fatalf("leftover pid %q: %v", out, err)
		}
		stray, err := h.StrayPids(h.Hosts[1])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(stray, leftover) {
			t.Errorf("StrayPids(%s) = %v, want it to contain the leftover %d", h.Hosts[1], stray, leftover)
		}
		if stray, err := h.StrayPids(h.Hosts[0]); err != nil || len(stray) != 0 {
			t.Errorf("StrayPids(%s) = %v, %v; want none", h.Hosts[0], stray, err)
		}

		// A cut link makes the host unreachable; restoring it brings it back.
		if err := h.CutLink(h.Hosts[1]); err != nil {
			t.Fatal(err)
		}
		probe := exec.CommandContext(ctx, "ssh", "-F", h.SSHConfig, "-o", "ConnectTimeout=1", h.Hosts[1], "true")
		if out, err := probe.CombinedOutput(); err == nil {
			t.Errorf("ssh to %s succeeded through a cut link: %s", h.Hosts[1], out)
		}
		if err := h.RestoreLink(h.Hosts[1]); err != nil {
			t.Fatal(err)
		}
		if err := pollUntil(ctx, func() bool {
			return h.SSHCommand(ctx, h.Hosts[1], "true").Run() == nil
		}); err != nil {
			t.Errorf("ssh to %s after RestoreLink: %v", h.Hosts[1], err)
		}

		// Shaping a link and undoing it (tbf: netem is missing from some
		// kernels, which Shape reports).
		if err := h.Shape(h.Hosts[1], "tbf", "rate", "100mbit", "burst", "32kbit", "latency", "400ms"); err != nil {
			t.Errorf("Shape: %v", err)
		}
		if err := h.Shape(h.Hosts[1]); err != nil {
			t.Errorf("Shape() to undo: %v", err)
		}
		if err := h.Shape(h.Hosts[1]); err != nil {
			t.Errorf("Shape() twice: %v", err)
		}

		path, err := h.WriteHostfile(t.TempDir(), 2)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != h.Hosts[0]+" slots=2\n"+h.Hosts[1]+" slots=2\n" {
			t.Errorf("hostfile = %q", b)
		}
	})
	if h == nil {
		if !t.Failed() {
			t.Skip("skipped: no test hosts (see the subtest)")
		}
		return
	}

	// The subtest's cleanup has run: nothing of the set may remain.
	for _, host := range h.Hosts {
		if _, err := os.Stat(filepath.Join("/run/netns", host)); err == nil {
			t.Errorf("namespace %s still exists", host)
		}
	}
	if err := exec.Command("ip", "link", "show", h.Bridge).Run(); err == nil {
		t.Errorf("bridge %s still exists", h.Bridge)
	}
	if _, err := os.Stat(h.StateDir); err == nil {
		t.Errorf("state directory %s still exists", h.StateDir)
	}
	if lines := etcHostsLines(t, "gorun-testhosts:"+h.Set); len(lines) != 0 {
		t.Errorf("/etc/hosts still has %q", lines)
	}
	if leftover > 0 && !gone(leftover) {
		t.Errorf("leftover process %d survived the teardown", leftover)
	}
}

// TestSlurm runs the two ways gorun uses SLURM: a direct srun and a batch
// job, and checks the variables gorun will read with the hostlist parsers.
func TestSlurm(t *testing.T) {
	s := RequireSlurm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	out, err := s.Command(ctx, "srun", "-n", "4", "sh", "-c",
		`echo "$SLURM_PROCID $SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE"`).CombinedOutput()
	if err != nil {
		t.Fatalf("srun -n 4: %v\n%s", err, out)
	}
	var procids []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			t.Fatalf("srun output line %q", sc.Text())
		}
		procids = append(procids, f[0])
		nodes, err := hostlist.ZipTasks(f[1], f[2])
		if want := []hostlist.NodeTasks{{Name: s.Node, Tasks: 4}}; err != nil || !slices.Equal(nodes, want) {
			t.Errorf("SLURM_JOB_NODELIST %q, SLURM_TASKS_PER_NODE %q give %v, %v; want %v", f[1], f[2], nodes, err, want)
		}
	}
	sort.Strings(procids)
	if !slices.Equal(procids, []string{"0", "1", "2", "3"}) {
		t.Errorf("SLURM_PROCID values %v, want 0..3", procids)
	}

	// An allocation that runs a step, as an sbatch script around gorun
	// would. (salloc rather than sbatch --wait, which polls every 10 s.)
	out, err = s.Command(ctx, "salloc", "-n", "2", "srun", "hostname").Output()
	if err != nil {
		t.Fatalf("salloc: %v\n%s", err, out)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{s.Node, s.Node}) {
		t.Errorf("salloc -n 2 srun hostname printed %q, want %s twice", out, s.Node)
	}
}

// pollUntil calls ok until it returns true or ctx ends; it polls rather
// than sleeping a fixed time, so a slow machine only makes it slower.
func pollUntil(ctx context.Context, ok func() bool) error {
	for {
		if ok() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// gone reports whether pid has exited: no longer in /proc, or a zombie
// waiting for init to reap it. It waits up to 10 s for the reaper.
func gone(pid int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pollUntil(ctx, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
	}) == nil
}

func etcHostsLines(t *testing.T, marker string) []string {
	t.Helper()
	b, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, "# "+marker) {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestStaleSweep checks whom netns-down.sh --stale removes: a set whose
// recorded owner is gone, and nothing else. A set made by hand has no
// owner file and must be left alone, whether it is listed first or after
// a set that has an owner (reading a missing owner under set -u kills the
// script, and every test that asks for hosts fails with it). The sets here are state
// directories only, with no namespaces, so the sweep is cheap and touches
// nothing real.
func TestStaleSweep(t *testing.T) {
	base := t.TempDir()
	t.Setenv("GORUN_TESTHOSTS_DIR", base)

	// A pid that is surely gone: a child that has exited and been reaped.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := gone.Process.Pid

	// Names sort in creation order, so the owner-less set "hand" is
	// swept between two sets that have owners.
	dead, hand, live := newSetName(), newSetName(), newSetName()
	handFirst := "a" + hand[1:] // sorts before every t... set
	pidns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		pidns = "unknown"
	}
	mk := func(set, owner string) {
		dir := filepath.Join(base, set)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "subnet_index"), []byte("200\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(owner+" "+pidns+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk(handFirst, "")
	mk(dead, strconv.Itoa(deadPID))
	mk(hand, "")
	mk(live, strconv.Itoa(os.Getpid()))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := runScript(ctx, "netns", "netns-down.sh", "--stale"); err != nil {
		skipOrFatal(t, err)
	}
	for set, want := range map[string]bool{handFirst: true, dead: false, hand: true, live: true} {
		_, err := os.Stat(filepath.Join(base, set))
		if got := err == nil; got != want {
			t.Errorf("after --stale, set %s exists = %v, want %v (stat: %v)", set, got, want, err)
		}
	}
}
