package launcher

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/connlimit"
	"github.com/gorun-hpc/gorun/netif"
	"github.com/gorun-hpc/gorun/rankenv"
)

// Multi-host runs: gorun listens on the interface that routes to the hosts,
// starts one host agent per host (hostagent.go) through the agent launcher
// (ssh by default, srun inside a SLURM allocation, a plain exec for this
// machine), and waits until every agent connected, authenticated and said
// hello. Only then does it plan — rank 0's host supplies MASTER_ADDR and the
// free ports, every host its interface — and send each agent its ranks.
// Any host failing before that ends the launch with an error naming it, and
// no rank has started anywhere.
//
// From there the job runs through the same loop as a single-host job: the
// agents' events arrive on one channel, commands go to every agent, and a
// host whose connection drops or falls silent for the lease is "lost": its
// ranks count as failed and the job ends.

// Starter says how host agents are started.
type Starter string

const (
	// StartSSH runs the agent command through Config.LaunchAgent (ssh by
	// default) on every host that is not this machine, and directly here.
	StartSSH Starter = "ssh"
	// StartSrun starts every agent, this machine's included, with one
	// `srun --ntasks-per-node=1 --kill-on-bad-exit` inside the current
	// SLURM allocation, so SLURM tracks and signals them.
	StartSrun Starter = "srun"
)

// DefaultLaunchTimeout bounds how long gorun waits for every agent to
// connect: ssh handshakes take seconds on a loaded machine, and a host that
// has not answered after a minute is not coming.
const DefaultLaunchTimeout = 60 * time.Second

// isMulti reports whether the job needs host agents.
func isMulti(cfg Config, hosts []Host, id LocalIdentity) bool {
	if cfg.Starter == StartSrun {
		return true
	}
	return RequireLocal(hosts, id) != nil
}

// agentLauncher is one process that starts host agents: ssh to one host,
// an exec of this machine's agent, or srun for all of them.
type agentLauncher struct {
	nodes  []int
	what   string    // "ssh", "exec", "srun": for messages
	cmd    *exec.Cmd // nil when another host's agent runs it (tree)
	stderr *tailBuffer
	done   chan struct{} // closed once cmd was reaped
	err    error         // cmd.Wait's result, valid after done
	code   int           // exit code, -1 unknown; valid after done
}

// hostConn is an authenticated agent connection.
type hostConn struct {
	node  int
	w     *wireConn
	hello remoteHello
}

// setupResult is one agent's outcome of the setup phase.
type setupResult struct {
	node int
	conn *hostConn
	err  error
}

type multi struct {
	cfg     Config
	jobID   string
	secret  string
	key     []byte
	nodes   []Node
	ln      net.Listener
	addr    netip.AddrPort
	choice  netif.Choice
	prog    Program
	gorunAt string

	launchers []*agentLauncher
	conns     []*hostConn // by node
	// doctor asks the agents for checks, not a job.
	doctor bool
	// children maps a node to the nodes its agent launches (tree
	// fan-out); viaParent maps such a child to its stand-in launcher.
	children  map[int][]childLaunch
	viaParent map[string]*agentLauncher

	// preload holds the files sent to every host before the ranks start.
	preload []*preloadSource

	// gate bounds the connections to ln still in their handshake.
	gate *connlimit.Gate
	// refusals counts unauthenticated connections refused (for logging).
	refusals atomic.Int64

	// mu guards authed and claims.
	mu sync.Mutex
	// authed is every connection that authenticated during setup, closed
	// when the launch is abandoned.
	authed []net.Conn
	// claims holds, per claimed host, the last unauthenticated connection
	// that claimed another protocol: only ever quoted in the error of a
	// host that failed on its own (an old gorun's agent cannot
	// authenticate with this one and looks like that).
	claims map[string]*HandshakeError
}

// agentHandshakeTimeout bounds an agent connection's greeting and proof.
const agentHandshakeTimeout = 10 * time.Second

// DefaultFanoutThreshold is the number of remote hosts above which gorun
// starts agents as a tree: it runs ssh to √N hosts itself and each of their
// agents starts its share of the rest, so one machine never carries
// hundreds of concurrent ssh handshakes.
const DefaultFanoutThreshold = 32

func launchMulti(ctx context.Context, cfg Config, job Job, id LocalIdentity) error {
	prog := Program{Path: job.Argv[0], Argv: job.Argv}
	if containsSlash(prog.Path) && !filepath.IsAbs(prog.Path) {
		dir := cfg.Dir
		if dir == "" {
			dir, _ = os.Getwd()
		}
		prog.Path = filepath.Join(dir, prog.Path)
	}
	jobID, secret, err := NewJobIdentity()
	if err != nil {
		return err
	}
	key, _ := hex.DecodeString(secret)
	// Placement does not depend on addresses or ports: plan once with
	// stand-ins to learn which hosts take ranks.
	pc := PlanConfig{
		NP: job.NP, Hosts: job.Hosts, Oversubscribe: job.Oversubscribe,
		GPUsPerHost: job.GPUsPerHost, Export: job.Export, JobID: jobID, Secret: secret,
		MasterAddr: "0.0.0.0", MasterPort: 1, RdzvPort: 2, NoPMI: cfg.PMI == PMINone,
	}
	pre, err := NewPlan(pc)
	if err != nil {
		return err
	}
	m := &multi{cfg: cfg, jobID: jobID, secret: secret, key: key, nodes: pre.Nodes, prog: prog}
	if cfg.PreloadBinary {
		local, err := ResolveProgram(job.Argv[0], cfg.Dir)
		if err != nil {
			return err
		}
		src, err := newPreloadSource(local, true)
		if err != nil {
			return err
		}
		m.preload = append(m.preload, src)
		prog.Path = local
		m.prog = prog
	}
	for _, f := range cfg.PreloadFiles {
		src, err := newPreloadSource(f, false)
		if err != nil {
			return err
		}
		m.preload = append(m.preload, src)
	}
	if err := m.listen(ctx, id); err != nil {
		return err
	}
	defer m.ln.Close()
	m.gorunAt = cfg.RemoteGorun
	if m.gorunAt == "" {
		if m.gorunAt, err = os.Executable(); err != nil {
			return fmt.Errorf("launcher: cannot find gorun's own path for remote agents: %w", err)
		}
	}
	cfg.Logger.Info().Str("iface", m.choice.Name).Str("addr", m.addr.String()).Str("why", m.choice.Why).
		Int("hosts", len(m.nodes)).Msg("gorun listens for host agents")

	if err := m.setup(ctx, id); err != nil {
		m.abort()
		return err
	}
	// Every host is ready: plan for real.
	h0 := m.conns[0].hello
	pc.MasterAddr, pc.MasterPort, pc.RdzvPort = h0.Addr, h0.MasterPort, h0.RdzvPort
	pc.Interfaces = map[string]string{}
	for i, c := range m.conns {
		pc.Interfaces[m.nodes[i].Name] = c.hello.Iface
		cfg.Logger.Info().Str("host", m.nodes[i].Name).Str("iface", c.hello.Iface).Str("addr", c.hello.Addr).
			Str("why", c.hello.Why).Msg("host interface")
	}
	plan, err := NewPlan(pc)
	if err != nil {
		m.abort()
		return err
	}
	cfg.Logger.Info().Str("job", plan.JobID).Int("world", plan.WorldSize).Int("nodes", len(plan.Nodes)).
		Str("master", joinHostPort(plan.MasterAddr, plan.MasterPort)).Str("rdzv", plan.RdzvEndpoint).
		Str("program", prog.Path).Msg("launching")
	return m.run(ctx, plan)
}

// listen opens gorun's listener on the address that routes to the hosts.
func (m *multi) listen(ctx context.Context, id LocalIdentity) error {
	var err error
	switch {
	case m.cfg.Iface != "":
		m.choice, err = netif.Override(m.cfg.Iface)
	default:
		m.choice, err = m.routeChoice(ctx, id)
	}
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(m.choice.Addr, 0).String())
	if err != nil {
		return fmt.Errorf("launcher: listen for host agents on %s: %w", m.choice.Addr, err)
	}
	m.ln = ln
	m.addr = netip.MustParseAddrPort(ln.Addr().String())
	// Agents are one per host and each connects once; PerSource stays at
	// its default so hosts behind one address (NAT, this machine's
	// namespaces) still fit.
	m.gate, err = connlimit.New(connlimit.Config{}, nil)
	return err
}

// routeChoice asks the kernel which interface reaches the first remote
// host; with no remote host (srun on this machine only) or no resolvable
// one, the interface with the default route.
func (m *multi) routeChoice(ctx context.Context, id LocalIdentity) (netif.Choice, error) {
	for _, n := range m.nodes {
		if id.IsLocal(n.Name) {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ips, err := net.DefaultResolver.LookupNetIP(lctx, "ip", n.Name)
		cancel()
		if err != nil || len(ips) == 0 {
			continue
		}
		if c, err := netif.Toward(ips[0].Unmap()); err == nil {
			return c, nil
		}
	}
	return netif.Default()
}

// agentArgs is the agent command line for one host ("" for srun, where
// each agent finds its own name).
func (m *multi) agentArgs(host string) []string {
	a := []string{m.gorunAt, "agent", "--connect", m.addr.String(), "--job", m.jobID}
	if host != "" {
		a = append(a, "--host", host)
	}
	return a
}

// setup starts the agents and waits for every hello.
func (m *multi) setup(ctx context.Context, id LocalIdentity) error {
	results := make(chan setupResult, len(m.nodes))
	index := map[string]int{}
	for i, n := range m.nodes {
		index[n.Name] = i
	}
	var acceptWG sync.WaitGroup
	acceptWG.Go(func() { m.acceptLoop(index, results) })
	var setupErr error
	defer func() {
		m.ln.Close()
		if setupErr == nil {
			// Tree parents stop reporting child launches and answer;
			// their setup readers end with the answer.
			for node := range m.children {
				_ = m.conns[node].w.send(wireMsg{T: "setup-over"})
			}
		} else {
			m.mu.Lock()
			for _, c := range m.authed {
				c.Close()
			}
			m.mu.Unlock()
		}
		acceptWG.Wait()
	}()

	if err := m.startLaunchers(id); err != nil {
		setupErr = err
		return err
	}
	m.conns = make([]*hostConn, len(m.nodes))
	up, started := 0, time.Now()
	progress := newProgress(m.cfg.Stderr, len(m.nodes))
	defer progress.end()
	timeout := m.cfg.LaunchTimeout
	if timeout <= 0 {
		timeout = DefaultLaunchTimeout
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// A launcher that exits before its hosts said hello failed them.
	launcherDone := make(chan *agentLauncher, len(m.launchers))
	setupDone := make(chan struct{})
	defer close(setupDone)
	for _, l := range m.launchers {
		go func() {
			select {
			case <-l.done:
				launcherDone <- l
			case <-setupDone:
			}
		}()
	}
	var firstErr error
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		} else {
			m.cfg.Logger.Error().Err(err).Msg("another host failed too")
		}
	}
	for up < len(m.nodes) && firstErr == nil {
		select {
		case r := <-results:
			if r.err != nil {
				fail(r.err)
				continue
			}
			if m.conns[r.node] != nil {
				r.conn.w.c.Close()
				fail(&HostError{Host: m.nodes[r.node].Name, Op: "connect agent", Err: errors.New("a second agent connected for this host")})
				continue
			}
			if err := m.checkHello(r.node, r.conn.hello); err != nil {
				r.conn.w.c.Close()
				fail(err)
				continue
			}
			m.conns[r.node] = r.conn
			up++
			progress.set(up)
		case l := <-launcherDone:
			for _, n := range l.nodes {
				if m.conns[n] == nil {
					fail(m.launcherError(l, n))
					break
				}
			}
		case <-deadline.C:
			for i, c := range m.conns {
				if c == nil {
					fail(&HostError{Host: m.nodes[i].Name, Op: "start agent",
						Err:    fmt.Errorf("its agent did not connect within %s", timeout),
						Detail: strings.TrimSpace(m.launcherOf(i).stderr.tail() + "\n" + m.claimHint(m.nodes[i].Name))})
					break
				}
			}
		case s := <-m.cfg.Signals:
			if sig, ok := s.(syscall.Signal); ok && stopping(sig) {
				fail(&InterruptedError{Signal: sig})
			}
		case <-ctx.Done():
			fail(fmt.Errorf("launcher: launch canceled: %w", ctx.Err()))
		}
	}
	if firstErr != nil {
		setupErr = firstErr
		return firstErr
	}
	m.cfg.Logger.Info().Int("hosts", up).Str("took", time.Since(started).Round(time.Millisecond).String()).Msg("hosts up")
	return nil
}

func (m *multi) checkHello(node int, h remoteHello) error {
	host := m.nodes[node].Name
	if h.Version != m.cfg.Version {
		return &VersionError{Host: host, Remote: h.Version, Local: m.cfg.Version}
	}
	if h.Err != "" {
		switch h.ErrKind {
		case "program":
			return &HostError{Host: host, Op: "check program", Err: &ProgramError{Program: m.prog.Path, Err: errors.New(h.Err)}}
		case "iface":
			return &HostError{Host: host, Op: "choose interface", Err: errors.New(h.Err)}
		}
		return &HostError{Host: host, Op: "prepare", Err: errors.New(h.Err)}
	}
	return nil
}

// acceptLoop authenticates agents until the listener closes. The gate
// bounds the connections in their handshake (a stranger holding thousands
// open costs gorun a bounded number of descriptors), and closing it when
// setup ends drops strangers still talking, so none of them delays the job.
func (m *multi) acceptLoop(index map[string]int, results chan<- setupResult) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer m.gate.Close()
	for {
		c, release, err := m.gate.Accept(m.ln)
		if err != nil {
			return
		}
		wg.Go(func() {
			// A real agent sends its greeting as soon as it connects, and
			// the whole handshake is three short lines.
			_ = c.SetDeadline(time.Now().Add(agentHandshakeTimeout))
			w, host, err := acceptAuth(c, m.key, m.jobID, func(h string) bool { _, ok := index[h]; return ok })
			release()
			if err != nil {
				c.Close()
				var ve *VersionError
				if i, ok := index[host]; ok && errors.As(err, &ve) {
					// Authenticated, so the host's own verdict.
					results <- setupResult{node: i, err: err}
					return
				}
				// A stranger or a wrong secret: logged and dropped, never
				// a host's failure. What it claimed is kept for the error
				// message of a host that fails on its own later.
				var he *HandshakeError
				if errors.As(err, &he) && he.ClaimHost != "" && he.ClaimProtocol != wireProtocol {
					m.mu.Lock()
					if m.claims == nil {
						m.claims = map[string]*HandshakeError{}
					}
					m.claims[he.ClaimHost] = he
					m.mu.Unlock()
				}
				// The first few at Warn; a flood would drown the job's
				// own output, so the rest at Debug.
				lvl := zerolog.DebugLevel
				if m.refusals.Add(1) <= 5 {
					lvl = zerolog.WarnLevel
				}
				m.cfg.Logger.WithLevel(lvl).Err(err).Msg("refused a connection to the host-agent port")
				return
			}
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			node := index[host]
			m.mu.Lock()
			m.authed = append(m.authed, c)
			m.mu.Unlock()
			lvl := int8(m.cfg.Logger.GetLevel())
			job := &remoteJob{
				Version: m.cfg.Version, Program: m.prog.Path, Argv: m.prog.Argv, Dir: m.rankDir(),
				Grace: m.cfg.Grace, Lease: m.lease(), LogLevel: lvl, Iface: m.cfg.Iface, Doctor: m.doctor,
				Launch: m.children[node],
			}
			for _, s := range m.preload {
				job.Preload = append(job.Preload, s.info)
			}
			job.Stdin = m.cfg.Stdin != nil
			job.NoPMI = m.cfg.PMI == PMINone
			if err := w.send(wireMsg{T: "job", Job: job}); err != nil {
				c.Close()
				results <- setupResult{node: node, err: &HostError{Host: host, Op: "talk to agent", Err: err}}
				return
			}
			hm, err := w.readMsg()
			if err != nil || hm.T != "hello" || hm.Hello == nil {
				c.Close()
				results <- setupResult{node: node, err: &HostError{Host: host, Op: "talk to agent", Err: fmt.Errorf("no hello: %v", err)}}
				return
			}
			if hm.Hello.Err == "" && len(hm.Hello.Need) > 0 {
				// Transfers may take long on a slow link; the progress of
				// frames is what counts, not a fixed deadline.
				_ = c.SetDeadline(time.Time{})
				m.cfg.Logger.Debug().Str("host", host).Int("files", len(hm.Hello.Need)).Msg("preloading")
				if err := sendPreloads(w, m.preload, hm.Hello.Need); err != nil {
					c.Close()
					results <- setupResult{node: node, err: &HostError{Host: host, Op: "preload", Err: err}}
					return
				}
			}
			_ = c.SetDeadline(time.Time{})
			results <- setupResult{node: node, conn: &hostConn{node: node, w: w, hello: *hm.Hello}}
			if len(m.children[node]) > 0 && hm.Hello.Err == "" {
				m.readChildExits(w)
			}
		})
	}
}

// readChildExits reads a tree parent's reports of child launches that
// ended, until gorun's "setup-over" is acknowledged or the connection
// closes. A child's stand-in launcher then ends as its ssh did.
func (m *multi) readChildExits(w *wireConn) {
	for {
		msg, err := w.readMsg()
		if err != nil || msg.T == "setup-over-ack" {
			return
		}
		if msg.T != "child-exit" || msg.Child == nil {
			continue
		}
		l := m.viaParent[msg.Child.Host]
		if l == nil {
			continue
		}
		select {
		case <-l.done:
		default:
			l.code = msg.Child.Code
			_, _ = l.stderr.Write([]byte(msg.Child.Tail))
			l.err = fmt.Errorf("exit code %d", msg.Child.Code)
			close(l.done)
		}
	}
}

func (m *multi) rankDir() string {
	if m.cfg.Dir != "" {
		if abs, err := filepath.Abs(m.cfg.Dir); err == nil {
			return abs
		}
	}
	wd, _ := os.Getwd()
	return wd
}

func (m *multi) lease() time.Duration {
	if m.cfg.Lease > 0 {
		return m.cfg.Lease
	}
	return DefaultLease
}

func (m *multi) launcherOf(node int) *agentLauncher {
	for _, l := range m.launchers {
		for _, n := range l.nodes {
			if n == node {
				return l
			}
		}
	}
	return &agentLauncher{stderr: &tailBuffer{}}
}

// startLaunchers starts the processes that start the agents.
func (m *multi) startLaunchers(id LocalIdentity) error {
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
		return m.startLauncher("srun", nodes, argv, []string{agentSecretEnv + "=" + m.secret}, false)
	}
	var remote []int
	for i, n := range m.nodes {
		if id.IsLocal(n.Name) {
			if err := m.startLauncher("exec", []int{i}, m.agentArgs(n.Name), nil, true); err != nil {
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
	if threshold > 0 && len(remote) > threshold && !m.doctor {
		// √N parents, each launching a contiguous share of the rest: two
		// levels of ≈√N concurrent handshakes instead of one level of N.
		width := 1
		for width*width < len(remote) {
			width++
		}
		direct = remote[:width]
		rest := remote[width:]
		m.children = map[int][]childLaunch{}
		m.viaParent = map[string]*agentLauncher{}
		per := (len(rest) + width - 1) / width
		for k, child := range rest {
			parent := direct[k/per]
			name := m.nodes[child].Name
			m.children[parent] = append(m.children[parent], childLaunch{
				Host: name, Argv: sshCommand(m.cfg.LaunchAgent, name, m.agentArgs(name)),
				FastKex: !m.cfg.SSHDefaultKex,
			})
			l := &agentLauncher{nodes: []int{child}, what: "ssh (from " + m.nodes[parent].Name + ")",
				stderr: &tailBuffer{}, done: make(chan struct{}), code: -1}
			m.viaParent[name] = l
			m.launchers = append(m.launchers, l)
		}
		m.cfg.Logger.Info().Int("direct", len(direct)).Int("through_agents", len(rest)).Msg("starting agents as a tree")
	}
	template := m.cfg.LaunchAgent
	if m.cfg.SSHMultiplex > 0 && (len(template) == 0 || filepath.Base(template[0]) == "ssh") {
		template = m.multiplexed(template)
	}
	for _, i := range direct {
		n := m.nodes[i]
		argv := sshCommand(template, n.Name, m.agentArgs(n.Name))
		if !m.cfg.SSHDefaultKex {
			argv = withFastKex(argv)
		}
		if err := m.startLauncher("ssh", []int{i}, argv, nil, true); err != nil {
			return err
		}
	}
	return nil
}

// multiplexed adds OpenSSH connection sharing to an ssh template: the first
// job to a host leaves a master connection for SSHMultiplex, and later jobs
// open sessions over it without a new handshake (as Ansible does by
// default). The sockets live in a directory only this user can enter
// (private.go).
func (m *multi) multiplexed(template []string) []string {
	if len(template) == 0 {
		template = []string{"ssh"}
	}
	// A master socket planted by someone else would receive the agent's
	// stdin, the job secret: only a directory private to this user will do.
	dir, err := userStateDir("ssh")
	if err != nil {
		m.cfg.Logger.Warn().Err(err).Msg("ssh multiplexing off: no private socket directory")
		return template
	}
	secs := int(m.cfg.SSHMultiplex.Round(time.Second) / time.Second)
	out := append([]string{template[0], "-o", "ControlMaster=auto", "-o", "ControlPath=" + filepath.Join(dir, "%C"),
		"-o", "ControlPersist=" + strconv.Itoa(max(secs, 1))}, template[1:]...)
	return out
}

func (m *multi) startLauncher(what string, nodes []int, argv, env []string, secretOnStdin bool) error {
	l := &agentLauncher{nodes: nodes, what: what, stderr: &tailBuffer{}, done: make(chan struct{}), code: -1}
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
		return &HostError{Host: host, Op: "start agent with " + what, Err: err}
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
	m.launchers = append(m.launchers, l)
	return nil
}

// launcherError explains a launcher that exited before node's agent said
// hello, from its exit code and what it printed.
func (m *multi) launcherError(l *agentLauncher, node int) error {
	host := m.nodes[node].Name
	code := l.code
	tail := l.stderr.tail()
	last := lastLine(tail)
	he := &HostError{Host: host, Op: "start agent with " + l.what}
	switch {
	case strings.HasPrefix(l.what, "ssh") && code == 255:
		he.Op = "ssh"
		he.Err = errors.New(strings.TrimPrefix(orDefault(last, "ssh failed (exit code 255)"), "ssh: "))
		return he
	case code == 127 || strings.Contains(tail, "No such file or directory") && strings.Contains(tail, m.gorunAt):
		he.Err = fmt.Errorf("gorun not found at %s on that host (install it there, or name its path with --agent-path)", m.gorunAt)
	case strings.Contains(tail, `"agent" is not available`) || strings.Contains(tail, "flag provided but not defined"):
		return &VersionError{Host: host, Remote: "without agent mode (older)", Local: m.cfg.Version}
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

// claimHint quotes an unauthenticated connection that claimed to be host's
// agent with another protocol, for the error of a host that failed.
func (m *multi) claimHint(host string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if he := m.claims[host]; he != nil {
		return fmt.Sprintf("an unauthenticated connection from %s claimed to be its agent speaking protocol %s (this gorun speaks %s); "+
			"if that was the agent, install the same gorun version on every host", he.Remote, he.ClaimProtocol, wireProtocol)
	}
	return ""
}

// abort ends a launch that failed before any rank started: agents that
// connected see the connection close and exit; launchers get a moment,
// then SIGKILL.
func (m *multi) abort() {
	for _, c := range m.conns {
		if c != nil {
			c.w.c.Close()
		}
	}
	m.mu.Lock()
	for _, c := range m.authed {
		c.Close()
	}
	m.mu.Unlock()
	m.reapLaunchers(2 * time.Second)
}

// reapLaunchers waits up to d for every launcher, then kills the rest.
func (m *multi) reapLaunchers(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, l := range m.launchers {
		if l.cmd == nil {
			continue // run by a parent agent
		}
		select {
		case <-l.done:
		case <-t.C:
		}
	}
	for _, l := range m.launchers {
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

// run executes the plan over the connected agents.
func (m *multi) run(ctx context.Context, plan *Plan) error {
	r := &runner{cfg: m.cfg, plan: plan, log: m.cfg.Logger, agentsLeft: len(m.nodes), fences: pmiFences{hosts: len(m.conns)}}
	defer r.closeAll()
	pj, err := pmiJobFor(plan, m.cfg.PMI)
	if err != nil {
		m.abort()
		return err
	}
	if err := r.prepareOutput(); err != nil {
		m.abort()
		return err
	}
	var now func() time.Time
	if m.cfg.TimestampOutput {
		now = time.Now
	}
	tag := m.cfg.TagOutput || m.cfg.OutputDir != ""
	// One pipe per rank stream: the connection reader writes, a streamer
	// makes lines.
	type sink struct{ out, err *io.PipeWriter }
	sinks := make([]sink, len(plan.Ranks))
	for i, rs := range plan.Ranks {
		for k, term := range []*lineSink{r.stdout, r.stderr} {
			pr, pw := io.Pipe()
			st := &streamer{rank: rs.Rank, host: rs.Host, r: pr, term: term, tag: tag, now: now}
			if r.logFiles != nil {
				st.file = r.logFiles[i]
			}
			r.streams = append(r.streams, st)
			if k == 0 {
				sinks[i].out = pw
			} else {
				sinks[i].err = pw
			}
		}
	}
	r.events = make(chan agentEvent, 4*len(plan.Ranks)+4*len(m.nodes)+4)
	quit := make(chan struct{})
	lease := m.lease()
	for _, c := range m.conns {
		c.w.writeTimeout = lease
	}
	r.sendCmd = func(cmd agentCmd) {
		for _, c := range m.conns {
			// A lost host's write fails; its agent is ending on its own.
			_ = c.w.send(wireMsg{T: "cmd", Cmd: &cmd})
		}
	}
	r.killGroup = func(int) {}
	r.startStreams()

	var connWG sync.WaitGroup
	for _, c := range m.conns {
		n := plan.Nodes[c.node]
		connWG.Go(func() { pinger(c.w, lease/4, quit) })
		connWG.Go(func() {
			defer func() {
				for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
					sinks[rk].out.Close()
					sinks[rk].err.Close()
				}
			}()
			err := m.readHost(c, n, lease, r.events, quit, func(rank int, stream byte, data []byte) {
				s := sinks[rank].out
				if stream == 2 {
					s = sinks[rank].err
				}
				_, _ = s.Write(data)
			})
			if err != nil {
				ev := agentEvent{Ev: "lost", Rank: n.FirstRank, Err: err.Error(), node: c.node}
				select {
				case r.events <- ev:
				case <-quit:
				}
				// Its launcher (an ssh on a cut link) would linger.
				if l := m.launcherOf(c.node); l.cmd != nil && l.what != "srun" {
					_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
				}
			}
		})
	}
	for _, c := range m.conns {
		n := plan.Nodes[c.node]
		var ranks []remoteRank
		for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
			ranks = append(ranks, remoteRank{Rank: rk, Env: withoutSecret(plan.Ranks[rk].Env)})
		}
		if err := c.w.send(wireMsg{T: "spec", Ranks: ranks, PMI: pj}); err != nil {
			r.log.Debug().Err(err).Str("host", n.Name).Msg("sending the spec failed")
		}
	}
	stdinDone := m.forwardStdin(m.conns[0].w, quit)
	err = r.loop(ctx)
	close(quit)
	stdinDone()
	for _, c := range m.conns {
		c.w.c.Close()
	}
	connWG.Wait()
	r.wg.Wait()
	m.reapLaunchers(m.cfg.Grace + 2*time.Second)
	return err
}

// withoutSecret drops the job secret from a rank's environment before it
// crosses the agent connection, which is authenticated but not encrypted:
// the agent holds the secret already (it proved so) and puts it back
// (specWithSecret), so a reader of the network never sees it.
func withoutSecret(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, rankenv.Secret+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// forwardStdin copies gorun's stdin to rank 0's agent as stdin frames
// until EOF (then an empty frame) or quit. The returned function stops the
// copy and waits for it. A source that cannot be interrupted (a socket,
// say) is not forwarded: rank 0 gets /dev/null, as Run's own copy would
// block its end.
func (m *multi) forwardStdin(w *wireConn, quit <-chan struct{}) func() {
	src := m.cfg.Stdin
	if src == nil {
		return func() {}
	}
	if f, ok := src.(*os.File); ok {
		// A separate open file description in non-blocking mode makes the
		// read cancellable without touching the shell's own terminal.
		nf, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			m.cfg.Logger.Debug().Err(err).Msg("stdin cannot be forwarded to rank 0")
			_ = w.writeFrame(frameStdin)
			return func() {}
		}
		src = nf
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if w.writeFrame(frameStdin, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = w.writeFrame(frameStdin)
				}
				return
			}
			select {
			case <-quit:
				return
			default:
			}
		}
	})
	return func() {
		if d, ok := src.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = d.SetReadDeadline(time.Unix(1, 0))
		}
		wg.Wait()
		if c, ok := src.(io.Closer); ok && src != m.cfg.Stdin {
			c.Close()
		}
	}
}

// readHost reads one agent's frames until it reported "done" and hung up
// (nil) or the connection failed or fell silent (the error says which).
func (m *multi) readHost(c *hostConn, n Node, lease time.Duration, events chan<- agentEvent, quit <-chan struct{},
	output func(rank int, stream byte, data []byte)) error {
	var buf []byte
	doneSeen := false
	for {
		_ = c.w.c.SetReadDeadline(time.Now().Add(lease))
		typ, p, err := c.w.readFrame(buf)
		if err != nil {
			if doneSeen {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("no word from its agent for %s (network link down, or host hung)", lease)
			}
			select {
			case <-quit:
				return nil
			default:
			}
			return fmt.Errorf("the connection to its agent closed (agent killed, or host rebooted): %v", err)
		}
		buf = p[:0]
		switch typ {
		case frameOutput:
			if len(p) < 5 {
				continue
			}
			rank := int(uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3]))
			if rank < n.FirstRank || rank >= n.FirstRank+n.Ranks {
				continue
			}
			output(rank, p[4], p[5:])
		case frameMsg:
			var msg wireMsg
			if err := json.Unmarshal(p, &msg); err != nil || msg.T != "event" || msg.Event == nil {
				continue
			}
			ev := *msg.Event
			if ev.Ev != "done" && (ev.Rank < n.FirstRank || ev.Rank >= n.FirstRank+n.Ranks) {
				continue
			}
			ev.node = c.node
			if ev.Ev == "done" {
				doneSeen = true
			}
			select {
			case events <- ev:
			case <-quit:
				return nil
			}
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

// tailBuffer keeps the last 4 KiB written to it: a launcher's stderr, for
// error messages. Safe for concurrent use.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = append(t.b[:0:0], t.b[len(t.b)-4096:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
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

// progress shows "hosts up 37/64" on a terminal, rewritten in place.
type progress struct {
	w     io.Writer
	total int
	on    bool
}

func newProgress(w io.Writer, total int) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, total: total, on: ok && isTerminal(f) && total > 1}
}

func (p *progress) set(up int) {
	if p.on {
		fmt.Fprintf(p.w, "\rgorun: hosts up %d/%d", up, p.total)
	}
}

func (p *progress) end() {
	if p.on {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
