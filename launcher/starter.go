package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/tailbuf"
	"github.com/gorun-hpc/gorun/launcher/hostagent"
	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/privdir"
	"github.com/gorun-hpc/gorun/launcher/sshkex"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Starters: the processes that start host agents. One word for one thing:
// the per-job *supervisor* (package launcher/supervisor) is the parent of a
// host's ranks; the *host agent* (package launcher/hostagent, `gorun
// agent`) relays between gorun and its host's supervisor; a *starter* is
// the command that brings a
// host agent up — ssh to one host (Config.StarterCommand, ssh by default), a
// plain exec for this machine, or one srun for every host of a SLURM
// allocation. Above Config.FanoutThreshold hosts, host agents run further
// starters themselves (a tree); gorun then keeps a stand-in starter for each
// such host, ended by its parent's report.

// Starter says how host agents are started.
type Starter string

const (
	// StartSSH runs the agent command through Config.StarterCommand (ssh by
	// default) on every host that is not this machine, and directly here.
	StartSSH Starter = "ssh"
	// StartSrun starts every agent, this machine's included, with one
	// `srun --ntasks-per-node=1 --kill-on-bad-exit` inside the current
	// SLURM allocation, so SLURM tracks and signals them.
	StartSrun Starter = "srun"
)

// starter is one process that starts host agents: ssh to one host,
// an exec of this machine's agent, or srun for all of them.
type starter struct {
	nodes  []int
	what   string    // "ssh", "exec", "srun": for messages
	cmd    *exec.Cmd // nil when another host's agent runs it (tree)
	stderr *tailbuf.Buffer
	done   chan struct{} // closed once cmd was reaped
	err    error         // cmd.Wait's result, valid after done
	code   int           // exit code, -1 unknown; valid after done
}

// DefaultFanoutThreshold is the number of remote hosts above which gorun
// starts agents as a tree: it runs ssh to √N hosts itself and each of their
// agents starts its share of the rest, so one machine never carries
// hundreds of concurrent ssh handshakes.
const DefaultFanoutThreshold = 32

// startStarters starts the processes that start the agents.
func (m *hostAgents) startStarters(id LocalIdentity) error {
	if m.cfg.Starter == StartSrun {
		var names []string
		var nodes []int
		for i, n := range m.nodes {
			names = append(names, n.Name)
			nodes = append(nodes, i)
		}
		n := fmt.Sprint(len(names))
		argv := append([]string{"srun", "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1",
			"--kill-on-bad-exit=1", "--cpu-bind=none", "--mpi=none", "--whole", "--input=none",
			"--nodelist=" + strings.Join(names, ",")}, m.agentArgs("")...)
		return m.startStarter("srun", nodes, argv, []string{hostagent.SecretEnv + "=" + m.secret}, false)
	}
	var remote []int
	for i, n := range m.nodes {
		if id.IsLocal(n.Name) {
			if err := m.startStarter("exec", []int{i}, m.agentArgs(n.Name), nil, true); err != nil {
				return err
			}
			continue
		}
		remote = append(remote, i)
	}
	direct := remote
	threshold := m.cfg.FanoutThreshold
	if threshold == 0 {
		threshold = DefaultFanoutThreshold
	}
	if threshold > 0 && len(remote) > threshold && m.use == useJob {
		// √N parents, each launching a contiguous share of the rest: two
		// levels of ≈√N concurrent handshakes instead of one level of N.
		width := 1
		for width*width < len(remote) {
			width++
		}
		direct = remote[:width]
		rest := remote[width:]
		m.children = map[int][]wire.ChildLaunch{}
		m.viaParent = map[string]*starter{}
		per := (len(rest) + width - 1) / width
		for k, child := range rest {
			parent := direct[k/per]
			name := m.nodes[child].Name
			m.children[parent] = append(m.children[parent], wire.ChildLaunch{
				Host: name, Argv: sshCommand(m.cfg.StarterCommand, name, m.agentArgs(name)),
				FastKex: !m.cfg.SSHDefaultKex,
			})
			l := &starter{nodes: []int{child}, what: "ssh (from " + m.nodes[parent].Name + ")",
				stderr: &tailbuf.Buffer{}, done: make(chan struct{}), code: -1}
			m.viaParent[name] = l
			m.starters = append(m.starters, l)
		}
		m.cfg.Logger.Info().Int("direct", len(direct)).Int("through_agents", len(rest)).Msg("starting agents as a tree")
	}
	template := m.cfg.StarterCommand
	if m.cfg.SSHMultiplex > 0 && (len(template) == 0 || filepath.Base(template[0]) == "ssh") {
		template = m.multiplexed(template)
	}
	for _, i := range direct {
		n := m.nodes[i]
		argv := sshCommand(template, n.Name, m.agentArgs(n.Name))
		if !m.cfg.SSHDefaultKex {
			argv = sshkex.Fast(argv)
		}
		if err := m.startStarter("ssh", []int{i}, argv, nil, true); err != nil {
			return err
		}
	}
	return nil
}

// multiplexed adds OpenSSH connection sharing to an ssh template: the first
// job to a host leaves a master connection for SSHMultiplex, and later jobs
// open sessions over it without a new handshake (as Ansible does by
// default). The sockets live in a directory only this user can enter
// (launcher/privdir).
func (m *hostAgents) multiplexed(template []string) []string {
	if len(template) == 0 {
		template = []string{"ssh"}
	}
	// A master socket planted by someone else would receive the agent's
	// stdin, the job secret: only a directory private to this user will do.
	dir, err := privdir.UserState("ssh")
	if err != nil {
		m.cfg.Logger.Warn().Err(err).Msg("ssh multiplexing off: no private socket directory")
		return template
	}
	secs := int(m.cfg.SSHMultiplex.Round(time.Second) / time.Second)
	out := append([]string{template[0], "-o", "ControlMaster=auto", "-o", "ControlPath=" + filepath.Join(dir, "%C"),
		"-o", "ControlPersist=" + strconv.Itoa(max(secs, 1))}, template[1:]...)
	return out
}

func (m *hostAgents) startStarter(what string, nodes []int, argv, env []string, secretOnStdin bool) error {
	l := &starter{nodes: nodes, what: what, stderr: &tailbuf.Buffer{}, done: make(chan struct{}), code: -1}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = l.stderr
	cmd.Stdout = l.stderr
	// Its own process group: Ctrl-C is gorun's to handle, and the job's
	// end, not the terminal's signal, ends the agents.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stdin io.WriteCloser
	if secretOnStdin {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			return err
		}
	}
	// A multiplexing ssh leaves its master in the background holding the
	// output pipe; Wait must not wait for that pipe's EOF.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		host := m.nodes[nodes[0]].Name
		return &outcome.HostError{Host: host, Op: "start agent with " + what, Err: err}
	}
	if stdin != nil {
		_, _ = io.WriteString(stdin, m.secret+"\n")
		stdin.Close()
	}
	l.cmd = cmd
	go func() {
		l.err = cmd.Wait()
		l.code = cmd.ProcessState.ExitCode()
		close(l.done)
	}()
	m.starters = append(m.starters, l)
	return nil
}

// starterError explains a launcher that exited before node's agent said
// hello, from its exit code and what it printed.
func (m *hostAgents) starterError(l *starter, node int) error {
	host := m.nodes[node].Name
	code := l.code
	tail := l.stderr.Tail()
	last := lastLine(tail)
	he := &outcome.HostError{Host: host, Op: "start agent with " + l.what}
	switch {
	case strings.HasPrefix(l.what, "ssh") && code == 255:
		he.Op = "ssh"
		he.Err = errors.New(strings.TrimPrefix(orDefault(last, "ssh failed (exit code 255)"), "ssh: "))
		return he
	case code == 127 || strings.Contains(tail, "No such file or directory") && strings.Contains(tail, m.gorunAt):
		he.Err = fmt.Errorf("gorun not found at %s on that host (install it there, or name its path with --agent-path)", m.gorunAt)
	case strings.Contains(tail, `"agent" is not available`) || strings.Contains(tail, "flag provided but not defined"):
		return &outcome.VersionError{Host: host, Remote: "without agent mode (older)", Local: m.cfg.Version}
	case code >= 0:
		he.Err = fmt.Errorf("exited with code %d before its agent connected", code)
	default:
		he.Err = fmt.Errorf("exited before its agent connected: %v", l.err)
	}
	he.Detail = last
	if hint := m.claimHint(host); hint != "" {
		he.Detail = strings.TrimSpace(last + "\n" + hint)
	}
	return he
}

// reapStarters waits up to d for every launcher, then kills the rest.
func (m *hostAgents) reapStarters(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, l := range m.starters {
		if l.cmd == nil {
			continue // run by a parent agent
		}
		select {
		case <-l.done:
		case <-t.C:
		}
	}
	for _, l := range m.starters {
		if l.cmd == nil {
			continue
		}
		select {
		case <-l.done:
		default:
			_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
			<-l.done
		}
	}
}

// sshCommand builds the command that runs args on host through the agent
// launcher template: {host} in the template is replaced by the host name,
// otherwise the host is appended (ssh's order: options, host, command).
// For ssh, BatchMode=yes keeps a password prompt from hanging the launch
// and the arguments are quoted for the remote shell.
func sshCommand(template []string, host string, args []string) []string {
	if len(template) == 0 {
		template = []string{"ssh"}
	}
	isSSH := filepath.Base(template[0]) == "ssh"
	out := []string{template[0]}
	if isSSH {
		out = append(out, "-o", "BatchMode=yes", "-T")
	}
	substituted := false
	for _, t := range template[1:] {
		if strings.Contains(t, "{host}") {
			substituted = true
			t = strings.ReplaceAll(t, "{host}", host)
		}
		out = append(out, t)
	}
	if !substituted {
		out = append(out, host)
	}
	for _, a := range args {
		if isSSH {
			a = shellQuote(a)
		}
		out = append(out, a)
	}
	return out
}

// shellQuote quotes s for a POSIX shell when it holds anything but safe
// characters.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@+%[]", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
