package ft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// ServerConfig configures the quorum service.
type ServerConfig struct {
	// Addr is the listen address (host:port; port 0: the kernel picks).
	Addr string
	// JobID and Secret identify the job; the service's key is derived
	// from them (DeriveKey), and replicas of another job are refused.
	JobID  string
	Secret []byte
	// Replicas is the number of replicas (the world size); replica ids
	// are 0..Replicas-1.
	Replicas int
	// Logger receives quorum changes and losses (info) and refused
	// connections (warn).
	Logger zerolog.Logger
	// GroupSize makes replica groups of GroupSize consecutive ranks (HSDP:
	// a shard group is one replica): a group takes part in a quorum only
	// when all its ranks are live, the loss of one of its ranks is the
	// loss of the group, and each rank's participants are the ranks at
	// its place (rank mod GroupSize) in every participating group. 0 or
	// 1: every rank is a replica of its own.
	GroupSize int
	// StartTimeout bounds how long the first quorum waits for every
	// replica's first incarnation to connect (or be reported lost); then
	// it goes ahead with the replicas that did. 0 means 5 minutes: a
	// large job's processes can take that long to start.
	StartTimeout time.Duration
	// OnLoss, when set, is called (on a service goroutine, with no lock
	// held; it must not block) when a replica's incarnation is lost to
	// its connection's end rather than to Lost.
	OnLoss func(replica, incarnation int, why string)
}

// Validate reports the first invalid field, wrapping ErrConfig.
func (c *ServerConfig) Validate() error {
	switch {
	case c.Addr == "":
		return fmt.Errorf("%w: ServerConfig.Addr is empty", ErrConfig)
	case c.JobID == "":
		return fmt.Errorf("%w: ServerConfig.JobID is empty", ErrConfig)
	case len(c.Secret) == 0:
		return fmt.Errorf("%w: ServerConfig.Secret is empty", ErrConfig)
	case c.Replicas < 1:
		return fmt.Errorf("%w: ServerConfig.Replicas %d must be at least 1", ErrConfig, c.Replicas)
	case c.GroupSize < 0 || c.GroupSize > 1 && c.Replicas%c.GroupSize != 0:
		return fmt.Errorf("%w: ServerConfig.GroupSize %d does not divide the %d ranks", ErrConfig, c.GroupSize, c.Replicas)
	case c.StartTimeout < 0:
		return fmt.Errorf("%w: ServerConfig.StartTimeout %v is negative", ErrConfig, c.StartTimeout)
	}
	return nil
}

// Server is the quorum service ("lighthouse"): it answers every replica's
// Quorum once every live replica asked, decides every quorum's commit, and
// keeps the Record. gorun --fault-tolerant runs one per job; tests run one
// in process. Methods are safe for concurrent use.
//
// Its state is one struct under mu, changed only by the handlers of
// messages and losses (each ends with settleLocked, which answers a
// quorum when it is due); sends to replicas happen under mu too, each
// bounded by a write deadline, so every replica sees the messages in the
// order the state changed.
type Server struct {
	cfg   ServerConfig
	key   []byte
	ln    net.Listener
	log   zerolog.Logger
	start time.Time
	wg    sync.WaitGroup

	mu sync.Mutex
	// live holds the current incarnation of each replica connected and
	// said hello, by replica id.
	live   map[int]*member
	conns  map[*conn]bool // every accepted connection, for Close
	closed bool
	// round is the last quorum answered (nil before the first); nextRound
	// and nextID number rounds and memberships; lastMembers and
	// lastFailed decide whether a round gets a new ID.
	round       *round
	nextRound   int64
	nextID      int64
	lastMembers []memberKey
	lastFailed  bool
	rec         Record
	// seen are the replicas that joined or were reported lost; until all
	// have (or started is true), no quorum is answered, so the first
	// quorum holds the whole job rather than whoever connected first.
	seen    map[int]bool
	started bool
	// held lists every incarnation that ever held the job's state (it
	// committed a step or finished a heal); leftHeld is the highest step
	// held by a replica that left for good (finished).
	held     map[memberKey]bool
	leftHeld int64
	done     chan struct{} // closed by Close: ends the start timer's goroutine
}

// member is one live replica incarnation.
type member struct {
	replica, inc int
	addr, host   string
	c            *conn
	joined       time.Time
	step         int64 // the step it last asked a quorum at
	asked        bool  // it waits for the next quorum
	// holds is the step whose state it holds: the last step it committed,
	// or the step it healed to; 0 before either.
	holds int64
}

type memberKey struct{ replica, inc int }

// round is one answered quorum and its commit.
type round struct {
	n, id   int64
	step    int64
	members []*member
	votes   map[int]bool
	decided bool
}

// NewServer listens on cfg.Addr and serves until Close.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key, err := DeriveKey(cfg.Secret, cfg.JobID)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("ft: quorum service: %w", err)
	}
	s := &Server{
		cfg: cfg, key: key, ln: ln, log: cfg.Logger, start: time.Now(),
		live: map[int]*member{}, conns: map[*conn]bool{},
		rec: Record{Replicas: cfg.Replicas}, seen: map[int]bool{}, held: map[memberKey]bool{}, done: make(chan struct{}),
	}
	wait := cfg.StartTimeout
	if wait == 0 {
		wait = 5 * time.Minute
	}
	s.wg.Go(func() {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.done:
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.started {
			s.log.Warn().Int("joined", len(s.live)).Int("replicas", cfg.Replicas).Msg("not every replica joined in time; starting with those that did")
			s.started = true
			s.settleLocked()
		}
	})
	s.wg.Go(s.accept)
	return s, nil
}

// Addr returns the address replicas dial (AddrEnv's value).
func (s *Server) Addr() string { return s.ln.Addr().String() }

func (s *Server) since() float64 { return time.Since(s.start).Seconds() }

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() { s.serve(c) })
	}
}

// serve runs one connection: the handshake, the hello, then every
// message until the connection ends, which is the incarnation's loss
// unless it said bye.
func (s *Server) serve(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c, replica, inc, err := acceptAuth(nc, s.key, s.cfg.JobID, s.cfg.Replicas)
	if err != nil {
		// A connection closed before its greeting is a replica that was
		// stopped while it dialled (a job ending): nothing was refused.
		ev := s.log.Warn()
		if errors.Is(err, io.EOF) {
			ev = s.log.Debug()
		}
		ev.Err(err).Str("remote", nc.RemoteAddr().String()).Msg("refused a connection to the quorum service")
		nc.Close()
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.conns[c] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		nc.Close()
	}()
	hello, err := c.recv()
	if err != nil || hello.T != "hello" {
		s.log.Warn().Int("replica", replica).Msg("replica connected without a hello")
		return
	}
	m := &member{replica: replica, inc: inc, addr: hello.Addr, host: hello.Host, c: c, joined: time.Now()}
	s.mu.Lock()
	if old := s.live[replica]; old != nil {
		if old.inc >= inc {
			s.mu.Unlock()
			_ = c.send(message{T: "fail", Why: fmt.Sprintf("replica %d incarnation %d is already live (incarnation %d)", replica, inc, old.inc)})
			return
		}
		// A replacement connected before the old incarnation's loss
		// reached us: the old one is gone.
		s.lostLocked(old, "replaced by incarnation "+fmt.Sprint(inc))
	}
	s.live[replica] = m
	s.seen[replica] = true
	s.rec.Joins = append(s.rec.Joins, JoinRecord{Replica: replica, Incarnation: inc, At: s.since()})
	s.log.Info().Int("replica", replica).Int("incarnation", inc).Str("addr", hello.Addr).Msg("replica joined")
	s.mu.Unlock()

	why := "its connection to the quorum service ended"
	left := false
	for {
		msg, err := c.recv()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				why = fmt.Sprintf("its connection to the quorum service ended (%v)", err)
			}
			break
		}
		if msg.T == "bye" {
			left = true
			break
		}
		s.handle(m, msg)
	}
	s.mu.Lock()
	lost := s.live[replica] == m
	if lost {
		if left {
			s.leftLocked(m)
		} else {
			s.lostLocked(m, why)
		}
	}
	closed := s.closed
	s.mu.Unlock()
	if lost && !left && !closed && s.cfg.OnLoss != nil {
		s.cfg.OnLoss(replica, inc, why)
	}
}

// handle applies one message of a live member.
func (s *Server) handle(m *member, msg message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live[m.replica] != m {
		return
	}
	switch msg.T {
	case "quorum":
		if r := s.round; r != nil && !r.decided && inRound(r, m) {
			if _, voted := r.votes[m.replica]; !voted {
				s.failLocked(fmt.Sprintf("replica %d gave up quorum %d without voting", m.replica, r.id))
			}
		}
		m.step, m.asked = msg.Step, true
		s.settleLocked()
	case "vote":
		r := s.round
		if r == nil || r.n != msg.Round || r.decided || !inRound(r, m) {
			return // late: the round was decided (it failed) already
		}
		r.votes[m.replica] = msg.OK
		if !msg.OK {
			why := msg.Why
			if why == "" {
				why = "an error"
			}
			// Not only undecided: failed. The others may be blocked
			// in a collective this replica will never join (it failed
			// before it), and the next quorum needs them to ask.
			s.failLocked(fmt.Sprintf("replica %d reported %s", m.replica, why))
			return
		}
		if len(r.votes) == len(r.members) {
			s.decideLocked(true, "")
		}
	case "served":
		s.rec.Served = append(s.rec.Served, ServedRecord{Replica: m.replica, Quorum: msg.ID, Bytes: msg.Bytes, At: s.since()})
	case "healed":
		m.holds = max(m.holds, msg.Step)
		s.held[memberKey{m.replica, m.inc}] = true
		s.rec.Heals = append(s.rec.Heals, HealRecord{
			Replica: m.replica, Incarnation: m.inc, Quorum: msg.ID, Step: msg.Step, Sources: msg.Sources,
			Bytes: msg.Bytes, At: s.since(), Took: msg.Took, SinceJoin: time.Since(m.joined).Seconds(),
		})
		s.log.Info().Int("replica", m.replica).Int64("step", msg.Step).Int64("bytes", msg.Bytes).Float64("took_s", msg.Took).Msg("replica healed")
	}
}

func inRound(r *round, m *member) bool { return slices.Contains(r.members, m) }

// groupSize is the number of ranks of a replica group (1 without groups).
func (s *Server) groupSize() int { return max(s.cfg.GroupSize, 1) }

// completeLocked reports whether every rank of rank r's group is live.
func (s *Server) completeLocked(r int) bool {
	S := s.groupSize()
	for q := r / S * S; q < r/S*S+S; q++ {
		if s.live[q] == nil {
			return false
		}
	}
	return true
}

// settleLocked answers the next quorum when every live rank of a
// complete group asked.
func (s *Server) settleLocked() {
	if len(s.live) == 0 || s.closed {
		return
	}
	if !s.started {
		if len(s.seen) < s.cfg.Replicas {
			return
		}
		s.started = true
	}
	var members []*member
	for _, m := range s.live {
		if !s.completeLocked(m.replica) {
			continue // its group is not all here yet: it waits
		}
		if !m.asked {
			return
		}
		members = append(members, m)
	}
	if len(members) == 0 {
		return
	}
	slices.SortFunc(members, func(a, b *member) int { return a.replica - b.replica })
	keys := make([]memberKey, len(members))
	parts := make([]Participant, len(members))
	var step int64
	for i, m := range members {
		keys[i] = memberKey{m.replica, m.inc}
		parts[i] = Participant{Replica: m.replica, Incarnation: m.inc, Addr: m.addr, Host: m.host, Step: m.step}
		step = max(step, m.step)
		m.asked = false
	}
	if step < s.rec.MaxStep {
		// Every replica that held the job's last committed step has
		// left (finished): nobody can heal these, and training them
		// from an older step would be another job's training.
		for _, m := range members {
			s.rec.Finished = append(s.rec.Finished, JoinRecord{Replica: m.replica, Incarnation: m.inc, At: s.since()})
			_ = m.c.send(message{T: "finished", Step: s.rec.MaxStep})
		}
		return
	}
	s.nextRound++
	if s.lastFailed || !slices.Equal(keys, s.lastMembers) {
		s.nextID++
		var ids, healing []int
		for _, p := range parts {
			ids = append(ids, p.Replica)
			if p.Step < step {
				healing = append(healing, p.Replica)
			}
		}
		s.rec.Quorums = append(s.rec.Quorums, QuorumRecord{ID: s.nextID, Step: step, At: s.since(), Participants: ids, Healing: healing})
		s.log.Info().Int64("quorum", s.nextID).Int64("step", step).Ints("participants", ids).Ints("healing", healing).Msg("quorum changed")
	}
	s.lastMembers, s.lastFailed = keys, false
	s.round = &round{n: s.nextRound, id: s.nextID, step: step, members: members, votes: map[int]bool{}}
	S := s.groupSize()
	for _, m := range members {
		msg := message{T: "quorum", Round: s.nextRound, ID: s.nextID, Step: step, Participants: parts}
		if S > 1 {
			// Its place in every group, and its own group.
			msg.Participants = nil
			for _, p := range parts {
				if p.Replica%S == m.replica%S {
					msg.Participants = append(msg.Participants, p)
				}
				if p.Replica/S == m.replica/S {
					msg.Group = append(msg.Group, p)
				}
			}
		}
		_ = m.c.send(msg)
	}
}

// decideLocked decides the current round's commit and tells its members.
func (s *Server) decideLocked(ok bool, why string) {
	r := s.round
	r.decided = true
	if ok {
		s.rec.Commits++
		s.rec.MaxStep = max(s.rec.MaxStep, r.step+1)
		for _, m := range r.members {
			m.holds = r.step + 1
			s.held[memberKey{m.replica, m.inc}] = true
		}
	} else {
		// A communicator may have failed on some participant only (its
		// own vote said so): every participant builds a new one.
		s.lastFailed = true
		s.rec.Uncommitted = append(s.rec.Uncommitted, UncommittedRecord{Quorum: r.id, Step: r.step, At: s.since(), Why: why})
		s.log.Info().Int64("quorum", r.id).Int64("step", r.step).Str("why", why).Msg("step not committed")
	}
	for _, m := range r.members {
		if s.live[m.replica] == m {
			_ = m.c.send(message{T: "commit", Round: r.n, OK: ok, Why: why})
		}
	}
}

// failLocked fails the current round: its members' communicators must be
// aborted, and it is not committed if it was not decided yet. The next
// round gets a new ID even with the same members.
func (s *Server) failLocked(why string) {
	r := s.round
	s.lastFailed = true
	if !r.decided {
		s.decideLocked(false, why)
	}
	for _, m := range r.members {
		if s.live[m.replica] == m {
			_ = m.c.send(message{T: "fail", Round: r.n, ID: r.id, Why: why})
		}
	}
}

// lostLocked removes a dead incarnation: a round it is in fails, and a
// quorum that waited for it is answered without it.
func (s *Server) lostLocked(m *member, why string) {
	gone := []*member{m}
	if S := s.groupSize(); S > 1 {
		// The group goes with it: gorun replaces the group whole.
		for q := m.replica / S * S; q < m.replica/S*S+S; q++ {
			if o := s.live[q]; o != nil && o != m {
				gone = append(gone, o)
			}
		}
	}
	inRoundNow := false
	for i, g := range gone {
		delete(s.live, g.replica)
		w := why
		if i > 0 {
			w = fmt.Sprintf("its replica group lost rank %d", m.replica)
		}
		s.rec.Losses = append(s.rec.Losses, LossRecord{Replica: g.replica, Incarnation: g.inc, At: s.since(), Step: g.step, Why: w})
		s.log.Info().Int("replica", g.replica).Int("incarnation", g.inc).Str("why", w).Msg("replica lost")
		if i == 0 {
			// The others of its group keep their connection until gorun
			// has killed them: cut now, they would fail on their own and
			// be taken for the group's first failure.
			g.c.c.Close()
		}
		if r := s.round; r != nil && inRound(r, g) {
			inRoundNow = true
		}
	}
	if inRoundNow {
		s.failLocked(fmt.Sprintf("replica %d (incarnation %d) was lost: %s", m.replica, m.inc, why))
	}
	s.settleLocked()
}

// leftLocked removes an incarnation that left for good after its last
// committed step: no loss, and no round fails unless it was undecided.
func (s *Server) leftLocked(m *member) {
	delete(s.live, m.replica)
	s.leftHeld = max(s.leftHeld, m.holds)
	m.c.c.Close()
	if r := s.round; r != nil && !r.decided && inRound(r, m) {
		s.failLocked(fmt.Sprintf("replica %d left during quorum %d", m.replica, r.id))
	}
	s.settleLocked()
}

// Lost tells the service that replica's incarnation is dead (the launcher
// reaped its process, or its host was lost): the replica leaves the live
// set at once, a quorum waiting for it is answered without it, and a
// quorum it participates in fails (its members' communicators fail, its
// step is not committed). A stale incarnation (already replaced) or one
// that never connected is ignored. It does not block.
func (s *Server) Lost(replica, incarnation int, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.live[replica]; m != nil && m.inc == incarnation {
		s.lostLocked(m, why)
		return
	}
	if !s.seen[replica] && replica >= 0 && replica < s.cfg.Replicas {
		// Died before it connected: the first quorum waits no more.
		s.seen[replica] = true
		s.rec.Losses = append(s.rec.Losses, LossRecord{Replica: replica, Incarnation: incarnation, At: s.since(), Why: why})
		s.settleLocked()
	}
}

// Left tells the service that a replica exited successfully, for good
// (the launcher saw exit code 0): like Lost, but not recorded as a loss.
func (s *Server) Left(replica, incarnation int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.live[replica]; m != nil && m.inc == incarnation {
		s.leftLocked(m)
	}
}

// HeldState reports whether that incarnation of replica ever held the
// job's state: it took part in a committed step or finished a heal. An
// incarnation that fails before it did never trained or joined; the
// launcher takes such a failure with an exit code for a deterministic one
// (a start-up error), which a replacement would repeat.
func (s *Server) HeldState(replica, incarnation int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[memberKey{replica, incarnation}]
}

// StateLive reports whether a replacement could still get the job's state:
// the job has committed no step yet, a live replica holds its last
// committed step, or the replicas that held it finished (a replacement is
// then told ErrFinished). False means every holder died: a replacement
// would have nothing to heal from, and the steps committed are lost.
func (s *Server) StateLive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.MaxStep == 0 || s.leftHeld >= s.rec.MaxStep {
		return true
	}
	for _, m := range s.live {
		if m.holds >= s.rec.MaxStep {
			return true
		}
	}
	return false
}

// Record returns a copy of what the service saw so far.
func (s *Server) Record() Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rec
	r.Quorums = slices.Clone(r.Quorums)
	r.Losses = slices.Clone(r.Losses)
	r.Joins = slices.Clone(r.Joins)
	r.Heals = slices.Clone(r.Heals)
	r.Served = slices.Clone(r.Served)
	r.Uncommitted = slices.Clone(r.Uncommitted)
	r.Finished = slices.Clone(r.Finished)
	return r
}

// Close stops the service, closing every replica's connection, and
// returns once its goroutines have exited. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if !s.closed {
		close(s.done)
	}
	s.closed = true
	for c := range s.conns {
		c.c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
