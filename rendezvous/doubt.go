package rendezvous

import (
	"encoding/binary"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// How a World judges memberlist's evidence about a gossip member (see
// Config's failure-detection fields). memberlist's SWIM treats every
// failed probe alike; the World tells two kinds apart:
//
//   - Proof. A TCP connection to the member's gossip port was refused: the
//     member's host is up and nothing listens there, so the process is gone.
//     memberlist would still wait out a whole suspicion. refusedLocked gives
//     the member RefusedGrace for a goodbye that may be on its way (a
//     leaving member closes its listener after saying goodbye), then counts
//     it lost and tells every other member at once (kindGone with
//     causeRefused, which the receivers apply to gossip members too: a
//     refusal is first-hand and does not depend on where it was seen from).
//   - Silence. Nothing answered: a frozen process, a dead host and a network
//     cut look the same, and a cut may heal. memberlist declares the member
//     dead SuspicionTimeout after it suspected it; the World doubts that
//     verdict (doubtLocked) and keeps trying to reach the member over TCP
//     with push-pulls until GossipLease has passed since the suspicion. A
//     push-pull hands the member our view, in which it is dead, so a member
//     that hears it refutes (a new incarnation), and the next push-pull
//     brings the refutation back; memberlist then reports the member alive
//     again (NotifyJoin) and the doubt ends with the member still in the
//     world. This is what lets a member whose gossip packets (UDP) are cut
//     while its TCP works survive: SWIM's suspicions and refutations travel
//     over UDP only (notes/faults.md, hosts/gossip/udp-cut).
//
// Before formation silence stays what it was (a warning; formation waits
// for the member to refute, and the waiting members' table pulls go to it
// in turn so that it hears it was declared dead: World.pullPeer), while a
// refusal fails formation naming the member, as a frozen attached rank
// does: a process that is gone will not join.
//
// The doubt's window is judged on time the observer could run
// (awaitWindow): memberlist's own timers run on the same process, and a
// process starved for seconds would otherwise count live members lost
// for its own stall.
//
// Ownership: the goroutines started here are World.wg's and end with the
// doubt, the verdict or World.stop; a push-pull in flight when the World
// closes ends within TCPTimeout.

// watchedTransport is the gossip transport with its refused dials reported
// to the World.
type watchedTransport struct {
	memberlist.NodeAwareTransport
	refused func(addr string)
}

var _ memberlist.NodeAwareTransport = (*watchedTransport)(nil)

// DialAddressTimeout dials as the transport does and reports a refusal.
func (t *watchedTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
		t.refused(a.Addr)
	}
	return c, err
}

// DialTimeout dials as the transport does and reports a refusal.
func (t *watchedTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialTimeout(addr, timeout)
	if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
		t.refused(addr)
	}
	return c, err
}

// refused handles a refused connection to addr (memberlist's goroutines
// call it; it never blocks).
func (w *World) refused(addr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	r := -1
	for q := range w.members {
		m := &w.members[q]
		if q != w.cfg.Rank && m.leader == q && m.status == statusAlive && m.node() != nil && m.node().Address() == addr {
			r = q
			break
		}
	}
	if r < 0 {
		return // not a member (a seed not yet joined, a member already gone)
	}
	ms := &w.members[r]
	if ms.leaving || ms.refused {
		return
	}
	ms.refused = true
	w.log.Debug().Int("member", r).Str("member_host", ms.host).Str("addr", addr).
		Msg("rendezvous: member's gossip port refused a connection; waiting for its goodbye")
	w.wg.Go(func() {
		t := time.NewTimer(w.cfg.RefusedGrace)
		defer t.Stop()
		select {
		case <-t.C:
		case <-w.stop:
			return
		}
		w.mu.Lock()
		ms := &w.members[r]
		if ms.status != statusAlive || ms.leaving || w.closed {
			w.mu.Unlock()
			return
		}
		w.log.Warn().Int("member", r).Str("member_host", ms.host).
			Msg("rendezvous: member's gossip port refuses connections: its process is gone")
		w.verdictLocked(r, causeRefused)
		var nodes []memberlist.Node
		if w.ml != nil {
			nodes = w.nodesLocked()
		}
		w.mu.Unlock()
		w.tellGone(nodes, r, causeRefused)
	})
}

// tellGone sends kindGone for rank r to nodes directly, one packet each, and
// queues it for gossip as a backstop for a lost packet.
func (w *World) tellGone(nodes []memberlist.Node, r int, cause byte) {
	if len(nodes) == 0 {
		return
	}
	msg := append(binary.AppendUvarint([]byte{kindGone}, uint64(r)), 0, cause)
	for _, n := range nodes {
		if err := w.ml.SendBestEffort(&n, msg); err != nil {
			w.log.Debug().Err(err).Str("to", n.Address()).Msg("rendezvous: could not report a lost member")
		}
	}
	w.bq.QueueBroadcast(simpleBroadcast(msg))
}

// verdictLocked ends any doubt about gossip member r and counts it lost
// for cause, with the ranks attached to it.
func (w *World) verdictLocked(r int, cause byte) {
	w.members[r].endDoubt()
	w.memberGoneLocked(r, false, cause)
}

// memberGoneLocked records that gossip member r left or was lost, and the
// ranks attached to it with it (a leader takes its host's ranks along:
// their only path to the world was through it).
func (w *World) memberGoneLocked(r int, left bool, cause byte) {
	w.goneLocked(r, left, cause)
	if r == w.cfg.Rank {
		return
	}
	for q := range w.members {
		if q != r && w.members[q].leader == r {
			w.goneLocked(q, left, causeLeader)
		}
	}
}

// doubtLocked starts doubting memberlist's verdict that gossip member r is
// dead: r is lost when the rest of its lease has passed without it answering
// again, unless it is refused sooner.
func (w *World) doubtLocked(r int) {
	ms := &w.members[r]
	done := make(chan struct{})
	ms.ext().doubted = done
	window := w.cfg.GossipLease - w.cfg.SuspicionTimeout
	w.log.Warn().Int("member", r).Str("member_host", ms.host).Dur("window", window).
		Msg("rendezvous: gossip declared member dead; trying to reach it over TCP until its lease ends")
	w.wg.Go(func() {
		if w.awaitWindow(window, done) {
			w.mu.Lock()
			if w.members[r].doubted() == done {
				w.verdictLocked(r, causeDead)
			}
			w.mu.Unlock()
		}
	})
	node := w.nodeLocked(r)
	addr := node.Name + "/" + node.Address()
	w.wg.Go(func() { w.reach(addr, done) })
}

// awaitWindow waits until window has passed as this process could tell,
// and reports whether it did (false: done or the World's stop came
// first). Time this process could not run does not count: its stall log
// (stallLog, fed by the attach streams' writers) and this wait's own
// lateness are excused, up to StarvedLimit of clock time, as the attach
// leases excuse them. memberlist's probes and suspicion ran on the same
// starved process; what the World adds to its verdict is judged on time
// the observer could have heard an answer in, or a process of thousands
// of members, stalled for seconds, would count live members lost for
// its own stall.
func (w *World) awaitWindow(window time.Duration, done <-chan struct{}) bool {
	start := time.Now()
	slack := w.cfg.AttachBeat / 4
	for wait := window; ; {
		t := time.NewTimer(wait)
		due := time.Now().Add(wait)
		select {
		case <-t.C:
		case <-done:
			t.Stop()
			return false
		case <-w.stop:
			t.Stop()
			return false
		}
		now := time.Now()
		if from := due.Add(slack); now.After(from) {
			w.stalls.add(from, now) // this wait was ready and not run
		}
		heard, silent := w.stalls.judged(start, now, 0, w.cfg.StarvedLimit)
		if heard >= window {
			return true
		}
		wait = window - heard
		if l := w.cfg.StarvedLimit; l > 0 {
			wait = max(min(wait, l-silent), time.Millisecond)
		}
	}
}

// reach runs push-pulls with a doubted member (addr is "name/ip:port")
// until the doubt ends: one right away, then one every ProbeInterval after
// the last one ended. Each is bounded by TCPTimeout. A refused one is
// reported by the transport (refused); the outcome matters only through
// memberlist's view, so errors are only logged.
func (w *World) reach(addr string, done <-chan struct{}) {
	for {
		if ml := w.mlAtomic.Load(); ml != nil {
			if _, err := ml.Join([]string{addr}); err != nil {
				w.log.Debug().Err(err).Str("to", addr).Msg("rendezvous: doubted member not reached")
			}
		}
		t := time.NewTimer(w.cfg.ProbeInterval)
		select {
		case <-t.C:
		case <-done:
			t.Stop()
			return
		case <-w.stop:
			t.Stop()
			return
		}
	}
}
