package testhosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// upTimeout bounds netns-up.sh and slurm-up.sh. It covers a first-time apt
// install on a loaded machine; a normal start takes seconds.
const upTimeout = 5 * time.Minute

// Netns is a running set of namespace hosts made by netns-up.sh: Hosts[i]
// is a network namespace with address Addrs[i] on Bridge, running sshd on
// port 22 and resolvable by name through /etc/hosts. The launching process
// stays in the root namespace and reaches every host through the bridge.
//
// Its methods are safe for concurrent use; Close is idempotent.
type Netns struct {
	// Set is the set's name; hosts are named Set-h1..Set-hN.
	Set string
	// Hosts are the host (and namespace) names, in order.
	Hosts []string
	// Addrs are the hosts' IPv4 addresses, Addrs[i] for Hosts[i].
	Addrs []string
	// Bridge is the bridge interface in the root namespace; BridgeAddr its
	// address, through which this process reaches the hosts, in Subnet.
	Bridge, BridgeAddr, Subnet string
	// SSHConfig is an ssh client config (ssh -F) for the hosts: root with
	// Identity, batch mode, no host key checks.
	SSHConfig, Identity string
	// StateDir holds keys, configs and sshd logs; Hostfile lists the hosts,
	// one per line.
	StateDir, Hostfile string

	closeOnce sync.Once
	closeErr  error
}

// setCounter makes set names unique within this process.
var setCounter atomic.Uint32

// newSetName returns a set name unique on this machine while this process
// lives: "t", the pid in 5 base-36 digits (pid_max is at most 2^22) and a
// counter in 2, so 8 characters as the scripts require (interface names are
// limited to 15 bytes). Fixed widths keep pid and counter from running into
// each other.
func newSetName() string {
	return fmt.Sprintf("t%05s%02s",
		strconv.FormatInt(int64(os.Getpid())%(36*36*36*36*36), 36),
		strconv.FormatInt(int64(setCounter.Add(1)%(36*36)), 36))
}

// StartNetns brings up n namespace hosts in a new set owned by this
// process. Sets left behind by processes that died (a test binary killed by
// its timeout runs no cleanup) are removed first. The caller must Close the
// result; RequireNetns does that for tests.
func StartNetns(ctx context.Context, n int) (*Netns, error) {
	if n < 1 || n > 200 {
		return nil, fmt.Errorf("testhosts: StartNetns: n must be in 1..200, got %d", n)
	}
	ctx, cancel := context.WithTimeout(ctx, upTimeout)
	defer cancel()
	if _, err := runScript(ctx, "netns", "netns-down.sh", "--stale"); err != nil {
		return nil, err
	}
	set := newSetName()
	kv, err := runScript(ctx, "netns", "netns-up.sh", strconv.Itoa(n), set, "--owner", strconv.Itoa(os.Getpid()))
	if err != nil {
		// Leave nothing half made.
		_, _ = runScript(context.Background(), "netns", "netns-down.sh", set)
		return nil, err
	}
	h := &Netns{
		Set:        kv["SET"],
		Hosts:      strings.Fields(kv["HOSTS"]),
		Addrs:      strings.Fields(kv["ADDRS"]),
		Bridge:     kv["BRIDGE"],
		BridgeAddr: kv["BRIDGE_ADDR"],
		Subnet:     kv["SUBNET"],
		SSHConfig:  kv["SSH_CONFIG"],
		Identity:   kv["IDENTITY"],
		StateDir:   kv["STATE"],
		Hostfile:   kv["HOSTFILE"],
	}
	if h.Set != set || len(h.Hosts) != n || len(h.Addrs) != n || h.SSHConfig == "" {
		_ = h.Close()
		return nil, fmt.Errorf("testhosts: netns-up.sh printed an unexpected result: %v", kv)
	}
	return h, nil
}

// RequireNetns returns n namespace hosts for the test and removes them when
// it ends, whether it passed or not. It skips the test when the machine
// cannot provide them (not root, tools missing) or in -short mode, since
// starting the hosts takes seconds.
func RequireNetns(t testing.TB, n int) *Netns {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: namespace hosts take seconds to start (-short)")
	}
	h, err := StartNetns(context.Background(), n)
	if err != nil {
		skipOrFatal(t, err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("tearing down test hosts: %v", err)
		}
	})
	return h
}

// Close stops the hosts' sshd and every process left in their namespaces,
// and removes the namespaces, the bridge, the /etc/hosts lines and the
// state directory. It is idempotent.
func (h *Netns) Close() error {
	h.closeOnce.Do(func() {
		_, h.closeErr = runScript(context.Background(), "netns", "netns-down.sh", h.Set)
	})
	return h.closeErr
}

// SSHArgs is the ssh command line that reaches the hosts, e.g. for a
// launcher's agent command template: ssh -F SSHConfig.
func (h *Netns) SSHArgs() []string {
	return []string{"ssh", "-F", h.SSHConfig}
}

// SSHCommand returns a command that runs args on host over ssh, as a
// launcher would. args are joined by the remote shell, as ssh does.
func (h *Netns) SSHCommand(ctx context.Context, host string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ssh", append([]string{"-F", h.SSHConfig, host}, args...)...)
}

// ExecCommand returns a command that runs args inside host's network
// namespace directly, without ssh: ip netns exec, plus a UTS namespace of
// its own so that `hostname` there prints host, as in an ssh session. The
// command's process is args[0] itself (every step execs), so killing it or
// cancelling ctx reaches the program.
func (h *Netns) ExecCommand(ctx context.Context, host string, args ...string) *exec.Cmd {
	pre := []string{"netns", "exec", host, "unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, host}
	return exec.CommandContext(ctx, "ip", append(pre, args...)...)
}

// Addr returns host's address, or "" for a host not in the set.
func (h *Netns) Addr(host string) string {
	if i := slices.Index(h.Hosts, host); i >= 0 {
		return h.Addrs[i]
	}
	return ""
}

// CutLink takes host's interface down inside its namespace: the host stays
// up but nothing reaches it, as when a cable is pulled. Connections to it
// then stall rather than reset.
func (h *Netns) CutLink(host string) error {
	return h.ip("-n", host, "link", "set", "eth0", "down")
}

// RestoreLink undoes CutLink. The host's address and default route come
// back with the link.
func (h *Netns) RestoreLink(host string) error {
	if err := h.ip("-n", host, "link", "set", "eth0", "up"); err != nil {
		return err
	}
	return h.ip("-n", host, "route", "replace", "default", "via", h.BridgeAddr)
}

// Blackhole drops every packet into and out of host with iptables inside
// its namespace: the link stays up and nothing is refused, so connections
// stall (no reset, no ICMP), as with a host that hangs or a firewall that
// drops. Unblock undoes it (and Partition).
func (h *Netns) Blackhole(host string) error {
	if h.Addr(host) == "" {
		return fmt.Errorf("testhosts: %q is not a host of set %s", host, h.Set)
	}
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		if err := h.iptables(host, "-A", chain, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// Partition drops every packet between hosts a and b (rules in a's
// namespace, both directions); each still reaches every other host and
// the machine that runs the test. Unblock(a) undoes it.
func (h *Netns) Partition(a, b string) error {
	ab := h.Addr(b)
	if h.Addr(a) == "" || ab == "" {
		return fmt.Errorf("testhosts: %q or %q is not a host of set %s", a, b, h.Set)
	}
	if err := h.iptables(a, "-A", "INPUT", "-s", ab, "-j", "DROP"); err != nil {
		return err
	}
	return h.iptables(a, "-A", "OUTPUT", "-d", ab, "-j", "DROP")
}

// Unblock removes every iptables rule of host's namespace (Blackhole,
// Partition).
func (h *Netns) Unblock(host string) error {
	if h.Addr(host) == "" {
		return fmt.Errorf("testhosts: %q is not a host of set %s", host, h.Set)
	}
	return h.iptables(host, "-F")
}

func (h *Netns) iptables(host string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", host, "iptables", "-w"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testhosts: iptables %s in %s: %w: %s", strings.Join(args, " "), host, exitDetail(err), bytes.TrimSpace(out))
	}
	return nil
}

// Shape replaces the root qdisc of host's link (the bridge side, so
// traffic towards the host is shaped) with the given one, e.g.
// Shape(host, "tbf", "rate", "1gbit", "burst", "32kbit", "latency", "400ms")
// or Shape(host, "netem", "delay", "20ms", "loss", "1%"). No arguments
// restore the default. A kernel without the qdisc (some sandboxes lack
// sch_netem) gives an error that says so.
func (h *Netns) Shape(host string, qdisc ...string) error {
	if h.Addr(host) == "" {
		return fmt.Errorf("testhosts: %q is not a host of set %s", host, h.Set)
	}
	dev := "v" + host
	if len(qdisc) == 0 {
		err := h.tc("qdisc", "del", "dev", dev, "root")
		if err != nil && strings.Contains(err.Error(), "handle of zero") {
			return nil // nothing to remove
		}
		return err
	}
	err := h.tc(append([]string{"qdisc", "replace", "dev", dev, "root"}, qdisc...)...)
	if err != nil && strings.Contains(err.Error(), "kind is unknown") {
		return fmt.Errorf("%w (this kernel lacks the %s qdisc)", err, qdisc[0])
	}
	return err
}

// Pids lists the processes running in host's network namespace, sshd
// included.
func (h *Netns) Pids(host string) ([]int, error) {
	if h.Addr(host) == "" {
		return nil, fmt.Errorf("testhosts: %q is not a host of set %s", host, h.Set)
	}
	out, err := exec.Command("ip", "netns", "pids", host).Output()
	if err != nil {
		return nil, fmt.Errorf("testhosts: ip netns pids %s: %w", host, exitDetail(err))
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("testhosts: ip netns pids %s printed %q", host, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// SSHDPid is the pid of host's sshd daemon, or -1 when its pid file
// cannot be read.
func (h *Netns) SSHDPid(host string) int {
	b, err := os.ReadFile(filepath.Join(h.StateDir, host, "sshd.pid"))
	if err != nil {
		return -1
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return pid
}

// StrayPids lists the processes in host's namespace other than its sshd
// daemon and sshd's per-connection processes: after a job has ended there
// must be none (the orphan check).
func (h *Netns) StrayPids(host string) ([]int, error) {
	pids, err := h.Pids(host)
	if err != nil {
		return nil, err
	}
	daemon := h.SSHDPid(host)
	var stray []int
	for _, pid := range pids {
		if pid == daemon || isSSHDSession(pid, daemon) {
			continue
		}
		stray = append(stray, pid)
	}
	return stray, nil
}

// isSSHDSession reports whether pid is an sshd process serving a
// connection: a descendant of the daemon whose command is sshd itself.
// Processes a session started are not sessions, so they stay visible.
func isSSHDSession(pid, daemon int) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "sshd" {
		return false
	}
	for p, depth := pid, 0; p > 1 && depth < 8; depth++ {
		pp, err := ppid(p)
		if err != nil {
			return false
		}
		if pp == daemon {
			return true
		}
		p = pp
	}
	return false
}

func ppid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command may hold spaces and parentheses; fields resume after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("testhosts: bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("testhosts: bad /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}

// WriteHostfile writes a hostfile naming every host with the given slots
// into dir and returns its path.
func (h *Netns) WriteHostfile(dir string, slots int) (string, error) {
	var b strings.Builder
	for _, host := range h.Hosts {
		fmt.Fprintf(&b, "%s slots=%d\n", host, slots)
	}
	path := filepath.Join(dir, "hostfile-"+h.Set)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("testhosts: %w", err)
	}
	return path, nil
}

func (h *Netns) ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("testhosts: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (h *Netns) tc(args ...string) error {
	if _, err := exec.LookPath("tc"); err != nil {
		return fmt.Errorf("testhosts: tc not found (Debian package iproute2): %w", err)
	}
	if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("testhosts: tc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// exitDetail adds a command's stderr, when captured, to its error.
func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}
