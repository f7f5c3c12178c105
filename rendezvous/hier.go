package rendezvous

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gorun-hpc/gorun/internal/connlimit"
)

// Host leaders: one gossip member per host.
//
// Gossip traffic and CPU grow with the number of members, so when ranks
// share a host, only that host's local rank 0 (its leader) joins
// memberlist; the host's other ranks attach to it over an abstract Unix
// socket (attach.go) and never gossip. The protocol, for one host:
//
//	attached rank                              leader
//	dial attachName(secret, host) ───────────► accept (gate: one user's
//	                                             connections only, bounded)
//	handshake: both prove the job secret ◄───► handshake
//	frameHello{Member}  ───────────────────────► checked against the job, the
//	                                             world size, and every claim
//	                                             of that rank seen so far
//	                                             (frameFatal 'C' on conflict)
//	frameMsg{dest, msg} ───────────────────────► route: to itself, to another
//	                                             attached rank, or to dest's
//	                                             leader (kindRelay)
//	◄─────────────────────────── frameTable{epoch, every member and its leader}
//	                                             once the world formed
//	◄─────────────────────────── frameGone / frameMsg / frameFatal 'F'
//	frameBye (a leave) or EOF (a loss) ────────► attachedGone
//
// Between leaders, the attached ranks travel in memberlist's push-pull
// state (localStateLocked / mergeStateLocked), so the seed's push at
// formation hands every leader the whole world; kindRelay carries a
// message to a rank attached elsewhere, and kindGone announces that an
// attached rank left or was lost.
//
// Who is the authority on what: a leader on its own attached ranks (their
// hello and their stream's end; news about them from others is ignored,
// handleGone); memberlist on the leaders themselves, except that any
// member's refused connection proves a leader gone (doubt.go); the
// leader's table on
// everything, for an attached rank. An attached rank whose leader goes
// loses every other member with it (leaderGoneLocked): its only path to
// them is gone.
//
// Concurrency: each attached stream has one reader goroutine
// (serveAttached on the leader, readLeader on the rank) and one writer
// (link.writer, fed by enqueue so that no reader ever blocks on a slow
// peer); all of them are World.wg's. Every change to the member table
// happens under World.mu, in methods named ...Locked; sends (memberlist,
// enqueue) happen after mu is released, except enqueue, which never
// blocks. memberlist's callbacks take mu too, so nothing here calls
// memberlist while holding it.
// Lock order: World.mu, then a link's own mu (enqueue under mu, as in
// sendTableLocked); a link never takes World.mu.

// Messages between leaders for attached ranks (collect.go lists the others).
const (
	kindRelay byte = 'R' // uvarint destination rank, then a message for that attached rank
	kindGone  byte = 'G' // uvarint rank, byte left, byte cause: an attached rank left or was lost
)

// ErrLeaderClosed is the Cause an attached rank gives for its own host
// leader's loss: the leader's end of the attach stream closed without a
// goodbye (the leader process exited or was killed).
var ErrLeaderClosed = errors.New("this rank's connection to its host leader closed without a goodbye")

// startLeader opens the attach listener and serves the host's other ranks;
// it returns at once.
func (w *World) startLeader() error {
	net := w.cfg.AttachNet
	if net == nil {
		net = unixAttach{}
	}
	key, err := attachKey(&w.cfg)
	if err != nil {
		return err
	}
	name := attachName(key, w.cfg.Host)
	ln, err := net.Listen(name)
	if err != nil {
		if errors.Is(err, ErrAttachNameTaken) {
			// The name comes from the secret: another process of this
			// job (two local rank 0s), or one that learned the name.
			return fmt.Errorf("rendezvous: rank %d: host leader cannot listen for the host's ranks "+
				"(another process of this job on host %s claims local rank 0, or another process took the name): %w", w.cfg.Rank, w.cfg.Host, err)
		}
		return fmt.Errorf("rendezvous: rank %d: host leader cannot listen at %q for the host's ranks: %w", w.cfg.Rank, name, err)
	}
	w.ln = ln
	if w.cfg.LocalWorldSize <= 1 {
		close(w.localsReady)
	}
	// Only the host's own ranks ever connect, one each; the gate's source
	// is the peer's user, so another user's connections (refused at once
	// by checkPeer anyway) never take the host's ranks' slots.
	gate, err := connlimit.New(connlimit.Config{Max: 256, PerSource: 256}, peerSource)
	if err != nil {
		return err
	}
	w.wg.Go(func() {
		defer gate.Close()
		for {
			c, release, err := gate.Accept(ln)
			if err != nil {
				return
			}
			w.wg.Go(func() { w.serveAttached(c, release) })
		}
	})
	return nil
}

// peerSource names an attach connection's source by the peer's user id.
func peerSource(c net.Conn) string {
	if uid, _, ok := peerCred(c); ok {
		return strconv.Itoa(uid)
	}
	return "?"
}

// serveAttached runs one attached rank's stream on the leader: handshake,
// hello, then its frames until it closes. The gate's slot (release) is
// held only until the hello: an attached rank then holds its stream for
// the whole job, and must not keep a stranger's handshake from a slot.
func (w *World) serveAttached(c net.Conn, release func()) {
	key, _ := attachKey(&w.cfg)
	if err := checkPeer(c); err != nil {
		release()
		w.log.Warn().Err(err).Msg("rendezvous: refused a local attach")
		_ = c.Close()
		return
	}
	pc := w.patient(c)
	if err := handshake(pc, key, true, w.cfg.TCPTimeout); err != nil {
		release()
		w.log.Warn().Err(err).Str("from", c.RemoteAddr().String()).Msg("rendezvous: refused a local attach")
		_ = c.Close()
		return
	}
	_ = pc.SetReadDeadline(time.Now().Add(w.cfg.TCPTimeout))
	typ, body, err := readFrame(pc)
	_ = pc.SetReadDeadline(time.Time{})
	release()
	if err != nil || typ != frameHello {
		w.log.Warn().Err(err).Msg("rendezvous: attached rank sent no hello")
		_ = c.Close()
		return
	}
	m, err := decodeMeta(body)
	l := newLink(c, m.Rank, w.cfg.AttachBeat)
	// Beat from the hello on: the rank's lease on this leader runs from
	// then, and deciding on the rank takes World.mu, which memberlist's
	// callbacks can hold for seconds while thousands of ranks join (a
	// 4,096-rank formation failed with a leader "silent" 4 s after its
	// ranks' hellos while the process ran on time, notes/scale.md).
	w.wg.Go(l.writer)
	refuse := func(ce *ConflictError) {
		w.log.Error().Err(ce).Msg("rendezvous: refusing attached rank")
		l.enqueue(frameFatal, append([]byte{'C'}, ce.Error()...))
		l.finish(w.cfg.TCPTimeout)
	}
	w.mu.Lock()
	self := w.selfClaimLocked()
	other := Claim{Rank: m.Rank, Host: m.Host, Addr: attachedAddr(w.cfg.Rank, m.PID), JobID: m.JobID, Size: m.WorldSize}
	var ce *ConflictError
	switch {
	case err != nil:
		ce = &ConflictError{What: "attached rank with unreadable metadata", A: self, B: Claim{Rank: -1, Host: "?", JobID: "? (" + err.Error() + ")"}}
	case m.JobID != w.cfg.JobID:
		ce = &ConflictError{What: "member of another job", A: self, B: other}
	case m.WorldSize != w.cfg.WorldSize:
		ce = &ConflictError{What: "member started with another world size", A: self, B: other}
	case m.Generation != w.cfg.Generation:
		// Refused without harm to this world: only the attaching rank
		// fails (a stale one, or one that is ahead and will be met again).
		ce = &ConflictError{What: fmt.Sprintf("member of generation %d of this job's world (this world is generation %d)", m.Generation, w.cfg.Generation), A: self, B: other}
	case m.Rank < 0 || m.Rank >= w.cfg.WorldSize:
		ce = &ConflictError{What: "member with an inconsistent rank", A: self, B: other}
	case w.formed || w.closed:
		ce = &ConflictError{What: "rank attached after the world formed", A: self, B: other}
	case w.members[m.Rank].status == statusAlive || m.Rank == w.cfg.Rank:
		ce = &ConflictError{What: "two processes claim one rank", A: w.claimLocked(m.Rank), B: other}
		w.setFatalLocked(ce)
	}
	if ce != nil {
		w.mu.Unlock()
		refuse(ce)
		return
	}
	// Accepted: the rank counts as alive from its hello (the leader is
	// the authority on it), and the world may form with it.
	w.setMemberLocked(m, w.cfg.Rank)
	w.members[m.Rank].pending = false
	w.links[m.Rank] = l
	w.attachedN++
	w.markAliveLocked(m.Rank)
	if w.attachedN == w.cfg.LocalWorldSize-1 {
		select {
		case <-w.localsReady:
		default:
			close(w.localsReady)
		}
	}
	w.mu.Unlock()
	// The rank learns whom it attached to: before the world table
	// arrives it knows its leader only as "local rank 0 on this host",
	// and a leader that freezes before formation must be named.
	l.enqueue(frameLeader, binary.AppendUvarint(nil, uint64(w.cfg.Rank)))

	// Frames until the stream ends: a goodbye first makes the end a leave,
	// anything else a loss: EOF or an error (the process exited or was
	// killed), or silence past the lease (it is stopped or cannot run, and
	// its socket stays open: only the missing beats tell).
	bye, cause := false, causeClosed
	lr := newLeasedReader(c, &w.cfg, w.closedCh, m.PID)
	lr.log = func(silent time.Duration, why string) {
		w.log.Info().Int("rank", m.Rank).Int("pid", m.PID).Dur("silent", silent).Str("evidence", why).
			Msg("rendezvous: attached rank silent past its lease but alive: starved, not frozen; waiting")
	}
	for !bye {
		typ, body, err := lr.next()
		if err != nil {
			if isSilence(err) {
				cause = causeSilent
				w.log.Warn().Int("rank", m.Rank).Int("pid", m.PID).Dur("lease", w.cfg.AttachLease).Err(err).
					Msg("rendezvous: attached rank silent past its lease: declared lost (frozen or unresponsive)")
			}
			break
		}
		switch typ {
		case frameMsg:
			dest, n := binary.Uvarint(body)
			if n > 0 {
				w.route(int(dest), body[n:])
			}
		case frameBye:
			bye = true
		}
	}
	w.attachedGone(m.Rank, bye, cause)
	l.finish(w.cfg.TCPTimeout)
}

// attachedGone reports an attached rank whose stream ended: a leave when it
// said goodbye, else a loss for cause (causeClosed or causeSilent); to this
// leader's view, its other attached ranks and every other leader.
func (w *World) attachedGone(r int, left bool, cause byte) {
	w.mu.Lock()
	delete(w.links, r)
	if w.members[r].status != statusAlive {
		w.mu.Unlock()
		return
	}
	formed := w.formed
	// Silent before formation is fatal (goneLocked): the other leaders
	// are told as after formation, so that their ranks fail naming it.
	tell := formed || cause == causeSilent
	if w.closed && !left {
		// This leader is shutting down without leaving (Join failed,
		// or a test's crash): closing its streams is not news, and a
		// real crash would tell nobody either.
		w.mu.Unlock()
		return
	}
	w.goneLocked(r, left, cause)
	w.signalChangeLocked()
	var nodes []memberlist.Node
	if tell && w.ml != nil {
		nodes = w.nodesLocked()
	}
	w.mu.Unlock()
	if len(nodes) == 0 {
		return
	}
	msg := binary.AppendUvarint([]byte{kindGone}, uint64(r))
	var lb byte
	if left {
		lb = 1
	}
	msg = append(msg, lb, cause)
	// Directly to every leader (one packet each, so the news is there at
	// once), and through gossip as a backstop for a lost packet.
	for _, n := range nodes {
		if err := w.ml.SendBestEffort(&n, msg); err != nil {
			w.log.Debug().Err(err).Str("to", n.Address()).Msg("rendezvous: could not report an attached rank")
		}
	}
	w.bq.QueueBroadcast(simpleBroadcast(msg))
}

// simpleBroadcast is a gossip broadcast that never supersedes another.
type simpleBroadcast []byte

func (b simpleBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b simpleBroadcast) Message() []byte                       { return b }
func (b simpleBroadcast) Finished()                             {}

// nodesLocked returns the gossip members other than this one that are alive.
func (w *World) nodesLocked() []memberlist.Node {
	var nodes []memberlist.Node
	for r := range w.members {
		if m := &w.members[r]; r != w.cfg.Rank && m.leader == r && m.status == statusAlive && m.node() != nil {
			nodes = append(nodes, *m.node())
		}
	}
	return nodes
}

// handleGone applies a kindGone message from another leader.
func (w *World) handleGone(b []byte) {
	r, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+2 || r >= uint64(len(w.members)) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cause := b[n+1]
	if !w.formed && (cause == causeSilent || cause == causeRefused) && int(r) != w.cfg.Rank && w.members[r].leader != w.cfg.Rank {
		// Another leader's rank froze before the world formed, or a
		// member's gossip port refused a connection: the member that saw
		// it fails formation (goneLocked), and so does this one, naming
		// it, rather than waiting for the formation timeout. Before
		// formation this leader may not know the rank at all.
		w.setFatalLocked(&LostError{Rank: int(r), Host: w.members[r].host, Cause: w.causeErrorLocked(cause, int(r))})
		return
	}
	if int(r) == w.cfg.Rank || w.members[r].leader == w.cfg.Rank {
		return // this leader is the authority on its own ranks
	}
	if w.members[r].leader == int(r) {
		// A gossip member: memberlist's to judge, except for a refusal,
		// which is proof wherever it was seen (doubt.go).
		if cause == causeRefused && b[n] == 0 && w.members[r].status == statusAlive {
			w.verdictLocked(int(r), causeRefused)
		}
		return
	}
	w.goneLocked(int(r), b[n] == 1, cause)
}

// route delivers a message to world rank dest from this leader: locally,
// over dest's attach stream, or to dest's leader. A failed send is retried
// while dest is alive, bounded like Group.send: a leader that is just
// restarting its stream (or a relay leader whose reliable send timed out
// under load) gets another chance, a lost one does not stall the caller
// for longer than five TCP timeouts.
func (w *World) route(dest int, msg []byte) {
	if dest < 0 || dest >= len(w.members) {
		return
	}
	backoff := 20 * time.Millisecond
	giveUp := time.Now().Add(5 * w.cfg.TCPTimeout)
	for {
		err := w.deliver(dest, msg)
		if err == nil {
			return
		}
		w.mu.Lock()
		alive, closed := w.members[dest].status == statusAlive, w.closed
		w.mu.Unlock()
		if !alive || closed || time.Now().After(giveUp) {
			w.log.Debug().Err(err).Int("to", dest).Msg("rendezvous: relayed message dropped")
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// errDetached: this attached rank's stream to its leader is closed.
var errDetached = errors.New("rendezvous: not connected to the host leader")

// deliver sends msg to world rank dest once, by whatever path reaches it:
// an attached rank sends everything up to its leader; a leader delivers
// to itself, down an attach stream, straight to a leader over memberlist's
// reliable (TCP) channel, or wrapped in kindRelay to the leader of an
// attached rank elsewhere. The paths are read under mu and used after it
// is released, so a send never holds the lock memberlist's callbacks need.
func (w *World) deliver(dest int, msg []byte) error {
	if w.up != nil { // attached: everything goes through the leader
		if !w.up.enqueue(frameMsg, append(binary.AppendUvarint(nil, uint64(dest)), msg...)) {
			return errDetached
		}
		return nil
	}
	w.mu.Lock()
	m := &w.members[dest]
	l := w.links[dest]
	leader := m.leader
	node := w.nodeLocked(leader)
	w.mu.Unlock()
	switch {
	case dest == w.cfg.Rank:
		w.handleMsg(msg)
		return nil
	case l != nil:
		if !l.enqueue(frameMsg, append(binary.AppendUvarint(nil, uint64(dest)), msg...)) {
			return errDetached
		}
		return nil
	case leader == w.cfg.Rank:
		return fmt.Errorf("rendezvous: rank %d is not attached here", dest)
	case leader == dest:
		return w.ml.SendReliable(&node, msg)
	default:
		return w.ml.SendReliable(&node, append(binary.AppendUvarint([]byte{kindRelay}, uint64(dest)), msg...))
	}
}

// handleRelay is a kindRelay message arriving at this leader.
func (w *World) handleRelay(b []byte) {
	dest, n := binary.Uvarint(b)
	if n <= 0 || dest >= uint64(len(w.members)) {
		return
	}
	inner := b[n:]
	if int(dest) == w.cfg.Rank {
		w.handleMsg(inner)
		return
	}
	w.mu.Lock()
	l := w.links[int(dest)]
	w.mu.Unlock()
	if l == nil || !l.enqueue(frameMsg, append(binary.AppendUvarint(nil, dest), inner...)) {
		w.log.Debug().Int("to", int(dest)).Msg("rendezvous: message for a rank no longer attached dropped")
	}
}

// sendTableLocked hands the formed world to the attached ranks. It runs
// under mu at the moment of formation, so no member change can slip in
// between forming and the table; enqueue never blocks, so holding mu is
// safe.
func (w *World) sendTableLocked() {
	if len(w.links) == 0 {
		return
	}
	body := binary.AppendUvarint(nil, w.epoch)
	body = binary.AppendUvarint(body, uint64(len(w.members)))
	for r := range w.members {
		body = appendTableEntry(body, w.metaLocked(r), w.members[r].leader)
	}
	for _, l := range w.links {
		l.enqueue(frameTable, body)
	}
}

// localStateLocked is the leader's push-pull state: every attached rank it
// knows, its own and other leaders', so the seed's push at formation hands
// over the whole world.
func (w *World) localStateLocked() []byte {
	listed := func(r int) bool {
		m := &w.members[r]
		return m.leader != r && (m.status == statusAlive || m.pending)
	}
	n := 0
	for r := range w.members {
		if listed(r) {
			n++
		}
	}
	b := binary.AppendUvarint(nil, uint64(n))
	for r := range w.members {
		if listed(r) {
			b = appendTableEntry(b, w.metaLocked(r), w.members[r].leader)
		}
	}
	return b
}

// mergeStateLocked takes in another leader's attached ranks. An entry is
// news only about a rank this member has not seen: one it knows under
// another leader, pid or host is two processes claiming one rank (both
// leaders are told, and formation fails); news of this leader's own ranks
// is stale by construction (their hello is the authority) and ignored. A
// rank learned this way is pending until its leader is alive here.
func (w *World) mergeStateLocked(buf []byte) {
	_, err := walkTable(buf, newInterner(), func(e *tableEntry) {
		r := e.Rank
		if e.JobID != w.cfg.JobID || e.Generation != w.cfg.Generation || e.WorldSize != w.cfg.WorldSize || r < 0 || r >= len(w.members) ||
			e.leader < 0 || e.leader >= len(w.members) || e.leader == r {
			w.log.Warn().Int("member", r).Msg("rendezvous: ignoring an inconsistent table entry")
			return
		}
		ms := &w.members[r]
		claim := func() Claim {
			return Claim{Rank: r, Host: e.Host, Addr: attachedAddr(e.leader, e.PID), JobID: e.JobID, Size: e.WorldSize}
		}
		switch {
		case r == w.cfg.Rank || (ms.leader == r && ms.status != statusUnseen):
			w.setFatalLocked(&ConflictError{What: "two processes claim one rank", A: w.claimLocked(r), B: claim()},
				w.nodeLocked(e.leader))
		case ms.status == statusUnseen && !ms.pending:
			if e.leader == w.cfg.Rank {
				return // stale news of our own host: hello is the authority
			}
			w.setMemberLocked(e.Member, e.leader)
			ms.pending = true
			if w.members[e.leader].status == statusAlive && w.members[e.leader].leader == e.leader {
				w.markAliveLocked(r)
			}
		case ms.leader != e.leader || int(ms.pid) != e.PID || ms.host != e.Host:
			if ms.status == statusAlive || ms.pending {
				w.setFatalLocked(&ConflictError{What: "two processes claim one rank", A: w.claimLocked(r), B: claim()},
					w.nodeLocked(e.leader), w.nodeLocked(ms.leader))
			}
		}
	})
	if err != nil {
		w.log.Warn().Err(err).Msg("rendezvous: malformed member table")
	}
}

// goneChanLocked returns the channel that closes when member r leaves or
// dies: closed already when it has.
func (w *World) goneChanLocked(r int) <-chan struct{} {
	ms := &w.members[r]
	x := ms.ext()
	if x.gone == nil {
		x.gone = make(chan struct{})
		if ms.status == statusDead || ms.status == statusLeft {
			close(x.gone)
		}
	}
	return x.gone
}

// markAliveLocked counts rank r in and forms the world when it completes.
func (w *World) markAliveLocked(r int) {
	ms := &w.members[r]
	if ms.status == statusAlive {
		return
	}
	if ms.status == statusDead || ms.status == statusLeft {
		ms.resetGone()
	}
	ms.status, ms.pending = statusAlive, false
	w.alive++
	w.signalChangeLocked()
	if w.alive == w.cfg.WorldSize && !w.formed && w.fatal == nil {
		w.formed = true
		w.epoch = 1
		close(w.formedCh)
		w.sendTableLocked()
	}
}

// selfClaimLocked is this process's side of a conflict.
func (w *World) selfClaimLocked() Claim {
	return Claim{Rank: w.cfg.Rank, Host: w.cfg.Host, JobID: w.cfg.JobID, Size: w.cfg.WorldSize, Addr: "(this process)"}
}

// claimLocked describes what this member knows of rank r.
func (w *World) claimLocked(r int) Claim {
	if r == w.cfg.Rank {
		return w.selfClaimLocked()
	}
	if w.members[r].leader == r {
		n := w.nodeLocked(r)
		return claimOf(&n)
	}
	m := w.memberLocked(r)
	return Claim{Rank: r, Host: m.Host, Addr: m.Addr, JobID: m.JobID, Size: m.WorldSize}
}

// joinAttached is Join for a rank that is not its host's leader: attach to
// the leader and wait for the world table. The leader may not be listening
// yet (ranks start in any order), so dialing retries with jittered backoff
// until FormationTimeout; a name held by another user is reported at once,
// since no retry can reach the leader then.
func (w *World) joinAttached(ctx context.Context) error {
	cfg := &w.cfg
	net := cfg.AttachNet
	if net == nil {
		net = unixAttach{}
	}
	key, err := attachKey(cfg)
	if err != nil {
		return err
	}
	name := attachName(key, cfg.Host)
	deadline := time.NewTimer(cfg.FormationTimeout)
	defer deadline.Stop()
	backoff := 5 * time.Millisecond
	var lastErr error
	for {
		dctx, cancel := context.WithTimeout(ctx, cfg.TCPTimeout)
		c, err := net.Dial(dctx, name)
		cancel()
		if err == nil {
			if perr := checkPeer(c); perr != nil {
				// Another user holds the name: no retry will reach the
				// leader, so say so now instead of timing out.
				_ = c.Close()
				return w.attachError(nil, perr)
			}
			if err = handshake(w.patient(c), key, false, cfg.TCPTimeout); err == nil {
				err = writeFrame(c, frameHello, encodeMeta(w.self))
			}
			if err == nil {
				w.up = newLink(c, -1, w.cfg.AttachBeat)
				if cfg.Attached != nil {
					cfg.Attached()
				}
				break
			}
			_ = c.Close()
		}
		lastErr = err
		t := time.NewTimer(backoff/2 + rand.N(backoff))
		select {
		case <-t.C:
		case <-deadline.C:
			t.Stop()
			return w.attachError(nil, lastErr)
		case <-ctx.Done():
			t.Stop()
			return w.attachError(ctx.Err(), lastErr)
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
	w.wg.Go(w.up.writer)
	w.wg.Go(w.readLeader)
	progress := time.NewTicker(cfg.ProgressInterval)
	defer progress.Stop()
	for {
		select {
		case <-w.formedCh:
			w.log.Info().Uint64("epoch", w.Epoch()).Dur("took", time.Since(w.start)).Msg("rendezvous: world formed")
			return nil
		case <-w.fatalCh:
			return w.fatalErr()
		case <-progress.C:
			w.log.Debug().Msg("rendezvous: attached to the host leader; waiting for the world")
		case <-deadline.C:
			// The leader's own verdict (which ranks are missing) arrives
			// at about the same moment; prefer it.
			t := time.NewTimer(cfg.TCPTimeout)
			select {
			case <-w.fatalCh:
				t.Stop()
				return w.fatalErr()
			case <-w.formedCh:
				t.Stop()
				return nil
			case <-t.C:
			}
			return w.formationError(nil, nil)
		case <-ctx.Done():
			return w.formationError(ctx.Err(), nil)
		}
	}
}

func (w *World) fatalErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatal
}

// attachError: this rank never reached its leader.
func (w *World) attachError(ctxErr, last error) error {
	e := w.formationError(ctxErr, nil).(*FormationError)
	e.Seed = "host leader (local rank 0 on host " + w.cfg.Host + ")"
	e.SeedErr = fmt.Errorf("not attached: %w", last)
	if last == nil {
		e.SeedErr = errors.New("not attached")
	}
	return e
}

// applyTable forms the world from the host leader's table (with the
// leader's epoch), applied as it is read: every attached rank reads the
// whole table in one pass; a table that turns out malformed half way ends
// formation, naming it, rather than leaving this rank with half a world.
// A table of another size is logged and ignored.
func (w *World) applyTable(body []byte) {
	epoch, n := binary.Uvarint(body)
	if n <= 0 {
		w.log.Error().Msg("rendezvous: malformed world table from the host leader")
		return
	}
	if k, _ := binary.Uvarint(body[n:]); k != uint64(len(w.members)) {
		w.log.Error().Uint64("entries", k).Msg("rendezvous: world table from the host leader of another size")
		return
	}
	var foreign error // the first entry not of this world
	w.mu.Lock()
	_, err := scanTable(body[n:], newInterner(), func(e *tableEntry) {
		if e.Rank < 0 || e.Rank >= len(w.members) || e.leader < 0 || e.leader >= len(w.members) {
			return
		}
		if e.JobID != w.cfg.JobID || e.WorldSize != w.cfg.WorldSize || e.Generation != w.cfg.Generation {
			// The member table keeps only this world's job, size and
			// generation (memberState): an entry of another is an error,
			// never stored as this world's.
			if foreign == nil {
				foreign = fmt.Errorf("entry for rank %d is of job %q, size %d, generation %d (this world: %q, %d, %d)",
					e.Rank, e.JobID, e.WorldSize, e.Generation, w.cfg.JobID, w.cfg.WorldSize, w.cfg.Generation)
			}
			return
		}
		w.setMemberLocked(e.Member, e.leader)
		ms := &w.members[e.Rank]
		if e.Rank != w.cfg.Rank && ms.status != statusAlive {
			ms.status = statusAlive
			w.alive++
		}
	})
	if err == nil {
		err = foreign
	}
	if err != nil {
		w.setFatalLocked(fmt.Errorf("rendezvous: rank %d: malformed world table from the host leader: %w", w.cfg.Rank, err))
		w.mu.Unlock()
		return
	}
	w.setMemberLocked(w.self, w.members[w.cfg.Rank].leader)
	if !w.formed && w.fatal == nil {
		w.formed, w.epoch = true, epoch
		close(w.formedCh)
	}
	w.signalChangeLocked()
	w.mu.Unlock()
}

// readLeader runs an attached rank's side of the stream: the table forms
// the world (with the leader's epoch), gone and fatal frames update it,
// messages go to their groups. When the stream ends before formation the
// rank reports that its leader went; after it, every other member is lost
// with the leader (leaderGoneLocked).
func (w *World) readLeader() {
	c := w.up.conn
	bye, silent := false, false
	lr := newLeasedReader(c, &w.cfg, w.closedCh, 0)
	var silenceErr error
	lr.log = func(silent time.Duration, why string) {
		w.log.Info().Dur("silent", silent).Str("evidence", why).
			Msg("rendezvous: host leader silent past its lease but alive: starved, not frozen; waiting")
	}
	for {
		typ, body, err := lr.next()
		if err != nil {
			silenceErr = err
			// Silence past the lease: the leader is stopped or cannot
			// run, and its socket stays open; without the lease this
			// rank would wait on it for ever.
			silent = isSilence(err)
			break
		}
		switch typ {
		case frameTable:
			w.applyTable(body)
		case frameGone:
			r, n := binary.Uvarint(body)
			if n > 0 && len(body) >= n+2 && r < uint64(len(w.members)) {
				w.mu.Lock()
				w.goneLocked(int(r), body[n] == 1, body[n+1])
				w.mu.Unlock()
			}
		case frameMsg:
			if _, n := binary.Uvarint(body); n > 0 {
				w.handleMsg(body[n:])
			}
		case frameLeader:
			if r, n := binary.Uvarint(body); n > 0 && r < uint64(len(w.members)) {
				w.mu.Lock()
				w.leaderRank = int(r)
				w.mu.Unlock()
			}
		case frameFatal:
			if len(body) < 1 {
				continue
			}
			var err error = &relayedError{msg: string(body[1:]), kind: ErrFormation}
			switch body[0] {
			case 'C':
				err = &relayedError{msg: string(body[1:]), kind: ErrConflict}
			case 'L':
				if r, n := binary.Uvarint(body[1:]); n > 0 && r < uint64(len(w.members)) {
					err = &relayedLostError{relayedError{msg: string(body[1+n:]), kind: ErrFormation}, int(r)}
				}
			}
			w.mu.Lock()
			w.setFatalLocked(err)
			w.mu.Unlock()
		case frameBye:
			bye = true
		}
	}
	w.up.finish(w.cfg.TCPTimeout)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if silent {
		w.log.Warn().Int("leader", w.members[w.cfg.Rank].leader).Dur("lease", w.cfg.AttachLease).Err(silenceErr).
			Msg("rendezvous: host leader silent past its lease: declared lost (frozen or unresponsive)")
	}
	if !w.formed && silent && w.leaderRank >= 0 {
		// Frozen before the world formed: it will not come back in
		// time to matter, and waiting for the formation timeout would
		// hang the job for minutes. Named, so that this rank reports
		// its failure as the leader's doing.
		w.setFatalLocked(&LostError{Rank: w.leaderRank, Host: w.cfg.Host, Cause: ErrSilent})
		return
	}
	if !w.formed {
		w.setFatalLocked(&FormationError{
			Joined: 1, WorldSize: w.cfg.WorldSize, Rank: w.cfg.Rank,
			After: time.Since(w.start).Round(100 * time.Millisecond).String(),
			Seed:  "host leader (local rank 0 on host " + w.cfg.Host + ")",
			SeedErr: fmt.Errorf("the host leader (local rank 0 on host %s) closed the connection before the world formed",
				w.cfg.Host),
		})
		return
	}
	w.leaderGoneLocked(bye, silent)
}

// leaderGoneLocked: an attached rank lost its leader, and with it every
// other member: each group with another member fails (or, after the
// leader's goodbye, ends as left) naming the leader; silent says the
// leader's stream stayed open but fell silent past the lease.
func (w *World) leaderGoneLocked(left, silent bool) {
	var L int = -1
	for r := range w.members {
		if w.members[r].leader == r && w.members[r].host == w.cfg.Host && w.members[w.cfg.Rank].leader == r {
			L = r
		}
	}
	if L < 0 {
		L = w.members[w.cfg.Rank].leader
	}
	cause, why := causeLeaderConn, ErrLeaderClosed
	if silent {
		cause, why = causeSilent, ErrSilent
	}
	w.goneLocked(L, left, cause)
	lm := &w.members[L]
	for _, g := range w.groups {
		if g.n < 2 {
			continue
		}
		if left {
			if g.leaver == nil {
				g.leaver = &LeftError{Rank: L, Host: lm.host}
				close(g.left)
			}
		} else if g.err == nil && g.pending == nil {
			g.err = &LostError{Rank: L, Host: lm.host, Epoch: w.epoch, Cause: why}
			close(g.failed)
		}
	}
}
