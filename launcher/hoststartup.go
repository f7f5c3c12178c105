package launcher

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/connlimit"
	"github.com/gorun-hpc/gorun/internal/tailbuf"
	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/preload"
	"github.com/gorun-hpc/gorun/launcher/program"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/netif"
)

// Host start-up, shared by multi-host jobs and `gorun doctor`: gorun
// listens on the interface that routes to the hosts (listen), starts one
// host agent per host through the starters (starter.go), authenticates
// every agent that connects with the job secret (acceptLoop, package launcher/wire),
// sends it the job, reads its hello — version, interface, ports, program
// present — and sends the preloaded files it lacks. startHosts hands each
// host's outcome to the caller's verdict: a job stops at the first failure
// (jobVerdict), doctor records every one.

// DefaultLaunchTimeout bounds how long gorun waits for every agent to
// connect: ssh handshakes take seconds on a loaded machine, and a host that
// has not answered after a minute is not coming.
const DefaultLaunchTimeout = 60 * time.Second

// DefaultLease is how long gorun and a host agent tolerate silence from
// each other before the agent kills its ranks and gorun counts them as
// failed (wire.Job.Lease carries it to the agent); pings go every quarter
// of it. gorun holds a local job's supervisor to it too. Long enough for a
// loaded machine's scheduling hiccups, short enough that a cut link ends
// the job within seconds.
const DefaultLease = 4 * time.Second

// hostConn is an authenticated agent connection.
type hostConn struct {
	node int
	// agent is the node whose host's agent this is: node until a
	// fault-tolerant job's spare host takes a lost node's place (then
	// node is that node's), for what concerns the host itself (its
	// starter).
	agent int
	w     *wire.Conn
	hello wire.Hello
}

// setupResult is one agent's outcome of the setup phase.
type setupResult struct {
	node int
	conn *hostConn
	err  error
}

type hostAgents struct {
	cfg     Config
	jobID   string
	secret  string
	key     []byte
	nodes   []plan.Node
	ln      net.Listener
	addr    netip.AddrPort
	choice  netif.Choice
	prog    Program
	gorunAt string

	starters []*starter
	conns    []*hostConn // by node
	// use says what the agents are started for (a job or doctor's checks).
	use hostsUse
	// children maps a node to the nodes its agent launches (tree
	// fan-out); viaParent maps such a child to its stand-in launcher.
	children  map[int][]wire.ChildLaunch
	viaParent map[string]*starter

	// preload holds the files sent to every host before the ranks start.
	preload []*preload.Source

	// gate bounds the connections to ln still in their handshake.
	gate *connlimit.Gate
	// refusals counts unauthenticated connections refused (for logging).
	refusals atomic.Int64

	// mu guards authed and claims.
	mu sync.Mutex
	// authed is every connection that authenticated during setup, closed
	// when the launch is abandoned.
	authed []net.Conn
	// running marks the authenticated connections whose host already
	// runs its ranks (hostsRun.launch): a failed start-up leaves them
	// open, so that the job's teardown can stop those ranks and wait for
	// them before the connections close.
	running map[net.Conn]bool
	// claims holds, per claimed host, the last unauthenticated connection
	// that claimed another protocol: only ever quoted in the error of a
	// host that failed on its own (an old gorun's agent cannot
	// authenticate with this one and looks like that).
	claims map[string]*wire.HandshakeError
}

// agentPortBounds bound the connections to the host-agent port that have
// not proved the job secret yet. Anyone on a job host shares the address
// the agent connects from and can read the port from ps, so a bound that
// refuses newcomers (per source) or leaves them in the backlog (in all) is
// a bound an outsider can spend to keep the agent out. Instead a full gate
// evicts the oldest unproven connection: an agent proves itself within a
// round trip of connecting, so what gives way is what the outsider holds
// open, and the agent is evicted only if over a thousand connections
// arrive during its own handshake, in which case it reconnects
// (launcher/hostagent's connectAuth). No per-source bound: the job's hosts may share one
// address (NAT, namespaces on one machine), and the bound in all keeps
// gorun's descriptors and memory bounded (about 12 MiB at 1024).
var agentPortBounds = connlimit.Config{Max: 1024, PerSource: 1024, Evict: true}

// agentHandshakeTimeout bounds an agent connection's greeting and proof.
const agentHandshakeTimeout = 10 * time.Second

// newHostAgents makes the job identity (id and secret) of a start-up over
// nodes.
func newHostAgents(cfg Config, nodes []plan.Node) (*hostAgents, error) {
	jobID, secret, err := NewJobIdentity()
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(secret)
	if err != nil {
		return nil, err
	}
	return &hostAgents{cfg: cfg, jobID: jobID, secret: secret, key: key, nodes: nodes}, nil
}

// open listens for the host agents and finds the gorun path their command
// line names. The caller closes m.ln.
func (m *hostAgents) open(ctx context.Context, id LocalIdentity) error {
	if err := m.listen(ctx, id); err != nil {
		return err
	}
	m.gorunAt = m.cfg.RemoteGorun
	if m.gorunAt == "" {
		var err error
		if m.gorunAt, err = os.Executable(); err != nil {
			m.ln.Close()
			return fmt.Errorf("launcher: cannot find gorun's own path for remote agents: %w", err)
		}
	}
	return nil
}

// listen opens gorun's listener on the address that routes to the hosts.
func (m *hostAgents) listen(ctx context.Context, id LocalIdentity) error {
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
	m.gate, err = connlimit.New(agentPortBounds, nil)
	return err
}

// routeChoice asks the kernel which interface reaches the first remote
// host that resolves; with no remote host (srun on this machine only) or
// none resolving in time, the interface with the default route (the
// starters then name the hosts that cannot be reached).
func (m *hostAgents) routeChoice(ctx context.Context, id LocalIdentity) (netif.Choice, error) {
	var names []string
	for _, n := range m.nodes {
		if !id.IsLocal(n.Name) {
			names = append(names, n.Name)
		}
	}
	lookup := func(ctx context.Context, name string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", name)
	}
	if ip, ok := resolveFirst(ctx, names, lookup, resolveConfig{}); ok {
		if c, err := netif.Toward(ip.Unmap()); err == nil {
			return c, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return netif.Choice{}, fmt.Errorf("launcher: launch canceled: %w", err)
	}
	return netif.Default()
}

// resolveConfig bounds resolveFirst; zero fields take the defaults.
type resolveConfig struct {
	// Workers is how many lookups run at once (default 16): a list of
	// thousands of names, each waiting for a resolver's timeout, must not
	// take thousands of timeouts.
	Workers int
	// Deadline bounds the whole search (default 10 s).
	Deadline time.Duration
	// Candidates is how many names, from the first, are tried at most
	// (default 256): if that many do not resolve, more will not either.
	Candidates int
}

// resolveFirst looks names up in parallel and returns an address of the
// first name, in list order, that resolves: the earliest name that resolved
// once every name before it failed (at the deadline, the earliest that
// resolved by then). It returns as soon as that is decided, at the deadline
// or when ctx ends, and every lookup has stopped when it returns.
func resolveFirst(ctx context.Context, names []string, lookup func(context.Context, string) ([]netip.Addr, error), cfg resolveConfig) (netip.Addr, bool) {
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 10 * time.Second
	}
	if cfg.Candidates <= 0 {
		cfg.Candidates = 256
	}
	names = names[:min(len(names), cfg.Candidates)]
	if len(names) == 0 {
		return netip.Addr{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Deadline)
	defer cancel()
	type answer struct {
		i  int
		ip netip.Addr
		ok bool
	}
	answers := make(chan answer, len(names))
	next := make(chan int, len(names))
	for i := range names {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, run first)
	defer cancel()
	for range min(cfg.Workers, len(names)) {
		wg.Go(func() {
			for i := range next {
				if ctx.Err() != nil {
					return
				}
				ips, err := lookup(ctx, names[i])
				a := answer{i: i, ok: err == nil && len(ips) > 0}
				if a.ok {
					a.ip = ips[0]
				}
				answers <- a
			}
		})
	}
	// decided[i]: 0 pending, 1 resolved, -1 failed. The answer is the
	// first resolved index with every earlier one failed.
	decided := make([]int8, len(names))
	ips := make([]netip.Addr, len(names))
	first := 0
	for {
		for first < len(names) && decided[first] < 0 {
			first++
		}
		if first == len(names) {
			return netip.Addr{}, false
		}
		if decided[first] > 0 {
			return ips[first], true
		}
		select {
		case a := <-answers:
			if a.ok {
				decided[a.i], ips[a.i] = 1, a.ip
			} else {
				decided[a.i] = -1
			}
		case <-ctx.Done():
			// Out of time: the earliest name that did resolve, if any.
			for i, d := range decided {
				if d > 0 {
					return ips[i], true
				}
			}
			return netip.Addr{}, false
		}
	}
}

// agentArgs is the agent command line for one host ("" for srun, where
// each agent finds its own name).
func (m *hostAgents) agentArgs(host string) []string {
	a := []string{m.gorunAt, "agent", "--connect", m.addr.String(), "--job", m.jobID}
	if host != "" {
		a = append(a, "--host", host)
	}
	return a
}

// hostVerdict is a caller's judgment of one host's outcome during
// start-up: conn is the authenticated connection with its hello, or nil
// and err says why the host failed. A non-nil answer ends start-up with
// that error (a job: the first failure ends the launch); nil accepts the
// outcome and waits for the others (a job: a good hello; doctor: anything,
// recorded for the report).
type hostVerdict func(node int, conn *hostConn, err error) error

// startHosts is host start-up, shared by jobs and doctor: it starts every
// host agent (through the starters), authenticates each connection, sends
// it the job and reads its hello, and hands every host's outcome to
// verdict exactly once — a hello, the starter exiting first, the launch
// timeout, or a second agent for one host. It returns when every host was
// judged, at the first error verdict returns, on a stopping signal or when
// ctx ends. Accepted connections are in m.conns. On success the tree
// parents are told that start-up is over; on failure every authenticated
// connection is closed, so the agents end, except those of hosts whose
// ranks the verdict already started (markRunning): their job stops them.
// The listener is closed either way.
func (m *hostAgents) startHosts(ctx context.Context, id LocalIdentity, verdict hostVerdict) (err error) {
	// One result per host fits without a reader, so a handshake goroutine
	// finishing after start-up ended (an agent a moment too late) does not
	// block the accept loop's wait below in the common case.
	results := make(chan setupResult, len(m.nodes))
	// index maps a host name to its node; it is read-only once built, so
	// the handshake goroutines share it without the mutex.
	index := map[string]int{}
	for i, n := range m.nodes {
		index[n.Name] = i
	}
	var acceptWG sync.WaitGroup
	acceptWG.Go(func() { m.acceptLoop(index, results) })
	defer func() {
		m.ln.Close()
		m.endStartup(err)
		acceptWG.Wait()
	}()

	m.conns = make([]*hostConn, len(m.nodes))
	if err := m.startStarters(id); err != nil {
		return err
	}
	s := m.newStartup(verdict)
	defer s.progress.end()
	deadline := time.NewTimer(s.timeout)
	defer deadline.Stop()
	starterDone, stopWatching := m.watchStarters()
	defer stopWatching()
	for s.pending > 0 {
		var err error
		select {
		case r := <-results:
			err = s.result(r)
		case l := <-starterDone:
			err = s.starterExited(l)
		case <-deadline.C:
			err = s.timedOut()
		case sig := <-m.cfg.Signals:
			if sig, ok := sig.(syscall.Signal); ok && supervisor.Stopping(sig) {
				err = &outcome.InterruptedError{Signal: sig}
			}
		case <-ctx.Done():
			err = fmt.Errorf("launcher: launch canceled: %w", ctx.Err())
		}
		if err != nil {
			return err
		}
	}
	m.cfg.Logger.Info().Int("hosts", s.up).Str("took", time.Since(s.started).Round(time.Millisecond).String()).Msg("hosts up")
	return nil
}

// endStartup ends start-up's hold on the agents' connections: after a
// start-up that succeeded (err nil) the tree parents stop reporting child
// launches and answer, and their start-up readers end with the answer;
// after one that failed, every authenticated connection is closed
// (closeAuthed).
func (m *hostAgents) endStartup(err error) {
	if err != nil {
		m.closeAuthed()
		return
	}
	for node := range m.children {
		_ = m.conns[node].w.Send(wire.Msg{T: "setup-over"})
	}
}

// watchStarters reports on done each starter that exits: one that exits
// before its hosts said hello failed them. Each starter has its own done
// channel and select takes a fixed set of cases, so one watcher per
// starter funnels them into done (buffered for all of them, so a watcher
// never blocks on a loop that has returned). stop releases the watchers
// whose starter is still running, as a healthy ssh runs for the whole
// job, and returns once every watcher has.
func (m *hostAgents) watchStarters() (done <-chan *starter, stop func()) {
	starterDone := make(chan *starter, len(m.starters))
	startupDone := make(chan struct{})
	var watchWG sync.WaitGroup
	for _, l := range m.starters {
		watchWG.Go(func() {
			select {
			case <-l.done:
				starterDone <- l
			case <-startupDone:
			}
		})
	}
	return starterDone, func() {
		close(startupDone)
		watchWG.Wait()
	}
}

// startup is the tally of one startHosts: which hosts were judged and how
// many are left. A host can be reported more than once and from different
// places (the deadline, then a late hello; a failed handshake, then its
// starter exiting): judge keeps the first outcome and drops the rest, so
// verdict sees each host exactly once and pending counts down to zero.
// A startup belongs to startHosts' goroutine alone: every report reaches
// it through a channel.
type startup struct {
	m        *hostAgents
	verdict  hostVerdict
	judged   []bool // by node
	pending  int    // hosts not judged yet
	up       int    // hosts accepted
	started  time.Time
	timeout  time.Duration // the launch timeout, for the whole start-up
	progress *progress
}

// newStartup starts the tally of a start-up over m's hosts.
func (m *hostAgents) newStartup(verdict hostVerdict) *startup {
	timeout := m.cfg.LaunchTimeout
	if timeout <= 0 {
		timeout = DefaultLaunchTimeout
	}
	return &startup{
		m: m, verdict: verdict,
		judged:   make([]bool, len(m.nodes)),
		pending:  len(m.nodes),
		started:  time.Now(),
		timeout:  timeout,
		progress: newProgress(m.cfg.Stderr, len(m.nodes)),
	}
}

// judge hands node's first outcome to verdict (c with its hello, or err)
// and keeps c in m.conns if verdict accepts it; a later outcome for the
// same node is dropped, its connection closed.
func (s *startup) judge(node int, c *hostConn, err error) error {
	if s.judged[node] {
		if c != nil {
			c.w.Close()
		}
		return nil
	}
	s.judged[node] = true
	s.pending--
	if verr := s.verdict(node, c, err); verr != nil {
		if c != nil {
			c.w.Close()
		}
		return verr
	}
	if c != nil {
		s.m.conns[node] = c
	}
	return nil
}

// result judges one agent's handshake outcome.
func (s *startup) result(r setupResult) error {
	m := s.m
	switch {
	case r.err != nil:
		return s.judge(r.node, nil, r.err)
	case m.conns[r.node] != nil:
		// Two agents authenticated for one host (each knew the job's
		// secret): which is the real one cannot be told, so the launch
		// ends rather than guessing.
		r.conn.w.Close()
		return s.verdict(r.node, nil, &outcome.HostError{Host: m.nodes[r.node].Name, Op: "connect agent", Err: errors.New("a second agent connected for this host")})
	}
	err := s.judge(r.node, r.conn, nil)
	if err == nil && m.conns[r.node] != nil {
		s.up++
		s.progress.set(s.up)
	}
	return err
}

// starterExited fails the hosts of starter l not judged yet: it exited
// before they said hello.
func (s *startup) starterExited(l *starter) error {
	var err error
	for _, n := range l.nodes {
		if err == nil && !s.judged[n] {
			err = s.judge(n, nil, s.m.starterError(l, n))
		}
	}
	return err
}

// timedOut fails every host not judged yet. One deadline for the whole
// start-up, not one per host: hosts start concurrently, so it bounds the
// slowest, and every host not judged by then fails with its starter's
// last words (an ssh prompt or error is the usual cause).
func (s *startup) timedOut() error {
	m := s.m
	var err error
	for i := range m.nodes {
		if err == nil && !s.judged[i] {
			err = s.judge(i, nil, &outcome.HostError{Host: m.nodes[i].Name, Op: "start agent",
				Err:    fmt.Errorf("its agent did not connect within %s", s.timeout),
				Detail: strings.TrimSpace(m.starterOf(i).stderr.Tail() + "\n" + m.claimHint(m.nodes[i].Name))})
		}
	}
	return err
}

// jobVerdict is a job's hostVerdict: the first host that fails ends the
// launch, and a hello must show the same version and a usable host.
func (m *hostAgents) jobVerdict(node int, c *hostConn, err error) error {
	if err != nil {
		return err
	}
	return m.checkHello(node, c.hello)
}

// hostsUse says what a hostAgents starts the host agents for. It decides
// two things that go together: what the agent does once connected
// (wire.Job.Doctor on the wire), and whether agents may be started as a
// tree (starter.go). Doctor never fans out: its agent (launcher/hostagent's
// doctor.go) has no
// child-launch path, and doctor's point is to check each host as reached
// from this machine, which a parent's ssh would hide.
type hostsUse uint8

const (
	// useJob: the agents run ranks; above the fan-out threshold they
	// start each other. The zero value, so a job needs no setting.
	useJob hostsUse = iota
	// useDoctor: the agents run pre-flight checks and probes; every agent
	// is started directly by gorun.
	useDoctor
)

// closeAuthed closes every connection that authenticated during start-up,
// except those of hosts already running ranks (markRunning).
func (m *hostAgents) closeAuthed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.authed {
		if !m.running[c] {
			c.Close()
		}
	}
}

// markRunning exempts c from closeAuthed: its host runs ranks now, and
// whoever started them closes it after stopping them.
func (m *hostAgents) markRunning(c net.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running == nil {
		m.running = map[net.Conn]bool{}
	}
	m.running[c] = true
}

func (m *hostAgents) checkHello(node int, h wire.Hello) error {
	host := m.nodes[node].Name
	if h.Version != m.cfg.Version {
		return &outcome.VersionError{Host: host, Remote: h.Version, Local: m.cfg.Version}
	}
	if h.Err != "" {
		switch h.ErrKind {
		case "program":
			return &outcome.HostError{Host: host, Op: "check program", Err: &program.Error{Program: m.prog.Path, Err: errors.New(h.Err)}}
		case "iface":
			return &outcome.HostError{Host: host, Op: "choose interface", Err: errors.New(h.Err)}
		case "capacity":
			return &outcome.HostError{Host: host, Op: "check limits", Err: &outcome.HostCapacityError{Msg: h.Err}}
		}
		return &outcome.HostError{Host: host, Op: "prepare", Err: errors.New(h.Err)}
	}
	return nil
}

// acceptLoop authenticates agents until the listener closes. The gate
// bounds the connections in their handshake (a stranger holding thousands
// open costs gorun a bounded number of descriptors), and closing it when
// setup ends drops strangers still talking, so none of them delays the job.
func (m *hostAgents) acceptLoop(index map[string]int, results chan<- setupResult) {
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
			// Heard: an agent that has sent its greeting is spared by
			// evictions while a silent connection is left to close.
			// Past the gate, only the wrapped connection is used: it is
			// the one the wire conn holds, and markRunning and
			// closeAuthed must see the same value, or closeAuthed closes
			// running hosts' connections.
			gated := c
			c = m.gate.Heard(gated)
			w, host, err := acceptAgent(c, m.key, m.jobID, func(h string) bool { _, ok := index[h]; return ok })
			if err == nil && !m.gate.Claim(gated) {
				// Evicted for a newer connection just as the agent proved
				// itself: it sees the close and connects again.
				err = errors.New("closed by the port's bound to admit a newer connection")
			}
			release()
			if err != nil {
				c.Close()
				var ve *outcome.VersionError
				if i, ok := index[host]; ok && errors.As(err, &ve) {
					// Authenticated, so the host's own verdict.
					results <- setupResult{node: i, err: err}
					return
				}
				// A stranger or a wrong secret: logged and dropped, never
				// a host's failure. What it claimed is kept for the error
				// message of a host that fails on its own later.
				var he *wire.HandshakeError
				if errors.As(err, &he) && he.ClaimHost != "" && he.ClaimProtocol != wire.Protocol {
					m.mu.Lock()
					if m.claims == nil {
						m.claims = map[string]*wire.HandshakeError{}
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
			// Authenticated: from here the peer is this job's agent and
			// gets longer (its hello waits on its program check and its
			// interface choice), and any failure is that host's.
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			node := index[host]
			m.mu.Lock()
			m.authed = append(m.authed, c)
			m.mu.Unlock()
			lvl := int8(m.cfg.Logger.GetLevel())
			job := &wire.Job{
				Version: m.cfg.Version, Program: m.prog.Path, Argv: m.prog.Argv, Dir: m.rankDir(),
				Grace: m.cfg.Grace, Lease: m.lease(), LogLevel: lvl, Iface: m.cfg.Iface, Doctor: m.use == useDoctor,
				Launch: m.children[node],
			}
			for _, s := range m.preload {
				job.Preload = append(job.Preload, s.Info)
			}
			job.Stdin = m.cfg.Stdin != nil
			job.NoPMI = m.cfg.PMI == PMINone
			job.Respawn = m.cfg.ft != nil
			if m.use == useJob {
				job.Ranks = m.nodes[node].Ranks
				job.Flight = true
			}
			if err := w.Send(wire.Msg{T: "job", Job: job}); err != nil {
				c.Close()
				results <- setupResult{node: node, err: &outcome.HostError{Host: host, Op: "talk to agent", Err: err}}
				return
			}
			hm, err := w.ReadMsg()
			if err != nil || hm.T != "hello" || hm.Hello == nil {
				c.Close()
				results <- setupResult{node: node, err: &outcome.HostError{Host: host, Op: "talk to agent", Err: fmt.Errorf("no hello: %v", err)}}
				return
			}
			if hm.Hello.Err == "" && len(hm.Hello.Need) > 0 {
				// Transfers may take long on a slow link; the progress of
				// frames is what counts, not a fixed deadline.
				_ = c.SetDeadline(time.Time{})
				m.cfg.Logger.Debug().Str("host", host).Int("files", len(hm.Hello.Need)).Msg("preloading")
				if err := preload.Send(w, m.preload, hm.Hello.Need); err != nil {
					c.Close()
					results <- setupResult{node: node, err: &outcome.HostError{Host: host, Op: "preload", Err: err}}
					return
				}
			}
			_ = c.SetDeadline(time.Time{})
			results <- setupResult{node: node, conn: &hostConn{node: node, agent: node, w: w, hello: *hm.Hello}}
			// A tree parent keeps talking during start-up: it reports its
			// children's ssh exits on this same connection, and this
			// goroutine stays its only reader until "setup-over" is
			// acknowledged, after which run's reader takes over.
			if len(m.children[node]) > 0 && hm.Hello.Err == "" {
				m.readChildExits(w)
			}
		})
	}
}

// readChildExits reads a tree parent's reports of child launches that
// ended, until gorun's "setup-over" is acknowledged or the connection
// closes. A child's stand-in launcher then ends as its ssh did.
func (m *hostAgents) readChildExits(w *wire.Conn) {
	for {
		msg, err := w.ReadMsg()
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

func (m *hostAgents) rankDir() string {
	if m.cfg.Dir != "" {
		if abs, err := filepath.Abs(m.cfg.Dir); err == nil {
			return abs
		}
	}
	wd, _ := os.Getwd()
	return wd
}

func (m *hostAgents) lease() time.Duration {
	if m.cfg.Lease > 0 {
		return m.cfg.Lease
	}
	return DefaultLease
}

func (m *hostAgents) starterOf(node int) *starter {
	for _, l := range m.starters {
		for _, n := range l.nodes {
			if n == node {
				return l
			}
		}
	}
	return &starter{stderr: &tailbuf.Buffer{}}
}

// claimHint quotes an unauthenticated connection that claimed to be host's
// agent with another protocol, for the error of a host that failed.
func (m *hostAgents) claimHint(host string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if he := m.claims[host]; he != nil {
		return fmt.Sprintf("an unauthenticated connection from %s claimed to be its agent speaking protocol %s (this gorun speaks %s); "+
			"if that was the agent, install the same gorun version on every host", he.Remote, he.ClaimProtocol, wire.Protocol)
	}
	return ""
}

// abort ends a launch that failed before any rank started, or whose
// started ranks were already stopped (hostsRun.abandon): agents that
// connected see the connection close and exit; launchers get a moment,
// then SIGKILL.
func (m *hostAgents) abort() {
	for _, c := range m.conns {
		if c != nil {
			c.w.Close()
		}
	}
	m.closeAuthed()
	m.reapStarters(2 * time.Second)
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
