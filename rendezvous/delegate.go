package rendezvous

import (
	"encoding/binary"
	"sort"
	"time"
	"unsafe"

	"github.com/hashicorp/memberlist"
)

// The gossip side of a World: memberlist's Delegate, EventDelegate and
// ConflictDelegate. These callbacks run inside memberlist's own goroutines
// — join, leave and conflict events one at a time, messages and push-pull
// state from its stream handlers concurrently — so every one of them takes
// World.mu only briefly, never blocks while holding it, and never calls
// memberlist (which may be waiting for the callback to return). What they
// decide is applied to the member table (goneLocked, markAliveLocked) and
// handed on through the event queue (events.go).

// delegate receives memberlist's callbacks. They run inside memberlist's
// loops (events and conflicts serialised, messages from stream handlers
// concurrently), so each takes World.mu briefly and never blocks.
type delegate struct {
	w    *World
	meta []byte
}

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
)

func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.meta) > limit {
		// Validate checked this against memberlist's limit; a smaller
		// limit would be a memberlist change. Advertise nothing rather
		// than make memberlist panic: peers will refuse the member.
		return nil
	}
	return d.meta
}

func (d *delegate) NotifyMsg(b []byte) { d.w.handleMsg(b) }

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.w.bq == nil {
		return nil
	}
	return d.w.bq.GetBroadcasts(overhead, limit)
}

// LocalState carries the attached ranks a leader knows, its own and those
// it learnt (hier.go); nothing in flat mode, where node metadata says
// everything. A rank alone on its host is a gossip member without host
// leaders of its own, but the other hosts of its job may have them (gorun
// -H a:2,b:1): it must take in and pass on their attached ranks like any
// leader, or it never sees them and the world never forms. So the state
// is exchanged unless the job is flat throughout (Config.Flat).
func (d *delegate) LocalState(join bool) []byte {
	if d.w.cfg.Flat {
		return nil
	}
	d.w.mu.Lock()
	defer d.w.mu.Unlock()
	return d.w.localStateLocked()
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) == 0 || d.w.cfg.Flat {
		return
	}
	d.w.mu.Lock()
	defer d.w.mu.Unlock()
	d.w.mergeStateLocked(buf)
}

// claimOf describes a memberlist node for a conflict message, as far as its
// metadata allows.
func claimOf(n *memberlist.Node) Claim {
	m, err := decodeMeta(n.Meta)
	c := Claim{Rank: m.Rank, Host: m.Host, Addr: n.Address(), JobID: m.JobID, Size: m.WorldSize}
	if err != nil {
		c.Rank, c.Host, c.JobID = -1, "?", "? ("+err.Error()+")"
	}
	return c
}

func (d *delegate) NotifyJoin(n *memberlist.Node) {
	w := d.w
	m, err := decodeMeta(n.Meta)
	w.mu.Lock()
	defer w.mu.Unlock()
	self := Claim{Rank: w.cfg.Rank, Host: w.cfg.Host, JobID: w.cfg.JobID, Size: w.cfg.WorldSize, Addr: "(this process)"}
	if err == nil && m.JobID == w.cfg.JobID && m.Generation != w.cfg.Generation {
		if m.Generation < w.cfg.Generation {
			// A rank of a torn-down world: refused, and the world forms
			// without it (it learns it is stale from our side's join).
			w.log.Warn().Int("member", m.Rank).Str("member_host", m.Host).Uint64("stale_generation", m.Generation).Uint64("generation", w.cfg.Generation).
				Msg("rendezvous: refusing a member of an older world of this job")
			return
		}
		se := &StaleError{Generation: w.cfg.Generation, Newer: m.Generation, Seen: claimOf(n)}
		w.log.Error().Err(se).Msg("rendezvous: this rank is stale")
		w.setFatalLocked(se) // nobody to tell: the newer world is right
		return
	}
	var conflict *ConflictError
	switch {
	case err != nil:
		conflict = &ConflictError{What: "member with unreadable metadata", A: self, B: claimOf(n)}
	case m.JobID != w.cfg.JobID:
		conflict = &ConflictError{What: "member of another job", A: self, B: claimOf(n)}
	case m.WorldSize != w.cfg.WorldSize:
		conflict = &ConflictError{What: "member started with another world size", A: self, B: claimOf(n)}
	case m.Rank < 0 || m.Rank >= w.cfg.WorldSize || n.Name != nodeName(m.JobID, m.Generation, m.Rank):
		conflict = &ConflictError{What: "member with an inconsistent rank", A: self, B: claimOf(n)}
	}
	if conflict != nil {
		w.log.Error().Err(conflict).Msg("rendezvous: refusing member")
		w.setFatalLocked(conflict, *n)
		return
	}
	ms := &w.members[m.Rank]
	if (ms.status == statusAlive || ms.pending) && ms.leader != m.Rank {
		// Announced as attached to another leader, and now a gossip member.
		w.setFatalLocked(&ConflictError{What: "two processes claim one rank", A: w.claimLocked(m.Rank), B: claimOf(n)},
			*n, w.nodeLocked(ms.leader))
		return
	}
	switch ms.status {
	case statusAlive:
		// memberlist reports a node again only after it was gone; seeing
		// it alive twice means two identities for one rank.
		if old := w.nodeLocked(m.Rank); old.Address() != n.Address() {
			w.setFatalLocked(&ConflictError{What: "two processes claim one rank", A: claimOf(&old), B: claimOf(n)}, *n)
			return
		}
		if ms.doubted() != nil {
			// Declared dead by gossip, and it refuted within its lease
			// (doubt.go): it was cut off or starved, not gone.
			ms.endDoubt()
			w.log.Warn().Int("member", m.Rank).Str("member_host", m.Host).
				Msg("rendezvous: member declared dead by gossip answered again within its lease; it stays in the world")
		}
		return
	case statusLeft, statusDead:
		if w.formed {
			// A member declared dead that comes back (it was only slow)
			// stays lost: groups already failed on its account.
			w.log.Warn().Int("member", m.Rank).Msg("rendezvous: a member that was lost or left is back; it stays out of the world")
			return
		}
		// Before formation nothing depends on it yet: a member that was
		// only starved of CPU while hundreds of processes start is simply
		// counted again.
		ms.resetGone()
	}
	w.setMemberLocked(m, m.Rank)
	ms.ext().node = &memberlist.Node{Name: n.Name, Addr: append([]byte(nil), n.Addr...), Port: n.Port, Meta: append([]byte(nil), n.Meta...)}
	ms.status = statusUnseen
	w.markAliveLocked(m.Rank)
	// Ranks announced as attached to this leader count once it is alive
	// (again, before formation, after a false death).
	for q := range w.members {
		qs := &w.members[q]
		if q != m.Rank && qs.leader == m.Rank && (qs.pending || (qs.status == statusDead && !w.formed)) {
			w.markAliveLocked(q)
		}
	}
}

func (d *delegate) NotifyLeave(n *memberlist.Node) {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.rankOfLocked(n)
	if r < 0 {
		return
	}
	ms := &w.members[r]
	if ms.status != statusAlive {
		return
	}
	left := nodeState(n) == memberlist.StateLeft || ms.leaving
	if !left && w.formed && !w.closed && r != w.cfg.Rank {
		// Silence, not proof: doubt the verdict until the member's lease
		// ends (doubt.go).
		if ms.doubted() == nil {
			w.doubtLocked(r)
		}
		return
	}
	ms.endDoubt()
	w.memberGoneLocked(r, left, causeDead)
}

// goneLocked records that rank r left (left) or was lost (with cause),
// fails or ends the groups that contain it, queues the event and passes it
// on to the ranks attached here.
func (w *World) goneLocked(r int, left bool, cause byte) {
	ms := &w.members[r]
	if ms.status != statusAlive {
		return
	}
	w.alive--
	if ms.x != nil && ms.x.gone != nil {
		close(ms.x.gone)
	}
	w.signalChangeLocked()
	if r == w.cfg.Rank {
		// Our own leave, echoed by memberlist: not news to anyone here.
		ms.status = statusLeft
		return
	}
	var told []linkPos
	if w.formed {
		w.epoch++
		var lb byte
		if left {
			lb = 1
		}
		for q, l := range w.links {
			if q != r {
				if seq, ok := l.enqueueSeq(frameGone, append(binary.AppendUvarint(nil, uint64(r)), lb, cause)); ok {
					told = append(told, linkPos{l, seq})
				}
			}
		}
	}
	if left || ms.leaving {
		ms.status = statusLeft
		// Debug: at the end of a job every member sees every other leave.
		w.log.Debug().Int("member", r).Str("member_host", ms.host).Uint64("epoch", w.epoch).Msg("rendezvous: member left")
		if !w.formed {
			w.setFatalLocked(&LeftError{Rank: r, Host: ms.host, Op: "formation"})
			return
		}
		for _, g := range w.groups {
			if _, in := g.position(r); in && g.leaver == nil {
				g.leaver = &LeftError{Rank: r, Host: ms.host}
				close(g.left)
			}
		}
		w.queueEventLocked(Event{Kind: MemberLeft, Rank: r, Host: ms.host, Epoch: w.epoch, Time: time.Now()})
		return
	}
	ms.status = statusDead
	lerr := &LostError{Rank: r, Host: ms.host, Epoch: w.epoch, Cause: w.causeErrorLocked(cause, r)}
	if !w.formed && (cause == causeSilent || cause == causeRefused) {
		// Silent past the attach lease (its own goroutine beats, so a
		// starved process still beats): frozen or unable to run. Or its
		// gossip port refused a connection: the process is gone. Unlike
		// a gossip death, which a starved member refutes, neither heals
		// in time to matter, so formation fails now naming it, instead
		// of at the formation timeout.
		w.log.Error().Err(lerr).Msg("rendezvous: member lost before the world formed")
		w.setFatalLocked(lerr)
		return
	}
	if !w.formed {
		// Not fatal yet: under a heavy start-up load a live member can be
		// declared dead and then refute it. A member that is really gone
		// is listed by the formation timeout, and a crashed process is
		// reported sooner by its launcher.
		w.log.Warn().Err(lerr).Msg("rendezvous: member declared dead before the world formed; still waiting for it")
		return
	}
	ev := w.log.Error()
	if w.closed {
		// While this member closes, others that exit at the same time
		// may be seen dead before their leave arrives: not news.
		ev = w.log.Debug()
	}
	ev.Err(lerr).Uint64("epoch", w.epoch).Msg("rendezvous: member lost")
	var fail []*Group
	for _, g := range w.groups {
		if _, in := g.position(r); in && g.err == nil && g.pending == nil {
			g.pending = lerr
			fail = append(fail, g)
		}
	}
	w.publishLocked(told, fail, Event{Kind: MemberLost, Rank: r, Host: ms.host, Epoch: w.epoch, Err: lerr, Time: time.Now()})
}

// linkPos is a frame's position on a link (link.enqueueSeq).
type linkPos struct {
	l   *link
	seq uint64
}

// publishLocked makes a loss visible in this process: it fails the groups
// in fail (each holding the loss in pending) and queues ev. On a host
// leader that has just queued the loss for its attached ranks (told), it
// first waits, off the lock, until those frames are written: a leader's
// own program acts on a loss (returns an error, aborts its peers, often
// exits, which closes its attach streams without a goodbye), and an
// attached rank that saw its leader's stream close before the news would
// blame the leader, not the lost rank (seen in CI: libgorun's
// TestABIFromC/killed-rank, rank 1 naming its leader rank 0 for rank 2's
// SIGKILL). Written means in the kernel's socket buffer, which outlives
// the leader's exit; the attached rank reads it before the end of stream.
//
// The wait is bounded by newsWait, the attach lease: in a normal run the
// frames are written within microseconds, so the bound only matters when
// this process is starved of CPU (then waiting is right: a clean-clone
// `make test` under -race once exceeded a bound of one beat, 250 ms, and
// the attached rank named its leader), or when an attached rank cannot
// take a few bytes, which means it is frozen with a full socket buffer and
// its lease declares it lost within the same time. Publications stay in
// order: one waits for the one before it, so the first loss is still the
// one a group names.
func (w *World) publishLocked(told []linkPos, fail []*Group, ev Event) {
	prev := w.lastPub
	inFlight := false
	if prev != nil {
		select {
		case <-prev:
		default:
			inFlight = true
		}
	}
	if w.closed || (len(told) == 0 && !inFlight) {
		w.failGroupsLocked(fail, ev)
		return
	}
	done := make(chan struct{})
	w.lastPub = done
	w.wg.Go(func() {
		defer close(done)
		t := time.NewTimer(newsWait(&w.cfg))
		defer t.Stop()
		for _, p := range told {
			p.l.waitWritten(p.seq, t.C)
		}
		if prev != nil {
			<-prev
		}
		w.mu.Lock()
		w.failGroupsLocked(fail, ev)
		w.mu.Unlock()
	})
}

// failGroupsLocked fails each group with the loss it holds in pending and
// queues ev.
func (w *World) failGroupsLocked(fail []*Group, ev Event) {
	for _, g := range fail {
		if g.err == nil {
			g.err = g.pending
			close(g.failed)
		}
	}
	w.queueEventLocked(ev)
}

// newsWait bounds publishLocked's wait for the attach streams: the attach
// lease, the streams' own liveness bound (1 s if leases are off).
func newsWait(c *Config) time.Duration {
	if c.AttachLease > 0 {
		return c.AttachLease
	}
	return time.Second
}

func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	// Metadata never changes after start; an update means a restarted
	// process with the same name, which memberlist only lets through after
	// a death that NotifyLeave already handled.
}

func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	ce := &ConflictError{What: "two processes claim one rank", A: claimOf(existing), B: claimOf(other)}
	w.log.Error().Err(ce).Msg("rendezvous: rank conflict")
	w.setFatalLocked(ce, *other, *existing)
}

// rankOfLocked maps a memberlist node back to the rank it was admitted as.
func (w *World) rankOfLocked(n *memberlist.Node) int {
	m, err := decodeMeta(n.Meta)
	if err != nil || m.JobID != w.cfg.JobID || m.Rank < 0 || m.Rank >= len(w.members) {
		return -1
	}
	if node := w.members[m.Rank].node(); node == nil || node.Name != n.Name {
		return -1
	}
	return m.Rank
}

// sortedInts returns a sorted copy.
func sortedInts(s []int) []int {
	out := append([]int(nil), s...)
	sort.Ints(out)
	return out
}

// nodeStateMirror mirrors memberlist v0.7.0's unexported nodeState, whose
// first field is the Node that every EventDelegate callback receives a
// pointer to (&state.Node). memberlist records "left" versus "dead" only in
// nodeState.State: the Node.State a callback sees is never updated, so it
// cannot tell a graceful leave from a crash, and no exported API says
// which it was (notes/dependencies.md). Reading the enclosing struct is the
// only exact way; the world's own goodbye (kindBye) is best-effort and
// cannot replace it; TestLeaveIsNotFailure and TestCrashDetectedWithin2s fail if a
// memberlist upgrade changes this layout, and nodeState below refuses to
// guess on an impossible value.
type nodeStateMirror struct {
	memberlist.Node
	Incarnation uint32
	State       memberlist.NodeStateType
	StateChange time.Time
}

// nodeState returns memberlist's own state for a node passed to NotifyLeave:
// StateLeft for a graceful leave, StateDead for a failure. Anything else
// (a layout change) is reported as StateDead: a false failure report is
// loud and safe, a missed one would hang a collective.
func nodeState(n *memberlist.Node) memberlist.NodeStateType {
	s := (*nodeStateMirror)(unsafe.Pointer(n)).State
	if s != memberlist.StateLeft && s != memberlist.StateDead {
		return memberlist.StateDead
	}
	return s
}
