package launcher

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Spare hosts of a fault-tolerant job. The user names them as
// --min-np's spares are named: hosts in the host list beyond what the
// job needs (gorun -np 3 -H a,b,c,d: d is a spare). gorun starts their
// agents with the job's, rankless: each says hello (its program present,
// its interface) and waits for a spec. When a host is lost, the first
// spare left takes the lost host's place in the plan (same node, same
// ranks, its own name and interface) and gets the lost ranks' specs,
// rewritten for it, each with its next incarnation; they start there,
// join the quorum at a step boundary and heal from the live replicas like
// any replacement. A spare lost in turn is a lost host like any other.
//
// While it waits, a spare keeps a lease both ways, as a running host
// does (spareHost; the agent's side is wire.Conn.ReadMsgWithin): a spare
// whose agent dies or whose link falls silent before it is used is
// dropped when that happens (said on stderr, recorded in the report's
// lost_spares) and the next lost host takes the next live spare.
//
// Why at launch and not when a host is lost: a spare found unreachable,
// or without the program, is named before the job runs rather than when
// it is needed; and the replacement's start then costs a message, not an
// ssh handshake and an agent's start-up (0.3-3 s each here), on the path
// the survivors' heal waits for. The price is one idle agent per spare.

// spareNodes lists the hosts of hosts that the plan pre left without
// ranks, as rankless nodes after the plan's.
func spareNodes(hosts []Host, pre *plan.Plan) []plan.Node {
	var out []plan.Node
	for _, h := range hosts {
		used := slices.ContainsFunc(pre.Nodes, func(n plan.Node) bool { return n.Name == h.Name })
		dup := slices.ContainsFunc(out, func(n plan.Node) bool { return n.Name == h.Name })
		if !used && !dup {
			out = append(out, plan.Node{Name: h.Name, FirstRank: pre.WorldSize})
		}
	}
	return out
}

// takeSpare moves the ranks of lost node lost to the first live spare
// host left and starts them there (their environment through
// ftRun.rankEnv, with the incarnations the caller set). A spare found
// lost on the way (its watcher had concluded so, its event still queued)
// is dropped as spareGone drops one, and the next is tried. It returns the
// spare's name, or false when no spare is left. The job loop's goroutine
// calls it.
func (r *hostsRun) takeSpare(lost int) (string, bool) {
	for len(r.spares) > 0 {
		s := r.spares[0]
		if err := s.take(); err != nil {
			r.spareGone(s, err)
			continue
		}
		r.spares = r.spares[1:]
		c := s.c
		name := r.m.nodes[c.node].Name
		n := &r.plan.Nodes[lost]
		from := n.Name
		n.Name = name
		for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
			r.plan.Ranks[rk].Host = name
			// Its lines are tagged with the host it runs on from now
			// on; its log (one per rank) says where it moved.
			r.out.Moved(rk, name, fmt.Sprintf("--- gorun: rank %d moves to spare host %s (host %s was lost) ---\n", rk, name, from))
		}
		// The spare is the lost node from now on: its events carry that
		// node, and commands for the node's ranks go to it.
		c.node = lost
		r.home.byNode = nil
		r.launch(c)
		return name, true
	}
	return "", false
}

// spareHost is a spare host's connection while it waits, rankless, and
// gorun's side of its lease: a pinger, and a reader (watch) that hears the
// agent's pings and reports the spare lost ("spare-lost" on the job
// loop's channel) when its connection closes or falls silent past the
// lease. Taking the spare over (take) stops both without cutting a frame,
// and the host's reader of a running host (readHost) takes over.
type spareHost struct {
	c    *hostConn
	node int // its node in the host list (c.node, until taken)
	// mu orders take against the reader's deadlines and frames: a frame
	// is read whole under mu, and once taken is set the reader returns
	// without reading more.
	mu    sync.Mutex
	taken bool // guarded by mu
	// lost is why the reader concluded the spare is gone; set before done
	// closes.
	lost error
	// stop closes when the spare is taken, dropped or found lost (halt);
	// done when its reader and pinger have returned.
	stop chan struct{}
	halt func()
	done chan struct{}
}

// addSpare makes c a spare, unless it is one already: the agent is told
// ("spare", so that it keeps its side of the lease) and c's pinger and
// reader start. Called on start-up's goroutine, as soon as the spare is up
// and the job planned (a tree parent's, once start-up is over), when
// nothing else reads c.
func (r *hostsRun) addSpare(c *hostConn) {
	if slices.ContainsFunc(r.spares, func(s *spareHost) bool { return s.c == c }) {
		return
	}
	s := &spareHost{c: c, node: c.node, stop: make(chan struct{}), done: make(chan struct{})}
	s.halt = sync.OnceFunc(func() { close(s.stop) })
	r.spares = append(r.spares, s)
	c.w.SetWriteTimeout(r.lease)
	if err := c.w.Send(wire.Msg{T: "spare"}); err != nil {
		r.m.cfg.Logger.Debug().Err(err).Str("host", r.m.nodes[c.node].Name).Msg("telling the spare host it is one failed")
	} else {
		r.m.cfg.Logger.Info().Str("host", r.m.nodes[c.node].Name).Dur("lease", r.lease).Msg("spare host waits, holding a lease")
	}
	r.connWG.Go(func() {
		var ping sync.WaitGroup
		ping.Go(func() { c.w.PingEvery(r.lease/4, s.stop) })
		if s.lost = s.watch(r.lease); s.lost != nil {
			select {
			case r.home.ch <- wire.Event{Ev: "spare-lost", Node: s.node, Err: s.lost.Error()}:
			case <-r.quit:
			case <-s.stop:
			}
		}
		s.halt()
		ping.Wait()
		close(s.done)
	})
}

// watch reads the idle agent's frames (pings) until the spare is taken
// (nil) or its connection closes or falls silent past lease (why). A
// reader late past the deadline gives the agent as much more time, up to
// another lease, as readHost does.
func (s *spareHost) watch(lease time.Duration) error {
	w := s.c.w
	extra := time.Duration(0)
	for {
		s.mu.Lock()
		if s.taken {
			s.mu.Unlock()
			return nil
		}
		deadline := time.Now().Add(lease)
		if extra > 0 {
			deadline = time.Now().Add(extra)
		}
		_ = w.SetReadDeadline(deadline)
		s.mu.Unlock()
		_, err := w.Peek(1)
		s.mu.Lock()
		if s.taken {
			s.mu.Unlock()
			return nil
		}
		if err == nil {
			_ = w.SetReadDeadline(time.Now().Add(lease))
			_, _, err = w.ReadFrame(nil) // pings: an idle agent says nothing else
		}
		s.mu.Unlock()
		switch late := time.Since(deadline); {
		case err == nil:
			extra = 0
		case isTimeout(err) && extra == 0 && late > lease/16:
			extra = min(late, lease)
		case isTimeout(err):
			return fmt.Errorf("no word from its agent for %s while it waited as a spare (network link down, or host hung)", lease)
		default:
			return fmt.Errorf("the connection to its agent closed while it waited as a spare (agent killed, or host rebooted): %v", err)
		}
	}
}

// take stops the spare's pinger and reader, so that the connection is
// free for a running host's, and returns why the spare was lost when its
// reader had concluded so (then it cannot be used).
func (s *spareHost) take() error {
	s.mu.Lock()
	s.taken = true
	_ = s.c.w.SetReadDeadline(time.Now()) // wakes the reader's Peek
	s.mu.Unlock()
	s.halt()
	<-s.done
	_ = s.c.w.SetReadDeadline(time.Time{})
	return s.lost
}

// spareGone drops spare s, found lost (why): it is no longer offered, its
// connection is closed and its starter (an ssh on a cut link would linger
// until TCP gave up) killed; the fault-tolerant record and one line on
// gorun's stderr say so. The job goes on. The job loop's goroutine calls
// it.
func (r *hostsRun) spareGone(s *spareHost, why error) {
	r.spares = slices.DeleteFunc(r.spares, func(x *spareHost) bool { return x == s })
	s.halt()
	<-s.done
	s.c.w.Close()
	if l := r.m.starterOf(s.node); l.cmd != nil && l.what != "srun" {
		_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
	}
	name := r.m.nodes[s.node].Name
	left := make([]string, 0, len(r.spares))
	for _, x := range r.spares {
		left = append(left, r.m.nodes[x.node].Name)
	}
	r.m.cfg.ft.spareLost(name, why.Error(), left)
	sp := "no spare host is left"
	if len(left) > 0 {
		sp = "spare hosts left: " + strings.Join(left, ", ")
	}
	r.out.Stderr().WriteLines(fmt.Appendf(nil, "gorun: fault-tolerant: spare host %s lost while idle: %s; it is no longer offered (%s)\n", name, why, sp))
}

// dropSpare handles a "spare-lost" event for the spare of node node; an
// event for a spare taken meanwhile is stale (a spare lost after it was
// taken is a lost host like any other) and ignored.
func (r *hostsRun) dropSpare(node int) {
	for _, s := range r.spares {
		if s.node == node {
			r.spareGone(s, s.lost)
			return
		}
	}
}

// rankEnv is a rank's environment as its host agent gets it: with its
// current incarnation when it is a replacement started on a spare host.
func (f *ftRun) rankEnv(rank int, env []string) []string {
	if f == nil || f.inc[rank] == 0 {
		return env
	}
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, ft.IncarnationEnv+"=") })
	return append(env, ft.IncarnationEnv+"="+strconv.Itoa(f.inc[rank]))
}
