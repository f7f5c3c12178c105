package rendezvous

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

var pid = os.Getpid()

// EventKind says what happened to a member after the world formed.
type EventKind int

const (
	// MemberLost: the member died or became unreachable. Every group that
	// contains it has failed.
	MemberLost EventKind = iota + 1
	// MemberLeft: the member left gracefully (World.Close). Not a failure.
	MemberLeft
)

func (k EventKind) String() string {
	switch k {
	case MemberLost:
		return "lost"
	case MemberLeft:
		return "left"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is a membership change after formation, as World.Events delivers it.
type Event struct {
	Kind  EventKind
	Rank  int
	Host  string
	Epoch uint64     // the epoch after the change
	Err   *LostError // for MemberLost: the same error Err() reports
	Time  time.Time  // when this member learnt it
}

// memberStatus is where a rank stands in this member's view.
type memberStatus uint8

const (
	statusUnseen memberStatus = iota
	statusAlive
	statusLeft
	statusDead
)

// memberState is the local view of one rank. Every rank holds one per
// member of the world, so its size is paid N times per process (N² in a
// world run in one process: 4,096² states of 144 bytes were 2.4 GB; they
// are 64 now). So it
// keeps only what differs between members: the job id, world size and
// generation are this world's (every member is checked to carry them
// before it is stored), the rank is the index, what only a few members
// need (a gossip member's node, a channel someone waits on) sits behind
// one pointer, and the small numbers are 32-bit (decodeMeta refuses
// larger ones). memberLocked rebuilds the Member.
type memberState struct {
	host     string // shared among a host's ranks when decoded from a table
	dataAddr string
	x        *memberExtra // nil until one of its fields is needed
	// leader is the rank of the gossip member that carries this rank: the
	// rank itself in flat mode and for host leaders, the host's leader for
	// an attached rank. x.node is set only when leader is the rank itself.
	leader int
	pid    int32
	local  int32 // local rank
	status memberStatus
	// leaving: the member said goodbye (kindBye), so its death is a leave.
	leaving bool
	// pending: the rank's Member is known from a table but its leader has
	// not been seen alive yet.
	pending bool
	// refused: a connection to its gossip port was refused, and its
	// verdict waits RefusedGrace for a goodbye (doubt.go).
	refused bool
}

// memberExtra is the part of a memberState that few members need.
type memberExtra struct {
	// node is a copy of a gossip member's memberlist node (name and
	// address, for sending); nil for an attached rank and for a rank not
	// seen yet. nodeLocked reads it.
	node *memberlist.Node
	// gone is closed when the member leaves or dies; waiters on a message
	// from it select on it. Made on first wait (goneChanLocked).
	gone chan struct{}
	// doubted is non-nil while memberlist has declared this gossip member
	// dead and the World still tries to reach it (doubt.go); it is closed
	// when the member answers again or is counted lost.
	doubted chan struct{}
}

// ext returns m's extra part, made if m had none.
func (m *memberState) ext() *memberExtra {
	if m.x == nil {
		m.x = &memberExtra{}
	}
	return m.x
}

// node is m's gossip node, nil when it has none.
func (m *memberState) node() *memberlist.Node {
	if m.x == nil {
		return nil
	}
	return m.x.node
}

// doubted is m's doubt channel, nil when no doubt runs.
func (m *memberState) doubted() chan struct{} {
	if m.x == nil {
		return nil
	}
	return m.x.doubted
}

// endDoubt closes and drops m's doubt channel, if any.
func (m *memberState) endDoubt() {
	if d := m.doubted(); d != nil {
		close(d)
		m.x.doubted = nil
	}
}

// resetGone drops m's gone channel, closed when m left or died: the next
// wait makes it again, open (m is back before formation).
func (m *memberState) resetGone() {
	if m.x != nil {
		m.x.gone = nil
	}
}

// memberLocked is what this member knows of rank r, as a Member. Addr is
// a gossip member's gossip address, or for an attached rank where it is
// attached ("attached to rank 3 (pid 4242)"); empty for this rank when it
// is attached, and for a rank not seen yet.
func (w *World) memberLocked(r int) Member {
	m, out := &w.members[r], w.metaLocked(r)
	switch n := m.node(); {
	case n != nil:
		out.Addr = n.Address()
	case m.leader != r && r != w.cfg.Rank:
		out.Addr = attachedAddr(m.leader, int(m.pid))
	}
	return out
}

// metaLocked is rank r's Member without Addr: what its metadata and a
// world table's entry carry.
func (w *World) metaLocked(r int) Member {
	m := &w.members[r]
	return Member{
		Rank: r, WorldSize: w.cfg.WorldSize, LocalRank: int(m.local), JobID: w.cfg.JobID,
		Generation: w.cfg.Generation, Host: m.host, DataAddr: m.dataAddr, PID: int(m.pid),
	}
}

// attachedAddr is an attached rank's Addr: where it is attached.
func attachedAddr(leader, pid int) string {
	return fmt.Sprintf("attached to rank %d (pid %d)", leader, pid)
}

// setMemberLocked stores what rank m.Rank advertised, with its leader;
// the caller has checked that m is of this world (job id, size and
// generation).
func (w *World) setMemberLocked(m Member, leader int) {
	ms := &w.members[m.Rank]
	ms.host, ms.dataAddr = m.Host, m.DataAddr
	ms.pid, ms.local, ms.leader = int32(m.PID), int32(m.LocalRank), leader
}

// nodeLocked returns a copy of gossip member r's node; the zero Node
// (no name: fail skips it, a send to it fails) when r has none.
func (w *World) nodeLocked(r int) memberlist.Node {
	if n := w.members[r].node(); n != nil {
		return *n
	}
	return memberlist.Node{}
}

// World is this rank's view of the whole job: who is which rank, where, and
// whether everyone is still there. It satisfies the Group interface of the
// collective layer as the group of all ranks. Its methods are safe for
// concurrent use unless a method says otherwise.
//
// A World's concerns live in separate files, all on this one type:
//
//	world.go     joining, formation, accessors, leaving (this file)
//	delegate.go  the gossip delegate: memberlist's callbacks, crash or leave
//	events.go    the event queue and its dispatcher
//	hier.go      host leaders: attached ranks and the relay between leaders
//	collect.go   barriers and all-gathers over the members' messages
//	group.go     groups (subsets of the world) and their failure state
//	gossipnet.go memberlist's transport with its accepted streams bounded
//
// Lock discipline. One mutex, mu, guards the member table, the formation
// state, the groups' membership and failure state, the collective slots
// and the event queue (the fields below it; Group's documented fields
// too). A method whose name ends in Locked needs mu held. memberlist calls
// into the World (delegate.go) from its own goroutines, possibly holding
// its own locks, so under mu nothing blocks and nothing calls memberlist:
// what must be sent is collected under mu and sent after it is released.
// The one lock taken inside mu is a link's (hier.go; enqueue never
// blocks), never the other way round. Channels hand news to waiters
// (formedCh, fatalCh, changed, a member's gone), never guarded data. Every
// goroutine a World starts is World.wg's, and Close waits for them.
//
// The type is not split further because the concerns share one table
// under one lock: a join, a loss or a relayed table changes membership,
// groups and waiting collectives in one step, and separate locks would
// need an order that memberlist's callbacks could not keep.
type World struct {
	cfg   Config
	log   zerolog.Logger
	self  Member
	start time.Time

	// ml is set once by Join before any method is called; memberlist's
	// callbacks that run during memberlist.Create must not use it.
	ml    *memberlist.Memberlist
	whole *Group

	// stop ends the event dispatcher; wg waits for it and for any other
	// goroutine the World starts.
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// events is the channel World.Events returns; only the dispatcher sends
	// on it and closes it.
	events chan Event
	// wake (capacity 1) tells the dispatcher that pending grew.
	wake chan struct{}

	// mu guards everything below. It is taken inside memberlist's callbacks,
	// so nothing may block while holding it (no sends, no memberlist calls).
	mu      sync.Mutex
	members []memberState // index = world rank
	alive   int           // members with statusAlive, this rank included
	formed  bool
	// formedCh is closed when all WorldSize ranks are first seen alive.
	formedCh chan struct{}
	// fatal is the error that stops formation (conflict, loss before
	// formation); fatalCh is closed when it is set. fatalTell lists the
	// nodes this member must inform, because it detected the problem.
	fatal     error
	fatalCh   chan struct{}
	fatalTell []memberlist.Node
	// leaderRank is an attached rank's host leader's world rank, from
	// its frameLeader (-1 until then).
	leaderRank int
	epoch      uint64
	closed     bool
	closedCh   chan struct{}
	groups     []*Group
	pending    []Event
	slots      map[slotKey]*slot
	// changed is closed and dropped whenever alive changes; nil until
	// someone waits for a change (changedLocked).
	changed chan struct{}
	seqs    map[uint64]uint64 // group key → next collective sequence number
	// notices holds the first notice per group and topic (notice.go).
	notices map[noticeKey]*noticeBox
	// lastPub is closed when the latest deferred publication of a loss
	// (publishLocked) is done; nil before the first.
	lastPub chan struct{}

	// Host leaders (hier.go). links are the attached ranks' streams, by
	// world rank, on a leader; attachedN counts hellos; localsReady is
	// closed once every local rank has attached.
	links       map[int]*link
	attachedN   int
	localsReady chan struct{}

	// ln is the leader's attach listener; up is an attached rank's stream
	// to its leader; bq queues gossip broadcasts (attached ranks' losses).
	// Set before any concurrent use, never changed after.
	ln net.Listener
	up *link
	bq *memberlist.TransmitLimitedQueue
	// mlAtomic is ml for callers that must not take mu.
	mlAtomic atomic.Pointer[memberlist.Memberlist]
	// stalls is the process's stall log (procStalls); tests give a
	// World its own.
	stalls *stallLog
}

// Join starts this rank's gossip member, joins the seed and waits until all
// WorldSize ranks of the job are alive in its view, then returns the World.
//
// It blocks until the world forms, the FormationTimeout passes, ctx ends, or
// the world cannot form (two processes claim one rank, a member of another
// job or world size appears, a member dies or leaves first); each of those
// returns an error that names ranks and hosts. On error nothing is left
// running. While waiting it logs "12/16 ranks joined" every
// ProgressInterval.
func Join(ctx context.Context, cfg Config) (*World, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := newWorld(cfg)
	if cfg.SecretDerived {
		w.log.Warn().Msg("rendezvous: no GORUN_SECRET: the gossip key is derived from public values, " +
			"so this job is not protected against other processes that know them")
	}
	if !cfg.leader() {
		w.wg.Go(w.dispatch)
		if err := w.joinAttached(ctx); err != nil {
			w.shutdown(false)
			return nil, err
		}
		return w, nil
	}
	if cfg.hierarchical() {
		if err := w.startLeader(); err != nil {
			return nil, err
		}
	}
	mc, err := w.memberlistConfig()
	if err != nil {
		return nil, err
	}
	var bt *boundedTransport
	if mc.Transport == nil {
		// memberlist's own transport, with its TCP streams bounded
		// (gossipnet.go); memberlist.Shutdown shuts it down.
		bt, err = newBoundedTransport(mc, mc.Logger)
		if err == nil {
			mc.Transport = bt
		}
	}
	if nt, ok := mc.Transport.(memberlist.NodeAwareTransport); ok && err == nil {
		// Refused connections are proof that a member is gone (doubt.go).
		// Both transports (ours, Config.Transport) are node-aware.
		mc.Transport = &watchedTransport{NodeAwareTransport: nt, refused: w.refused}
	}
	var ml *memberlist.Memberlist
	if err == nil {
		ml, err = memberlist.Create(mc)
		if err != nil && bt != nil {
			_ = bt.Shutdown()
		}
	}
	if err != nil {
		where := cfg.Seed
		if cfg.Rank != 0 {
			where = mc.BindAddr + ":0"
		}
		err = fmt.Errorf("rendezvous: rank %d: start gossip listener on %s: %w", cfg.Rank, where, err)
		w.tellLinksFatal(err)
		w.shutdown(false)
		return nil, err
	}
	w.mu.Lock()
	w.ml = ml
	w.mu.Unlock()
	w.mlAtomic.Store(ml)
	w.wg.Go(w.dispatch)
	if cfg.hierarchical() {
		// Bound first (the seed port must not sit unbound while the host
		// starts: another process may take it), joined once every local
		// rank has attached, so the first push-pull carries the whole
		// host.
		if err := w.waitLocals(ctx); err != nil {
			w.tellLinksFatal(err)
			w.shutdown(false)
			return nil, err
		}
	}
	if err := w.form(ctx); err != nil {
		w.tellLinksFatal(err)
		w.shutdown(false)
		return nil, err
	}
	return w, nil
}

// waitLocals waits until every local rank has attached to this leader.
func (w *World) waitLocals(ctx context.Context) error {
	deadline := time.NewTimer(w.cfg.FormationTimeout)
	defer deadline.Stop()
	progress := time.NewTicker(w.cfg.ProgressInterval)
	defer progress.Stop()
	for {
		select {
		case <-w.localsReady:
			return nil
		case <-w.fatalCh:
			return w.fatalErr()
		case <-progress.C:
			w.mu.Lock()
			n := w.attachedN
			w.mu.Unlock()
			w.log.Info().Msgf("rendezvous: %d/%d local ranks attached", n+1, w.cfg.LocalWorldSize)
		case <-deadline.C:
			return w.localsError(nil)
		case <-ctx.Done():
			return w.localsError(ctx.Err())
		}
	}
}

// localsError is waitLocals' formation error. When every rank of the job
// is on this host, the ranks that did not attach are exactly the missing
// ones. Otherwise this leader, which never joined the gossip, can say only
// how many of its host's ranks attached: a rank attaches with its world
// rank, and one that never did could be any of the host's others.
func (w *World) localsError(ctxErr error) error {
	e := w.formationError(ctxErr, nil).(*FormationError)
	if w.cfg.LocalWorldSize >= w.cfg.WorldSize {
		return e
	}
	w.mu.Lock()
	e.LocalsAttached, e.LocalSize, e.Host = w.attachedN+1, w.cfg.LocalWorldSize, w.cfg.Host
	w.mu.Unlock()
	return e
}

// tellLinksFatal passes the error that ends formation to the attached ranks.
func (w *World) tellLinksFatal(err error) {
	body := []byte{'F'}
	var lost interface{ LostWorldRank() int }
	switch {
	case errors.Is(err, ErrConflict):
		body[0] = 'C'
	case errors.As(err, &lost) && lost.LostWorldRank() >= 0:
		// A loss before formation: the attached ranks fail because of
		// that rank, and say so to their launcher.
		body = binary.AppendUvarint([]byte{'L'}, uint64(lost.LostWorldRank()))
	}
	body = append(body, err.Error()...)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.links {
		l.enqueue(frameFatal, body)
	}
}

func newWorld(cfg Config) *World {
	self := cfg.meta()
	w := &World{
		cfg:      cfg,
		self:     self,
		start:    time.Now(),
		stop:     make(chan struct{}),
		events:   make(chan Event, 64),
		wake:     make(chan struct{}, 1),
		members:  make([]memberState, cfg.WorldSize),
		formedCh: make(chan struct{}),
		fatalCh:  make(chan struct{}),
		closedCh: make(chan struct{}),
		slots:    make(map[slotKey]*slot),
		seqs:     make(map[uint64]uint64),
		notices:  make(map[noticeKey]*noticeBox),
		links:    make(map[int]*link),

		localsReady: make(chan struct{}),
		leaderRank:  -1,
		stalls:      &procStalls,
	}
	w.log = cfg.Logger.With().Int("rank", cfg.Rank).Str("host", cfg.Host).Int("world", cfg.WorldSize).Logger()
	for r := range w.members {
		w.members[r].leader = r
	}
	if cfg.hierarchical() && !cfg.leader() {
		// Until the table arrives, this rank knows only itself.
		w.setMemberLocked(self, cfg.Rank)
		w.members[cfg.Rank].status = statusAlive
		w.alive = 1
	}
	// The whole world is a group like any other, so failure, barriers and
	// splits have one implementation.
	w.whole = w.newGroupLocked(nil)
	return w
}

// memberlistConfig completes the memberlist configuration with delegates,
// key, logger and addresses.
func (w *World) memberlistConfig() (*memberlist.Config, error) {
	cfg := &w.cfg
	mc := cfg.memberlistConfig()
	d := &delegate{w: w, meta: encodeMeta(w.self)}
	mc.Delegate, mc.Events, mc.Conflict = d, d, d
	w.bq = &memberlist.TransmitLimitedQueue{
		// Called by memberlist with its node lock held: must not take
		// w.mu (NotifyLeave takes them in the other order).
		NumNodes: func() int {
			if ml := w.mlAtomic.Load(); ml != nil {
				return ml.NumMembers()
			}
			return 1
		},
		RetransmitMult: cfg.RetransmitMult,
	}
	key, err := gossipKey(cfg.Secret, cfg.JobID)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: derive gossip key: %w", err)
	}
	mc.SecretKey = key
	mc.Logger = newMemberlistLogger(w.log)
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
		return mc, nil
	}
	a, err := cfg.addresses()
	if err != nil {
		return nil, err
	}
	mc.BindAddr, mc.BindPort = a.bindIP, a.port
	mc.AdvertiseAddr, mc.AdvertisePort = a.advertiseIP, a.port
	return mc, nil
}

// form joins the seed and waits for the world; see Join.
func (w *World) form(ctx context.Context) error {
	cfg := &w.cfg
	deadline := time.NewTimer(cfg.FormationTimeout)
	defer deadline.Stop()
	progress := time.NewTicker(cfg.ProgressInterval)
	defer progress.Stop()

	if cfg.Rank != 0 {
		// The seed may not be listening yet (rank 0 starts at the same
		// moment as everyone else) or may be busy: retry with jittered
		// exponential backoff. Joins refused for a wrong key or label look
		// the same from here (the seed drops the connection) and end in the
		// same timeout, whose message carries the last error.
		backoff := 10 * time.Millisecond
		for {
			_, err := w.ml.Join([]string{cfg.Seed})
			if err == nil {
				break
			}
			w.log.Debug().Err(err).Str("seed", cfg.Seed).Msg("rendezvous: join seed failed; retrying")
			wait := time.NewTimer(backoff/2 + rand.N(backoff))
			select {
			case <-wait.C:
			case <-w.fatalCh:
				wait.Stop()
				return w.fail()
			case <-deadline.C:
				wait.Stop()
				return w.formationError(nil, err)
			case <-ctx.Done():
				wait.Stop()
				return w.formationError(ctx.Err(), err)
			case <-progress.C:
				wait.Stop()
				w.log.Info().Str("seed", cfg.Seed).Err(err).Msg("rendezvous: still trying to reach the seed")
			}
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	}

	rejoin := time.NewTimer(cfg.RejoinInterval)
	defer rejoin.Stop()
	pulls := 0
	for {
		select {
		case <-w.formedCh:
			w.mu.Lock()
			to := w.pushTargetsLocked()
			w.mu.Unlock()
			if len(to) > 0 {
				// In the background: this member's own world has
				// formed, and the pushes only speed up the others'.
				w.wg.Go(func() { w.pushTable(to) })
			}
			w.mu.Lock()
			epoch := w.epoch
			w.mu.Unlock()
			w.log.Info().Uint64("epoch", epoch).Dur("took", time.Since(w.start)).Msg("rendezvous: world formed")
			return nil
		case <-w.fatalCh:
			return w.fail()
		case <-rejoin.C:
			// Backstop for a push that did not arrive (from the seed or
			// from a relay that died or failed, pushPlan): pull a member
			// table ourselves, alternately from a random member (every
			// pull merges both tables, so any member helps, and hundreds
			// of waiting ranks do not all hit the seed's limit of 128
			// concurrent push-pulls at once) and from the seed, whose
			// table is complete once it has formed. Pulls come 0.5-1.5
			// RejoinInterval apart, so a lost push delays this rank by
			// at most 3 RejoinInterval after the seed formed (plus the
			// pull itself), and never stalls the world.
			//
			// Every third pull goes to a member gossip declared dead
			// (heldDeadPeer): before formation such a member is waited
			// for, not lost, on the ground that a live one refutes. But
			// it refutes only what it hears: memberlist gossips a death
			// to the dead member for GossipToTheDeadTime only, a member
			// that has formed pulls no more, and nobody probes a dead
			// member; a member starved past that window (4,096 ranks in
			// one process, notes/scale.md) stayed dead in every view
			// while its own world had formed, and formation timed out.
			// A pull hands it our view, in which it is dead, so it
			// refutes; the next pull by anyone brings the refutation
			// back over TCP, whatever became of its gossip. The pulls
			// are the ones a waiting member makes anyway, retargeted.
			pulls++
			if peer := w.pullPeer(pulls); peer != "" {
				if _, err := w.ml.Join([]string{peer}); err != nil {
					w.log.Debug().Err(err).Str("peer", peer).Msg("rendezvous: member table pull failed")
				}
			}
			// Jittered, so that ranks that joined together do not pull
			// together.
			rejoin.Reset(cfg.RejoinInterval/2 + rand.N(cfg.RejoinInterval))
		case <-progress.C:
			w.mu.Lock()
			n := w.alive
			w.mu.Unlock()
			ev := w.log.Debug()
			if cfg.Rank == 0 {
				ev = w.log.Info()
			}
			ev.Msgf("rendezvous: %d/%d ranks joined", n, cfg.WorldSize)
		case <-deadline.C:
			return w.formationError(nil, nil)
		case <-ctx.Done():
			return w.formationError(ctx.Err(), nil)
		}
	}
}

// pullPeer is the member the n-th table pull of a waiting member goes to
// (as a join address): of every three, one to a random member known
// alive, one to the seed, one to a random member held dead
// (heldDeadPeerLocked), or to a random member when none is. "" when
// there is nobody to pull from: the seed pulls only from members held
// dead (its own table is the one the others pull).
func (w *World) pullPeer(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n%3 == 0 {
		if p := w.heldDeadPeerLocked(); p != "" {
			return p
		}
	}
	switch {
	case w.cfg.Rank == 0:
		return ""
	case n%3 == 2:
		return w.cfg.Seed
	}
	return w.randomPeerLocked()
}

// heldDeadPeerLocked returns a random gossip member that memberlist
// declared dead before the world formed and that did not leave (the
// World waits for it to refute: goneLocked), as a join address; "" when
// there is none.
func (w *World) heldDeadPeerLocked() string {
	var held []string
	for r := range w.members {
		m := &w.members[r]
		if n := m.node(); r != w.cfg.Rank && m.leader == r && m.status == statusDead && !m.leaving && n != nil {
			held = append(held, n.Name+"/"+n.Address())
		}
	}
	if len(held) == 0 {
		return ""
	}
	return held[rand.N(len(held))]
}

// randomPeerLocked returns a random member other than this rank and the
// seed that this rank knows alive (as a "name/addr" join address), or
// the seed when it knows none.
func (w *World) randomPeerLocked() string {
	var known []string
	for r := range w.members {
		m := &w.members[r]
		if n := m.node(); r != w.cfg.Rank && r != 0 && m.leader == r && m.status == statusAlive && n != nil {
			known = append(known, n.Name+"/"+n.Address())
		}
	}
	if len(known) == 0 {
		return w.cfg.Seed
	}
	return known[rand.N(len(known))]
}

// pushPlan returns the ranks that gossip member self pushes the complete
// member table to once it has formed. others are the world's gossip
// members other than the seed (rank 0) in ascending rank order, which every
// formed member's table lists alike, so every rank can compute who relays
// for whom; limit is Config.PushConcurrency.
//
// The rule. Up to 2·limit others, the seed pushes to all of them and nobody
// else pushes: the direct push then takes at most two rounds of limit
// concurrent push-pulls, no more than a relayed one (the seed's round, a
// relay's formation, the relay's round), and its bytes are small (32 hosts
// × 8 ranks: ~10 KB of state, 32 times). Above it, with k = ⌈√len(others)⌉,
// the first k others are relays: the seed pushes to them, and relay i, once
// formed (normally by the seed's push), pushes to the i-th of k contiguous
// blocks of the rest, ⌈(len(others)−k)/k⌉ each (the last ones shorter or
// empty). Each other is pushed to once, and no member pushes the whole
// state more than about √H times, where the seed alone pushed it H times:
// at 1,000 hosts × 8 ranks ~460 MB from one process (notes/scale-sim.md).
// A relay that never pushes delays only its block, by at most what the
// rejoin pulls take (form).
func pushPlan(self int, others []int, limit int) []int {
	if len(others) <= 2*limit {
		if self == 0 {
			return others
		}
		return nil
	}
	k := 1
	for k*k < len(others) {
		k++
	}
	if self == 0 {
		return others[:k]
	}
	i := slices.Index(others[:k], self)
	if i < 0 {
		return nil
	}
	rest := others[k:]
	per := (len(rest) + k - 1) / k
	return rest[min(i*per, len(rest)):min((i+1)*per, len(rest))]
}

// pushTarget is a member a push goes to: its rank and join address.
type pushTarget struct {
	rank int
	addr string
}

// pushTargetsLocked applies pushPlan to this member's table: the alive
// gossip members it pushes to now that it has formed.
func (w *World) pushTargetsLocked() []pushTarget {
	var others []int
	for r := 1; r < len(w.members); r++ {
		if w.members[r].leader == r {
			others = append(others, r)
		}
	}
	var to []pushTarget
	for _, r := range pushPlan(w.cfg.Rank, others, w.cfg.PushConcurrency) {
		m := &w.members[r]
		if n := m.node(); r != w.cfg.Rank && m.status == statusAlive && n != nil {
			to = append(to, pushTarget{rank: r, addr: n.Name + "/" + n.Address()})
		}
	}
	return to
}

// pushTable is fast formation's push: a member that has just seen every
// rank runs a push-pull with each member pushPlan gives it, which hands
// each one the complete member table at once instead of waiting for N
// alive messages to be gossiped to it (unreliable at 16 ranks, 44 s at 64:
// notes/dependencies.md). A failed push is only logged: that rank's own
// periodic rejoin covers it. It runs beside the member's program and stops
// pushing once the World closes.
func (w *World) pushTable(to []pushTarget) {
	var g errgroup.Group
	g.SetLimit(w.cfg.PushConcurrency)
	for _, t := range to {
		if w.isClosing() {
			break
		}
		g.Go(func() error {
			if h := w.cfg.pushHook; h != nil && !h(w.cfg.Rank, t.rank) {
				return nil
			}
			if _, err := w.ml.Join([]string{t.addr}); err != nil {
				w.log.Debug().Err(err).Str("to", t.addr).Msg("rendezvous: push member table failed")
			}
			return nil
		})
	}
	_ = g.Wait()
}

// isClosing reports whether Close (or a failed Join) has begun.
func (w *World) isClosing() bool {
	select {
	case <-w.closedCh:
		return true
	default:
		return false
	}
}

// fail returns the fatal error after telling the members that must know it.
func (w *World) fail() error {
	w.mu.Lock()
	err, tell := w.fatal, w.fatalTell
	w.fatalTell = nil
	if len(tell) > 0 {
		// The detector tells everyone it knows, so the whole job fails
		// with the same message instead of timing out.
		tell = append(tell, w.nodesLocked()...)
	}
	ml := w.ml
	w.mu.Unlock()
	if ce, ok := err.(*ConflictError); ok && len(tell) > 0 && ml != nil {
		msg := encodeFatal(ce)
		var g errgroup.Group
		g.SetLimit(w.cfg.PushConcurrency)
		for _, n := range tell {
			g.Go(func() error {
				if n.Name == "" {
					return nil
				}
				if err := ml.SendReliable(&n, msg); err != nil {
					w.log.Debug().Err(err).Str("to", n.Address()).Msg("rendezvous: could not report conflict")
				}
				return nil
			})
		}
		_ = g.Wait()
	}
	return err
}

// formationError describes a formation that ran out of time.
func (w *World) formationError(ctxErr, seedErr error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := &FormationError{
		Joined: w.alive, WorldSize: w.cfg.WorldSize, Cause: ctxErr,
		After: time.Since(w.start).Round(100 * time.Millisecond).String(),
		Seed:  w.cfg.Seed, Rank: w.cfg.Rank,
	}
	if seedErr != nil && w.alive <= 1 {
		e.SeedErr = seedErr
	}
	if w.members[w.cfg.Rank].status != statusAlive {
		// A host leader still waiting for its local ranks has not
		// started gossip yet; it is present all the same.
		e.Joined++
	}
	for r := range w.members {
		m := &w.members[r]
		if m.status == statusAlive || r == w.cfg.Rank {
			continue
		}
		host := m.host
		if host == "" && w.cfg.RankHosts != nil {
			host = w.cfg.RankHosts[r]
		}
		e.Missing = append(e.Missing, Missing{Rank: r, Host: host})
	}
	return e
}

// setFatalLocked records the first error that stops formation.
func (w *World) setFatalLocked(err error, tell ...memberlist.Node) {
	if w.fatal != nil || w.formed {
		return
	}
	w.fatal, w.fatalTell = err, tell
	close(w.fatalCh)
}

// Rank returns this process's world rank.
func (w *World) Rank() int { return w.cfg.Rank }

// Size returns the number of ranks in the world.
func (w *World) Size() int { return w.cfg.WorldSize }

// GlobalRank is the identity for the world group.
func (w *World) GlobalRank(r int) int { return r }

// Host returns the host world rank r advertised.
func (w *World) Host(r int) string { return w.whole.Host(r) }

// DataAddr returns the data-plane address world rank r advertised.
func (w *World) DataAddr(r int) string { return w.whole.DataAddr(r) }

// Failed is closed when any member is lost (never on a graceful leave).
func (w *World) Failed() <-chan struct{} { return w.whole.Failed() }

// Err is nil until Failed is closed; then the *LostError of the first loss.
func (w *World) Err() error { return w.whole.Err() }

// JobID returns the job id.
func (w *World) JobID() string { return w.cfg.JobID }

// Epoch is 1 once the world formed and increases by one with every member
// lost or left since. Two members that report the same epoch have seen the
// same number of changes (not necessarily at the same moment).
func (w *World) Epoch() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch
}

// Members returns every rank's advertised facts, indexed by world rank,
// including members that have since left or been lost.
func (w *World) Members() []Member {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Member, len(w.members))
	for r := range w.members {
		out[r] = w.memberLocked(r)
	}
	return out
}

// Alive returns how many ranks are alive in this member's view.
func (w *World) Alive() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.alive
}

// Events delivers membership changes after formation, in the order this
// member learnt them. Events are queued without bound while nobody reads,
// so reading is optional. The channel is closed by Close.
func (w *World) Events() <-chan Event { return w.events }

// Barrier blocks until every rank of the world has called Barrier (the same
// number of times), ctx ends, or a member is lost or leaves first; then it
// returns the error naming that member. Barriers on the world must not be
// called concurrently with each other (they are serialised).
func (w *World) Barrier(ctx context.Context) error { return w.whole.Barrier(ctx) }

// AllGather is Group.AllGather on the whole world.
func (w *World) AllGather(ctx context.Context, payload []byte) ([][]byte, error) {
	return w.whole.AllGather(ctx, payload)
}

// Split partitions the world like MPI_Comm_split: every rank calls it with
// its color and key (collectively, in the same order as other collectives on
// the world); ranks with the same color form a group, numbered by key, ties
// broken by world rank. A color of Undefined returns a nil group. It costs
// one all-gather of (color, key) over gossip messages; no member decides for
// the others.
func (w *World) Split(ctx context.Context, color, key int) (*Group, error) {
	return w.whole.Split(ctx, color, key)
}

// Group returns the group of the given world ranks, numbered in the order
// given. It is local and deterministic: every member that asks for the same
// list gets the same group, with no message exchanged. The caller must be
// in the list (ErrNotMember otherwise).
func (w *World) Group(ranks []int) (*Group, error) {
	seen := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if r < 0 || r >= w.cfg.WorldSize {
			return nil, fmt.Errorf("rendezvous: group: rank %d not in world of %d", r, w.cfg.WorldSize)
		}
		if seen[r] {
			return nil, fmt.Errorf("rendezvous: group: rank %d listed twice", r)
		}
		seen[r] = true
	}
	if !seen[w.cfg.Rank] {
		return nil, fmt.Errorf("%w: rank %d not in %v", ErrNotMember, w.cfg.Rank, ranks)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.newGroupLocked(append([]int(nil), ranks...)), nil
}

// Close leaves the world gracefully (other members see MemberLeft, not a
// failure), stops gossip and releases everything blocked on this World with
// ErrClosed. It is idempotent and returns after every goroutine of the
// World has exited.
func (w *World) Close() error {
	w.closeOnce.Do(func() { w.closeErr = w.shutdown(true) })
	return w.closeErr
}

func (w *World) shutdown(leave bool) error {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.closedCh)
	}
	ml := w.ml
	w.mu.Unlock()
	var err error
	if w.up != nil {
		// An attached rank: its goodbye tells the leader this is a leave,
		// the leader tells everyone else.
		if leave {
			w.up.enqueue(frameBye, nil)
			w.up.shut()
			// The leader closes its end on the goodbye; readLeader
			// then closes ours. Bounded in case it never does.
			_ = w.up.conn.SetReadDeadline(time.Now().Add(w.cfg.TCPTimeout))
		} else {
			_ = w.up.conn.Close() // as a crash would
		}
	}
	if leave && ml != nil {
		// A leader first lets its attached ranks leave (they normally
		// close right after the same final barrier), so their goodbyes
		// travel through it; it waits at most LeaveGrace.
		w.waitLinks(w.cfg.LeaveGrace)
		// Say goodbye to every member directly, one UDP packet each,
		// before memberlist's leave message. That message spreads by
		// gossip, which can miss a member (measured: 1 in a few runs at 8
		// members), and a member that misses it later finds this one dead
		// and reports a failure that was a normal exit. O(size) packets
		// per leaver: trivial per host even at 1024 hosts.
		w.sayGoodbye()
		// Queue the leave message without memberlist's blocking wait (see
		// Config.LeaveLinger); gossip carries it while we linger.
		_ = ml.Leave(time.Nanosecond)
		t := time.NewTimer(w.cfg.LeaveLinger)
	linger:
		for {
			w.mu.Lock()
			others, changed := w.alive, w.changedLocked()
			if w.members[w.cfg.Rank].status == statusAlive {
				others--
			}
			w.mu.Unlock()
			if others <= 0 {
				break
			}
			select {
			case <-t.C:
				break linger
			case <-changed:
			}
		}
		t.Stop()
	}
	if ml != nil {
		if serr := ml.Shutdown(); serr != nil && err == nil {
			err = fmt.Errorf("rendezvous: rank %d shutdown: %w", w.cfg.Rank, serr)
		}
	}
	if w.ln != nil {
		_ = w.ln.Close()
		w.mu.Lock()
		for _, l := range w.links {
			if leave {
				l.enqueue(frameBye, nil)
			}
			l.shut()
			// serveAttached closes the stream once the rank closes its
			// end, or after this bound.
			_ = l.conn.SetReadDeadline(time.Now().Add(w.cfg.TCPTimeout))
		}
		w.mu.Unlock()
	}
	close(w.stop)
	w.wg.Wait()
	return err
}

// waitLinks waits until no rank is attached here, at most d.
func (w *World) waitLinks(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		w.mu.Lock()
		n, changed := len(w.links), w.changedLocked()
		w.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-t.C:
			return
		case <-changed:
		}
	}
}

// sayGoodbye tells every member still alive in our view that this rank is
// leaving; see shutdown.
func (w *World) sayGoodbye() {
	msg := binary.AppendUvarint([]byte{kindBye}, uint64(w.cfg.Rank))
	w.mu.Lock()
	nodes := w.nodesLocked()
	w.mu.Unlock()
	for _, n := range nodes {
		if err := w.ml.SendBestEffort(&n, msg); err != nil {
			w.log.Debug().Err(err).Str("to", n.Address()).Msg("rendezvous: goodbye not sent")
		}
	}
}
