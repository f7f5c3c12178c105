package rendezvous

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
type memberStatus int

const (
	statusUnseen memberStatus = iota
	statusAlive
	statusLeft
	statusDead
)

// memberState is the local view of one rank.
type memberState struct {
	Member
	status memberStatus
	node   memberlist.Node // a copy: name and address, for sending
	// gone is closed when the member leaves or dies; waiters on a message
	// from it select on it.
	gone chan struct{}
	// leaving: the member said goodbye (kindBye), so its death is a leave.
	leaving bool
	// leader is the rank of the gossip member that carries this rank: the
	// rank itself in flat mode and for host leaders, the host's leader for
	// an attached rank. node is set only when leader is the rank itself.
	leader int
	// pending: the rank's Member is known from a table but its leader has
	// not been seen alive yet.
	pending bool
}

// World is this rank's view of the whole job: who is which rank, where, and
// whether everyone is still there. It satisfies the Group interface of the
// collective layer as the group of all ranks. Its methods are safe for
// concurrent use unless a method says otherwise.
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
	epoch     uint64
	closed    bool
	closedCh  chan struct{}
	groups    []*Group
	pending   []Event
	slots     map[slotKey]*slot
	// changed is closed and replaced whenever alive changes.
	changed chan struct{}
	seqs    map[uint64]uint64 // group key → next collective sequence number

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
			return w.formationError(nil, nil)
		case <-ctx.Done():
			return w.formationError(ctx.Err(), nil)
		}
	}
}

// tellLinksFatal passes the error that ends formation to the attached ranks.
func (w *World) tellLinksFatal(err error) {
	kind := byte('F')
	if errors.Is(err, ErrConflict) {
		kind = 'C'
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.links {
		l.enqueue(frameFatal, append([]byte{kind}, err.Error()...))
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
		changed:  make(chan struct{}),
		fatalCh:  make(chan struct{}),
		closedCh: make(chan struct{}),
		slots:    make(map[slotKey]*slot),
		seqs:     make(map[uint64]uint64),
		links:    make(map[int]*link),

		localsReady: make(chan struct{}),
	}
	w.log = cfg.Logger.With().Int("rank", cfg.Rank).Str("host", cfg.Host).Int("world", cfg.WorldSize).Logger()
	for r := range w.members {
		w.members[r].Rank = r
		w.members[r].gone = make(chan struct{})
		w.members[r].leader = r
	}
	if cfg.hierarchical() && !cfg.leader() {
		// Until the table arrives, this rank knows only itself.
		w.members[cfg.Rank].Member = self
		w.members[cfg.Rank].status = statusAlive
		w.alive = 1
	}
	all := make([]int, cfg.WorldSize)
	for r := range all {
		all[r] = r
	}
	// The whole world is a group like any other, so failure, barriers and
	// splits have one implementation.
	w.whole = w.newGroupLocked(all)
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
	for {
		select {
		case <-w.formedCh:
			if cfg.Rank == 0 {
				w.pushTable(ctx)
			}
			w.mu.Lock()
			epoch := w.epoch
			w.mu.Unlock()
			w.log.Info().Uint64("epoch", epoch).Dur("took", time.Since(w.start)).Msg("rendezvous: world formed")
			return nil
		case <-w.fatalCh:
			return w.fail()
		case <-rejoin.C:
			// Backstop for a push from the seed that did not arrive: pull
			// a member table ourselves, from the seed or from a random
			// member (every pull merges both tables, so any member
			// helps), so that hundreds of waiting ranks do not all hit
			// the seed's limit of 128 concurrent push-pulls at once.
			if cfg.Rank != 0 {
				peer := w.randomPeer()
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

// randomPeer returns the seed half of the time, else a random other member
// this rank knows (as a "name/addr" join address).
func (w *World) randomPeer() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rand.N(2) == 0 {
		return w.cfg.Seed
	}
	var known []string
	for r := range w.members {
		m := &w.members[r]
		if r != w.cfg.Rank && r != 0 && m.leader == r && m.status == statusAlive {
			known = append(known, m.node.Name+"/"+m.node.Address())
		}
	}
	if len(known) == 0 {
		return w.cfg.Seed
	}
	return known[rand.N(len(known))]
}

// pushTable is the seed's half of fast formation: once it sees every rank,
// it runs a push-pull with each of them, which hands each one the complete
// member table at once instead of waiting for N alive messages to be
// gossiped to it (unreliable at 16 ranks, 44 s at 64: notes/dependencies.md).
// A failed push is only logged: that rank's own periodic rejoin covers it.
func (w *World) pushTable(ctx context.Context) {
	w.mu.Lock()
	var addrs []string
	for r := range w.members {
		m := &w.members[r]
		if r != w.cfg.Rank && m.leader == r && m.status == statusAlive {
			addrs = append(addrs, m.node.Name+"/"+m.node.Address())
		}
	}
	w.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(w.cfg.PushConcurrency)
	for _, a := range addrs {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if _, err := w.ml.Join([]string{a}); err != nil {
				w.log.Debug().Err(err).Str("to", a).Msg("rendezvous: push member table failed")
			}
			return nil
		})
	}
	_ = g.Wait()
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
		host := m.Host
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
		out[r] = w.members[r].Member
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
			others, changed := w.alive, w.changed
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
		n, changed := len(w.links), w.changed
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

// dispatch delivers queued events to the Events channel, so that memberlist's
// callbacks never block on a reader.
func (w *World) dispatch() {
	defer close(w.events)
	for {
		w.mu.Lock()
		evs := w.pending
		w.pending = nil
		w.mu.Unlock()
		for _, e := range evs {
			select {
			case w.events <- e:
			case <-w.stop:
				return
			}
		}
		select {
		case <-w.wake:
		case <-w.stop:
			return
		}
	}
}

// signalChangeLocked wakes everyone waiting for a change of alive.
func (w *World) signalChangeLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// queueEventLocked hands an event to the dispatcher.
func (w *World) queueEventLocked(e Event) {
	w.pending = append(w.pending, e)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

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

// LocalState carries a leader's attached ranks (hier.go); nothing in flat
// mode, where node metadata says everything.
func (d *delegate) LocalState(join bool) []byte {
	if !d.w.cfg.hierarchical() {
		return nil
	}
	d.w.mu.Lock()
	defer d.w.mu.Unlock()
	return d.w.localStateLocked()
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) == 0 || !d.w.cfg.hierarchical() {
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
	var conflict *ConflictError
	switch {
	case err != nil:
		conflict = &ConflictError{What: "member with unreadable metadata", A: self, B: claimOf(n)}
	case m.JobID != w.cfg.JobID:
		conflict = &ConflictError{What: "member of another job", A: self, B: claimOf(n)}
	case m.WorldSize != w.cfg.WorldSize:
		conflict = &ConflictError{What: "member started with another world size", A: self, B: claimOf(n)}
	case m.Rank < 0 || m.Rank >= w.cfg.WorldSize || n.Name != nodeName(m.JobID, m.Rank):
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
			*n, w.members[ms.leader].node)
		return
	}
	switch ms.status {
	case statusAlive:
		// memberlist reports a node again only after it was gone; seeing
		// it alive twice means two identities for one rank.
		if ms.node.Address() != n.Address() {
			w.setFatalLocked(&ConflictError{What: "two processes claim one rank", A: claimOf(&ms.node), B: claimOf(n)}, *n)
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
		ms.gone = make(chan struct{})
	}
	m.Addr = n.Address()
	ms.Member = m
	ms.node = memberlist.Node{Name: n.Name, Addr: append([]byte(nil), n.Addr...), Port: n.Port, Meta: append([]byte(nil), n.Meta...)}
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
	if w.members[r].status != statusAlive {
		return
	}
	left := nodeState(n) == memberlist.StateLeft || w.members[r].leaving
	w.goneLocked(r, left, causeDead)
	if r == w.cfg.Rank {
		return
	}
	// A leader takes its host's attached ranks with it.
	for q := range w.members {
		if q != r && w.members[q].leader == r {
			w.goneLocked(q, left, causeLeader)
		}
	}
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
	close(ms.gone)
	w.signalChangeLocked()
	if r == w.cfg.Rank {
		// Our own leave, echoed by memberlist: not news to anyone here.
		ms.status = statusLeft
		return
	}
	if w.formed {
		w.epoch++
		var lb byte
		if left {
			lb = 1
		}
		for q, l := range w.links {
			if q != r {
				l.enqueue(frameGone, append(binary.AppendUvarint(nil, uint64(r)), lb, cause))
			}
		}
	}
	if left || ms.leaving {
		ms.status = statusLeft
		// Debug: at the end of a job every member sees every other leave.
		w.log.Debug().Int("member", r).Str("member_host", ms.Host).Uint64("epoch", w.epoch).Msg("rendezvous: member left")
		if !w.formed {
			w.setFatalLocked(&LeftError{Rank: r, Host: ms.Host, Op: "formation"})
			return
		}
		for _, g := range w.groups {
			if _, in := g.pos[r]; in && g.leaver == nil {
				g.leaver = &LeftError{Rank: r, Host: ms.Host}
				close(g.left)
			}
		}
		w.queueEventLocked(Event{Kind: MemberLeft, Rank: r, Host: ms.Host, Epoch: w.epoch, Time: time.Now()})
		return
	}
	ms.status = statusDead
	lerr := &LostError{Rank: r, Host: ms.Host, Epoch: w.epoch, Cause: w.causeErrorLocked(cause, r)}
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
	for _, g := range w.groups {
		if _, in := g.pos[r]; in && g.err == nil {
			g.err = lerr
			close(g.failed)
		}
	}
	w.queueEventLocked(Event{Kind: MemberLost, Rank: r, Host: ms.Host, Epoch: w.epoch, Err: lerr, Time: time.Now()})
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
	if w.members[m.Rank].node.Name != n.Name {
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
