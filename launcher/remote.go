package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/rankenv"
)

// Multi-host jobs: host start-up (hoststartup.go) brings up one host agent
// per host (hostagent.go) and waits until every agent connected,
// authenticated and said hello. Only then does launchOnHosts plan — rank
// 0's host supplies MASTER_ADDR and the free ports, every host its
// interface — and send each agent its ranks. Any host failing before that
// ends the launch with an error naming it, and no rank has started
// anywhere.
//
// From there the job runs through the same job loop as a single-host job,
// with hostsHome as its rankHome: the agents' events arrive on one
// channel, commands go to every agent, and a host whose connection drops
// or falls silent for the lease is "lost": its ranks count as failed and
// the job ends.

func launchOnHosts(ctx context.Context, cfg Config, job Job, id LocalIdentity) error {
	prog := Program{Path: job.Argv[0], Argv: job.Argv}
	if containsSlash(prog.Path) && !filepath.IsAbs(prog.Path) {
		dir := cfg.Dir
		if dir == "" {
			dir, _ = os.Getwd()
		}
		prog.Path = filepath.Join(dir, prog.Path)
	}
	// Placement does not depend on addresses or ports: plan once with
	// stand-ins to learn which hosts take ranks.
	pc := PlanConfig{
		NP: job.NP, Hosts: job.Hosts, Oversubscribe: job.Oversubscribe,
		GPUsPerHost: job.GPUsPerHost, Export: job.Export, JobID: "planning", Secret: "planning",
		MasterAddr: "0.0.0.0", MasterPort: 1, RdzvPort: 2, NoPMI: cfg.PMI == PMINone,
	}
	pre, err := NewPlan(pc)
	if err != nil {
		return err
	}
	m, err := newHostAgents(cfg, pre.Nodes)
	if err != nil {
		return err
	}
	m.prog = prog
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
	// Choosing the interface may wait on name resolution: a stopping
	// signal must end it, as it ends host start-up after it.
	octx, endWatch := watchStopSignals(ctx, cfg.Signals)
	err = m.open(octx, id)
	if sig := endWatch(); sig != 0 {
		if err == nil {
			m.ln.Close()
		}
		return &InterruptedError{Signal: sig}
	}
	if err != nil {
		return err
	}
	defer m.ln.Close()
	pc.JobID, pc.Secret = m.jobID, m.secret
	cfg.Logger.Info().Str("iface", m.choice.Name).Str("addr", m.addr.String()).Str("why", m.choice.Why).
		Int("hosts", len(m.nodes)).Msg("gorun listens for host agents")

	if err := m.startHosts(ctx, id, m.jobVerdict); err != nil {
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
	if err == nil {
		err = cfg.world.prepare(plan)
	}
	if err != nil {
		m.abort()
		return err
	}
	cfg.Logger.Info().Str("job", plan.JobID).Int("world", plan.WorldSize).Int("nodes", len(plan.Nodes)).
		Str("master", joinHostPort(plan.MasterAddr, plan.MasterPort)).Str("rdzv", plan.RdzvEndpoint).
		Str("program", prog.Path).Msg("launching")
	return m.run(ctx, plan)
}

// run executes the plan over the connected host agents: each agent's
// output frames feed the job's output, its events the job loop (through a
// hostsHome), and the loop's commands go to every agent. It returns after
// the loop ended, every connection reader and pinger exited, the output
// drained and the starters were reaped.
func (m *hostAgents) run(ctx context.Context, plan *Plan) error {
	pj, err := pmiJobFor(plan, m.cfg.PMI)
	if err != nil {
		m.abort()
		return err
	}
	out, err := openJobOutput(m.cfg, plan)
	if err != nil {
		m.abort()
		return err
	}
	defer out.close()
	// One in-memory pipe per rank stream: the connection reader writes,
	// a streamer makes lines. The pipe is what lets one reader per host
	// serve many ranks without knowing about lines: a rank's bytes may be
	// split across frames anywhere, and only the streamer on the far end
	// reassembles them. io.Pipe has no buffer, so a slow terminal slows
	// that host's reader, which is the back-pressure we want (the agent's
	// writes then block in TCP instead of growing memory here).
	type sink struct{ out, err *io.PipeWriter }
	sinks := make([]sink, len(plan.Ranks))
	for i, rs := range plan.Ranks {
		or, ow := io.Pipe()
		er, ew := io.Pipe()
		out.add(rs.Rank, rs.Host, 1, or)
		out.add(rs.Rank, rs.Host, 2, er)
		sinks[i] = sink{out: ow, err: ew}
	}
	// The event channel is sized for a few events per rank and per host
	// (start, exit, done, lost) so that readers rarely block on the loop;
	// they never deadlock on it either, as each send also selects quit.
	home := &hostsHome{m: m, ch: make(chan supervisorEvent, 4*len(plan.Ranks)+4*len(m.nodes)+4)}
	// quit closes once the job loop returned: it releases readers blocked
	// on a send and stops the pingers, and it tells a reader that a read
	// error after it is our own Close, not a lost host.
	quit := make(chan struct{})
	// The lease is both directions' silence limit: gorun's writes time out
	// after it, the agent gives up on gorun after it, and each side pings
	// at a quarter of it so that a healthy but idle link never trips it.
	lease := m.lease()
	for _, c := range m.conns {
		c.w.writeTimeout = lease
	}
	out.start()

	// Two goroutines per host, both owned by connWG: a pinger (the only
	// periodic writer besides commands and stdin, all serialised by
	// wireConn) and the connection's only reader.
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
			err := m.readHost(c, n, lease, home.ch, quit, func(rank int, stream byte, data []byte) {
				s := sinks[rank].out
				if stream == 2 {
					s = sinks[rank].err
				}
				_, _ = s.Write(data)
			})
			if err != nil {
				ev := supervisorEvent{Ev: "lost", Rank: n.FirstRank, Err: err.Error(), node: c.node}
				select {
				case home.ch <- ev:
				case <-quit:
				}
				// Its starter (an ssh on a cut link) would linger until
				// TCP gave up, holding reapStarters for minutes. srun is
				// left alone: one srun starts every host's agent, so
				// killing it would take the healthy hosts down with the
				// lost one; it ends when its tasks do.
				if l := m.starterOf(c.node); l.cmd != nil && l.what != "srun" {
					_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
				}
			}
		})
	}
	// The specs go out only after every reader runs: an agent starts its
	// ranks as soon as its spec arrives, and their first output or an
	// early exit must find a reader, not fill the socket buffers while
	// gorun is still sending other hosts' specs. A failed send is only
	// logged: that host's reader sees the same broken connection and
	// reports the host lost, which ends the job with its name.
	for _, c := range m.conns {
		n := plan.Nodes[c.node]
		var ranks []remoteRank
		for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
			ranks = append(ranks, remoteRank{Rank: rk, Env: withoutSecret(plan.Ranks[rk].Env), GPU: gpuOf(plan.Ranks[rk])})
		}
		if err := c.w.send(wireMsg{T: "spec", Ranks: ranks, PMI: pj}); err != nil {
			m.cfg.Logger.Debug().Err(err).Str("host", n.Name).Msg("sending the spec failed")
		}
	}
	stopStdin := m.forwardStdin(m.conns[0].w)
	// The ranks' flight records come from the agents (flight.go) and stay
	// in memory; with --output-dir they are written there too.
	flight := &flightRecords{log: m.cfg.Logger, stderr: out.stderr, remote: true}
	if m.cfg.OutputDir != "" {
		flight = prepareFlight(m.cfg, out.stderr)
		flight.remote = true
	}
	err = (&jobLoop{cfg: m.cfg, plan: plan, log: m.cfg.Logger, home: home, flight: flight}).run(ctx)
	// Tear-down order matters: quit first (readers stop treating errors
	// as losses), then close the connections (which unblocks every reader
	// and pinger), then wait for them, and only then wait for the output,
	// whose pipes the readers close on their way out.
	close(quit)
	stopStdin()
	for _, c := range m.conns {
		c.w.c.Close()
	}
	connWG.Wait()
	out.wait()
	m.reapStarters(m.cfg.Grace + 2*time.Second)
	if lerr := out.finish(); lerr != nil && err == nil {
		err = lerr
	}
	if err != nil && !flight.printed {
		// Every agent sent its ranks' dumps before "done".
		flight.print("the job failed", time.Time{})
	}
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

// watchStopSignals returns a context that ends when ctx does or when a
// stopping signal (SIGINT, SIGTERM, SIGHUP) arrives on sigs, for a phase
// that blocks outside any loop reading sigs. end stops the watch (its
// goroutine has exited when end returns) and reports the stopping signal
// that arrived, or 0. Other signals arriving meanwhile are dropped: no
// rank exists yet to forward them to.
func watchStopSignals(ctx context.Context, sigs <-chan os.Signal) (context.Context, func() syscall.Signal) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var got syscall.Signal
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case s := <-sigs:
				if sig, ok := s.(syscall.Signal); ok && stopping(sig) {
					got = sig
					cancel()
					return
				}
			case <-done:
				return
			}
		}
	})
	return wctx, func() syscall.Signal {
		close(done)
		wg.Wait()
		cancel()
		return got
	}
}

// hostsHome is the supervisors of a multi-host job's hosts, reached
// through their host agents' connections, as the job loop's rankHome.
type hostsHome struct {
	m *hostAgents
	// ch carries every host's events, and "lost" for a host whose
	// connection failed; never closed (the connection readers stop
	// sending when run's quit closes).
	ch chan supervisorEvent
}

var _ rankHome = (*hostsHome)(nil)

func (h *hostsHome) events() <-chan supervisorEvent { return h.ch }
func (h *hostsHome) supervisors() int               { return len(h.m.conns) }

// command sends c to every host agent. A lost host's write fails at once
// or within the lease (the write timeout); its agent ends on its own.
func (h *hostsHome) command(c supervisorCmd) {
	for _, hc := range h.m.conns {
		_ = hc.w.send(wireMsg{T: "cmd", Cmd: &c})
	}
}

// killGroup does nothing: a rank's process group lives on its host, where
// its host agent's supervisor kills it.
func (h *hostsHome) killGroup(int)  {}
func (h *hostsHome) lostWhy() error { return nil }

// forwardStdin copies gorun's stdin to rank 0's host agent as stdin frames
// until EOF (then an empty frame). The returned function stops the copy
// and waits for it. A file that cannot be read cancellably is not
// forwarded: rank 0 gets EOF at once, as a copy that could not be stopped
// would keep the job from ending.
func (m *hostAgents) forwardStdin(w *wireConn) func() {
	src := m.cfg.Stdin
	if src == nil {
		return func() {}
	}
	var reopened *os.File
	if f, ok := src.(*os.File); ok {
		nf, err := cancellableStdin(f)
		if err != nil {
			m.cfg.Logger.Debug().Err(err).Msg("stdin cannot be forwarded to rank 0")
			_ = w.writeFrame(frameStdin)
			return func() {}
		}
		src, reopened = nf, nf
	}
	p := startStdinPump(src, func(b []byte) error { return w.writeFrame(frameStdin, b) }, func(eof bool) {
		if eof {
			_ = w.writeFrame(frameStdin)
		}
	})
	return func() {
		p.stop(nil)
		if reopened != nil {
			reopened.Close()
		}
	}
}

// readHost reads one agent's frames until it reported "done" and hung up
// (nil) or the connection failed or fell silent (the error says which).
//
// It is the only reader of the connection, so it also keeps gorun's side
// of the lease: every frame, pings included, pushes the read deadline a
// lease ahead, and a deadline that passes is a host that is silent (a cut
// link delivers no FIN, so only silence tells). Events from other hosts'
// ranks are dropped: an agent speaks only for its node's ranks. After
// "done" the agent half-closes; the read error that follows is the clean
// end, not a loss.
func (m *hostAgents) readHost(c *hostConn, n Node, lease time.Duration, events chan<- supervisorEvent, quit <-chan struct{},
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
