package ft

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/collateral"
	"github.com/gorun-hpc/gorun/internal/netfault"
	"github.com/gorun-hpc/gorun/rank"
	"github.com/gorun-hpc/gorun/rankenv"
	"github.com/gorun-hpc/gorun/rendezvous"
)

// Manager is one replica's side of fault-tolerant training: its connection
// to the quorum service, its data-plane endpoint, the current quorum's
// communicator, its committed step and its State. Quorum, AllReduce,
// ShouldCommit, SetState, Comm and Close belong to the training loop and
// must be called from one goroutine at a time, in the order of the package
// doc; ReportError, Step, Replica, Replicas and Incarnation are safe for
// concurrent use.
type Manager struct {
	cfg      Config
	log      zerolog.Logger
	replica  int
	replicas int
	inc      int
	gsize    int // replica group size (1: none)
	host     string
	ep       *comm.Endpoint
	svc      *conn
	// in carries the service's messages to the training loop, in order;
	// the reader (owned by wg) closes it when the connection ends, after
	// storing why in svcErr.
	in      chan message
	svcErr  atomic.Pointer[error]
	closing chan struct{}
	wg      sync.WaitGroup
	step    atomic.Int64

	// mu guards grp, ggrp, failed, stepErr and closed: the reader fails
	// the current groups, ReportError records the step's error, from
	// other goroutines than the training loop's.
	mu      sync.Mutex
	grp     *group           // the current quorum's group
	ggrp    *group           // the replica group's, as of the quorum gc was built in
	failed  map[int64]string // quorum ids the service failed, and why
	stepErr error            // this step's failure on this replica
	closed  bool

	closeOnce sync.Once
	closeErr  error

	// The training loop's own (no lock): the state, the communicator,
	// the quorum it belongs to, the current round and whether a vote is
	// owed for it.
	state    State
	c        *comm.Comm
	gc       *comm.Comm // the replica group's communicator (HSDP)
	gkey     string     // the group's members it was built over
	gqid     int64      // the quorum it was built in
	qid      int64
	round    int64
	voteOwed bool
	joinedAt time.Time
}

// Join starts this replica: it reads the environment (see the package
// doc), connects to the quorum service proving it holds the job secret,
// listens on the data plane (on the interface that reaches the service,
// unless Config.ListenAddr or GORUN_DATA_ADDR says otherwise) and says
// hello. It does not wait for other replicas. It fails with
// ErrNotFaultTolerant when AddrEnv is unset.
func Join(ctx context.Context, cfg Config) (_ *Manager, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	look := cfg.Lookup
	if look == nil {
		look = os.LookupEnv
	}
	get := func(k string) string { v, _ := look(k); return v }
	addr := get(AddrEnv)
	if addr == "" {
		return nil, ErrNotFaultTolerant
	}
	m := &Manager{cfg: cfg, in: make(chan message, 256), closing: make(chan struct{}), failed: map[int64]string{}, joinedAt: time.Now()}
	job, secret, err := m.identity(look)
	if err != nil {
		return nil, err
	}
	m.log = cfg.Logger.With().Int("rank", m.replica).Int("incarnation", m.inc).Str("host", m.host).Logger()
	svcKey, err := DeriveKey(secret, job)
	if err != nil {
		return nil, err
	}
	// The data-plane key is the one every rank of the job derives
	// (rank.Init), so a replacement authenticates to the survivors.
	id := rendezvous.Config{JobID: job, Secret: secret}
	dataKey, err := id.DeriveKey(rank.DataPlanePurpose)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}

	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ft: replica %d: quorum service at %s (%s): %w", m.replica, addr, AddrEnv, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if dl, ok := dctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if m.svc, err = dialAuth(nc, svcKey, job, m.replica, m.inc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("ft: replica %d: quorum service at %s: %w", m.replica, addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	defer func() {
		if err != nil {
			nc.Close()
			if m.ep != nil {
				_ = m.ep.Close()
			}
		}
	}()

	listen := cfg.ListenAddr
	if listen == "" {
		listen = get(rendezvous.EnvDataAddr)
	}
	if listen == "" {
		// The interface that reaches the service reaches the other
		// replicas too (gorun routes the job over one network).
		host, _, _ := net.SplitHostPort(nc.LocalAddr().String())
		listen = net.JoinHostPort(host, "0")
	}
	ecfg := cfg.Endpoint
	ecfg.Addr, ecfg.Secret, ecfg.Logger = listen, dataKey, cfg.Logger
	if m.ep, err = comm.Listen(ecfg); err != nil {
		return nil, fmt.Errorf("ft: replica %d: data plane: %w", m.replica, err)
	}
	if err := m.svc.send(message{T: "hello", Addr: m.ep.Addr(), Host: m.host}); err != nil {
		return nil, fmt.Errorf("ft: replica %d: hello: %w", m.replica, err)
	}
	m.wg.Go(m.read)
	m.log.Debug().Str("service", addr).Str("data_addr", m.ep.Addr()).Msg("joined")
	return m, nil
}

// identity reads the replica's place (rank, replicas, group size,
// incarnation), its host, and the job's id and secret from the
// environment (see the package doc).
func (m *Manager) identity(look func(string) (string, bool)) (job string, secret []byte, err error) {
	get := func(k string) string { v, _ := look(k); return v }
	num := func(k string) (int, error) {
		v, ok := look(k)
		if !ok {
			return 0, fmt.Errorf("%w: %s is not set", ErrConfig, k)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%w: %s=%q is not a non-negative integer", ErrConfig, k, v)
		}
		return n, nil
	}
	if m.replica, err = num(rankenv.GorunRank); err != nil {
		return "", nil, err
	}
	if m.replicas, err = num(rankenv.GorunWorldSize); err != nil {
		return "", nil, err
	}
	if m.replica >= m.replicas {
		return "", nil, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrConfig, rankenv.GorunRank, m.replica, rankenv.GorunWorldSize, m.replicas)
	}
	m.gsize = 1
	if v, ok := look(GroupSizeEnv); ok && v != "" {
		if m.gsize, err = num(GroupSizeEnv); err != nil {
			return "", nil, err
		}
		if m.gsize < 1 || m.replicas%m.gsize != 0 {
			return "", nil, fmt.Errorf("%w: %s=%d does not divide %s=%d", ErrConfig, GroupSizeEnv, m.gsize, rankenv.GorunWorldSize, m.replicas)
		}
	}
	if v, ok := look(IncarnationEnv); ok && v != "" {
		if m.inc, err = num(IncarnationEnv); err != nil {
			return "", nil, err
		}
	}
	job = get(rankenv.JobID)
	if job == "" {
		return "", nil, fmt.Errorf("%w: %s is not set", ErrConfig, rankenv.JobID)
	}
	secret, err = hex.DecodeString(get(rankenv.Secret))
	if err != nil || len(secret) == 0 {
		return "", nil, fmt.Errorf("%w: %s is not set or not hex", ErrConfig, rankenv.Secret)
	}
	m.host = get(rankenv.GorunHost)
	if m.host == "" {
		m.host, _ = os.Hostname()
	}
	return job, secret, nil
}

// read is the service connection's reader: it fails the current group at
// once on a "fail" (releasing collectives blocked on a dead peer) and
// hands every message to the training loop.
func (m *Manager) read() {
	defer close(m.in)
	for {
		msg, err := m.svc.recv()
		if err != nil {
			e := fmt.Errorf("%w: %w", ErrServiceLost, err)
			m.svcErr.Store(&e)
			m.mu.Lock()
			for _, g := range []*group{m.grp, m.ggrp} {
				if g != nil {
					g.fail(e)
				}
			}
			m.mu.Unlock()
			return
		}
		if msg.T == "fail" {
			m.mu.Lock()
			m.failed[msg.ID] = msg.Why
			for _, g := range []*group{m.grp, m.ggrp} {
				if g != nil && g.id == msg.ID {
					g.fail(fmt.Errorf("%w: quorum %d: %s", ErrQuorumFailed, msg.ID, msg.Why))
				}
			}
			m.mu.Unlock()
		}
		select {
		case m.in <- msg:
		case <-m.closing:
			return
		}
	}
}

// await returns the next message want accepts, skipping stale ones.
func (m *Manager) await(ctx context.Context, want func(message) bool) (message, error) {
	for {
		select {
		case msg, ok := <-m.in:
			if !ok {
				if e := m.svcErr.Load(); e != nil {
					return msg, *e
				}
				return msg, ErrClosed
			}
			if want(msg) {
				return msg, nil
			}
		case <-ctx.Done():
			return message{}, ctx.Err()
		}
	}
}

// SetState sets what a heal copies. Call it before the first Quorum; a
// replica that must heal or serve a heal without one gets ErrNoState.
func (m *Manager) SetState(s State) { m.state = s }

// Replica returns this replica's id (its rank).
func (m *Manager) Replica() int { return m.replica }

// Replicas returns the number of replicas the job was started with (the
// world size); a quorum may hold fewer.
func (m *Manager) Replicas() int { return m.replicas }

// Incarnation returns this process's incarnation (0: the first).
func (m *Manager) Incarnation() int { return m.inc }

// Step returns the number of steps this replica has committed (after a
// heal, the sources' number). Safe for concurrent use.
func (m *Manager) Step() int64 { return m.step.Load() }

// retry marks an error after which Quorum asks again.
type retry struct{ err error }

func (r retry) Error() string { return r.err.Error() }
func (r retry) Unwrap() error { return r.err }

// Quorum starts a step: it asks the service for the step's quorum, blocks
// until the service answers (every live replica asked), rebuilds the
// communicator when the participants changed, and heals this replica (or
// serves the heal of others) when some participant is behind. A quorum
// that fails on the way (a participant died, a heal source died) is asked
// again at once with the remaining replicas, so Quorum returns only with a
// usable quorum, or an error: ctx's, ErrClosed, ErrServiceLost, ErrNoState,
// ErrHeal or ErrFinished. Calling Quorum again before ShouldCommit abandons the
// previous quorum's step (its other participants get no commit for it).
func (m *Manager) Quorum(ctx context.Context) (Quorum, error) {
	first := m.qid == 0
	for {
		m.mu.Lock()
		closed := m.closed
		m.stepErr = nil
		m.mu.Unlock()
		if closed {
			return Quorum{}, ErrClosed
		}
		if err := m.svc.send(message{T: "quorum", Step: m.step.Load()}); err != nil {
			return Quorum{}, fmt.Errorf("%w: %w", ErrServiceLost, err)
		}
		msg, err := m.await(ctx, func(msg message) bool { return msg.T == "quorum" || msg.T == "finished" })
		if err != nil {
			return Quorum{}, err
		}
		if msg.T == "finished" {
			return Quorum{}, fmt.Errorf("%w (they committed %d steps; this replica holds %d)", ErrFinished, msg.Step, m.step.Load())
		}
		m.round, m.voteOwed = msg.Round, true
		q, err := m.use(ctx, msg)
		var r retry
		if errors.As(err, &r) {
			if ctx.Err() != nil {
				return Quorum{}, ctx.Err()
			}
			m.log.Info().Err(err).Int64("quorum", msg.ID).Msg("quorum failed; asking again")
			continue
		}
		if err != nil {
			m.voteOwed = false
			return Quorum{}, err
		}
		q.Changed = q.Changed || first
		return q, nil
	}
}

// use takes the quorum msg announced: its communicator, then its heal.
func (m *Manager) use(ctx context.Context, msg message) (Quorum, error) {
	q := Quorum{ID: msg.ID, Step: msg.Step, Participants: msg.Participants, Group: msg.Group, Rank: -1}
	for i, p := range q.Participants {
		if p.Replica == m.replica {
			q.Rank = i
		}
	}
	if q.Rank < 0 {
		return q, fmt.Errorf("%w: replica %d is not among quorum %d's participants", ErrServiceLost, m.replica, q.ID)
	}
	if msg.ID != m.qid || m.c == nil || m.c.Err() != nil {
		q.Changed = true
		m.dropComm()
		g := m.track(&m.grp, newGroup(msg.ID, q.Rank, q.Participants))
		c, err := m.connect(ctx, g, quorumTag(g.id))
		if err != nil {
			return q, retry{err}
		}
		m.c, m.qid = c, msg.ID
	}
	if err := m.groupComm(ctx, msg.ID, q.Group); err != nil {
		return q, err
	}
	var sources, healers []int
	for i, p := range q.Participants {
		if p.Step == q.Step {
			sources = append(sources, i)
		} else {
			healers = append(healers, i)
		}
	}
	if len(healers) == 0 {
		return q, nil
	}
	for _, i := range healers {
		q.Healed = append(q.Healed, q.Participants[i].Replica)
	}
	for _, i := range sources {
		q.HealSources = append(q.HealSources, q.Participants[i].Replica)
	}
	if m.state == nil {
		return q, ErrNoState
	}
	if slices.Contains(healers, q.Rank) {
		if err := m.receiveHeal(ctx, q, sources); err != nil {
			return q, err
		}
		return q, nil
	}
	return q, m.serveHeal(ctx, q, sources, healers)
}

// track makes g the group *slot names (the quorum's or the replica
// group's), so that the reader fails it when the service fails its
// quorum, and fails it at once if the service already did.
func (m *Manager) track(slot **group, g *group) *group {
	m.mu.Lock()
	defer m.mu.Unlock()
	*slot = g
	if why, ok := m.failed[g.id]; ok {
		g.fail(fmt.Errorf("%w: quorum %d: %s", ErrQuorumFailed, g.id, why))
	}
	return g
}

// connect builds the communicator over g with tag; a failure of g (a
// participant died or gave up meanwhile) ends the wait at once.
func (m *Manager) connect(ctx context.Context, g *group, tag string) (*comm.Comm, error) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-g.Failed():
			cancel()
		case <-cctx.Done():
		}
	})
	cc := m.cfg.Comm
	cc.Logger, cc.Tag = m.cfg.Logger, tag
	c, err := comm.New(cctx, g, m.ep, cc)
	cancel()
	wg.Wait()
	if err != nil {
		if gerr := g.Err(); gerr != nil {
			return nil, fmt.Errorf("%w (connecting: %w)", gerr, err)
		}
		return nil, fmt.Errorf("%w: connecting quorum %d: %w", ErrQuorumFailed, g.id, err)
	}
	return c, nil
}

// groupComm (re)builds the replica group's communicator (HSDP) when the
// quorum id changed since it was built: the group is new (gorun replaces
// it whole), or the previous quorum failed or was not committed, after
// which its members may stand at different calls of the old communicator
// (one gave up while another waits in an all-gather). Every member of a
// group sees the same quorum ids, so all rebuild in the same Quorum; the
// tag carries the id, so a connection left over from an attempt that
// failed is never taken for the new one; and the communicator fails with
// its quorum, so a member blocked in a group collective returns as soon as
// a peer gives the quorum up, instead of waiting for a call that peer will
// never make.
func (m *Manager) groupComm(ctx context.Context, qid int64, members []Participant) error {
	if m.gsize <= 1 {
		return nil
	}
	key := groupKey(members)
	me := slices.IndexFunc(members, func(p Participant) bool { return p.Replica == m.replica })
	if me < 0 || len(members) != m.gsize {
		return fmt.Errorf("%w: replica group %v of quorum does not hold rank %d's %d ranks", ErrServiceLost, members, m.replica, m.gsize)
	}
	if qid == m.gqid && key == m.gkey && m.gc != nil && m.gc.Err() == nil {
		return nil
	}
	if m.gc != nil {
		m.gc.Abort(ErrQuorumFailed)
		_ = m.gc.Close()
		m.gc = nil
	}
	g := m.track(&m.ggrp, newGroup(qid, me, members))
	c, err := m.connect(ctx, g, groupTag(qid, key))
	if err != nil {
		return retry{fmt.Errorf("connecting the replica group: %w", err)}
	}
	m.gc, m.gkey, m.gqid = c, key, qid
	return nil
}

// quorumTag and groupTag name quorum qid's communicators (the quorum's,
// and a replica group's with key its members: groupKey). The tag is part
// of the group id that keys every connection at a peer's endpoint
// (comm.Config.Tag), and a connection of an attempt that failed may stay
// parked there: the quorum id in both tags keeps it from ever being taken
// for a later quorum's communicator over the same members, which would
// run over a connection its dialer has closed.
func quorumTag(qid int64) string { return "ft/" + strconv.FormatInt(qid, 10) }

func groupTag(qid int64, key string) string {
	return "ft-group/" + strconv.FormatInt(qid, 10) + "/" + key
}

// groupKey names a replica group's members: replica, incarnation and
// data address of each.
func groupKey(members []Participant) string {
	key := ""
	for _, p := range members {
		key += fmt.Sprintf("%d.%d@%s,", p.Replica, p.Incarnation, p.Addr)
	}
	return key
}

// GroupComm returns the replica group's communicator (HSDP, gorun
// --fault-tolerant-group: the ranks of Quorum.Group, group rank = index
// there); nil without groups. Built by Quorum whenever the quorum id
// changes, valid until the next Quorum; its calls fail, as Comm's do,
// when the quorum fails.
func (m *Manager) GroupComm() *comm.Comm { return m.gc }

// GroupSize returns the replica group size (1 without groups).
func (m *Manager) GroupSize() int { return m.gsize }

// dropComm closes the current communicator: at once (Abort) when it
// failed, else gracefully.
func (m *Manager) dropComm() {
	if m.c == nil {
		return
	}
	if m.c.Err() != nil {
		m.c.Abort(ErrQuorumFailed)
	}
	_ = m.c.Close()
	m.c = nil
}

// healHeader is what each source sends a healer before its slice: the
// state's length and the SHA-256 digest of the whole.
const healHeader = 8 + sha256.Size

// shard is source i's slice [lo, hi) of n bytes among k sources.
func shard(n int64, i, k int) (lo, hi int64) {
	return n * int64(i) / int64(k), n * int64(i+1) / int64(k)
}

// serveHeal is a source's side: one Save, then to every healer the header
// and this source's slice.
func (m *Manager) serveHeal(ctx context.Context, q Quorum, sources, healers []int) error {
	data, err := m.state.Save()
	if err != nil {
		return fmt.Errorf("%w: State.Save on replica %d: %w", ErrHeal, m.replica, err)
	}
	hdr := make([]byte, healHeader)
	binary.LittleEndian.PutUint64(hdr, uint64(len(data)))
	sum := sha256.Sum256(data)
	copy(hdr[8:], sum[:])
	me := slices.Index(sources, q.Rank)
	lo, hi := shard(int64(len(data)), me, len(sources))
	var hs []comm.Handle
	for _, h := range healers {
		hs = append(hs, m.c.Send(ctx, comm.Uint8s(hdr), h))
		if hi > lo {
			hs = append(hs, m.c.Send(ctx, comm.Uint8s(data[lo:hi]), h))
		}
	}
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return retry{fmt.Errorf("%w: serving a heal: %w", ErrQuorumFailed, err)}
		}
	}
	_ = m.svc.send(message{T: "served", ID: q.ID, Bytes: hi - lo})
	m.log.Debug().Int64("quorum", q.ID).Int64("bytes", hi-lo).Ints("healing", q.Healed).Msg("served a heal")
	return nil
}

// receiveHeal is a healer's side: every source's header (they must
// agree), every slice, the digest, Load, and the step.
func (m *Manager) receiveHeal(ctx context.Context, q Quorum, sources []int) error {
	start := time.Now()
	hdrs := make([][]byte, len(sources))
	var hs []comm.Handle
	for i, s := range sources {
		hdrs[i] = make([]byte, healHeader)
		hs = append(hs, m.c.Recv(ctx, comm.Uint8s(hdrs[i]), s))
	}
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return retry{fmt.Errorf("%w: receiving a heal: %w", ErrQuorumFailed, err)}
		}
	}
	for i := range hdrs {
		if string(hdrs[i]) != string(hdrs[0]) {
			return fmt.Errorf("%w: heal sources replica %d and replica %d hold different states at step %d (length or digest differ)",
				ErrHeal, q.Participants[sources[0]].Replica, q.Participants[sources[i]].Replica, q.Step)
		}
	}
	n := int64(binary.LittleEndian.Uint64(hdrs[0]))
	if n < 0 || n > 1<<40 {
		return fmt.Errorf("%w: heal sources announced a state of %d bytes", ErrHeal, n)
	}
	data := make([]byte, n)
	hs = hs[:0]
	for i, s := range sources {
		if lo, hi := shard(n, i, len(sources)); hi > lo {
			hs = append(hs, m.c.Recv(ctx, comm.Uint8s(data[lo:hi]), s))
		}
	}
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return retry{fmt.Errorf("%w: receiving a heal: %w", ErrQuorumFailed, err)}
		}
	}
	if sum := sha256.Sum256(data); string(sum[:]) != string(hdrs[0][8:]) {
		return fmt.Errorf("%w: the state received at step %d does not match its digest", ErrHeal, q.Step)
	}
	if err := m.state.Load(data); err != nil {
		return fmt.Errorf("%w: State.Load on replica %d: %w", ErrHeal, m.replica, err)
	}
	m.step.Store(q.Step)
	took := time.Since(start)
	var from []int
	for _, s := range sources {
		from = append(from, q.Participants[s].Replica)
	}
	_ = m.svc.send(message{T: "healed", ID: q.ID, Step: q.Step, Bytes: n, Took: took.Seconds(), Sources: from})
	m.log.Info().Int64("quorum", q.ID).Int64("step", q.Step).Int64("bytes", n).Ints("sources", from).Dur("took", took).Msg("healed")
	return nil
}

// Comm returns the current quorum's communicator (over its participants,
// group rank = index in Quorum.Participants), for collectives beyond
// AllReduce. It is valid until the next Quorum, which may close it; nil
// before the first Quorum. Its calls fail (comm.ErrPeerLost, wrapping the
// loss) when a participant dies; report such an error with ReportError.
func (m *Manager) Comm() *comm.Comm { return m.c }

// AllReduce reduces buf in place over the quorum's participants with op
// (comm.Sum, or comm.Avg: the sum divided by the number of participants).
// An error (a participant died: ErrQuorumFailed wrapping comm's error) is
// also recorded as this step's failure, so ShouldCommit returns false.
func (m *Manager) AllReduce(ctx context.Context, buf []float32, op comm.Op) error {
	if m.c == nil || !m.voteOwed {
		return fmt.Errorf("%w: AllReduce outside a quorum (call Quorum first)", ErrPhase)
	}
	b := comm.Float32s(buf)
	if err := m.c.AllReduce(ctx, b, b, op).Wait(ctx); err != nil {
		err = fmt.Errorf("%w: %w", ErrQuorumFailed, err)
		m.ReportError(err)
		return err
	}
	return nil
}

// ReportError marks the current step failed on this replica (a collective
// it ran itself over Comm failed, its data loader broke): its vote will be
// false. Safe for concurrent use.
func (m *Manager) ReportError(err error) {
	if err == nil {
		return
	}
	m.mu.Lock()
	if m.stepErr == nil {
		m.stepErr = err
	}
	m.mu.Unlock()
}

// ShouldCommit ends the step: it votes (true unless an error was
// reported) and blocks until the service decides for the quorum, then
// returns the decision, equal on every participant: true only if every
// participant voted true before any of them died. On true the committed
// step advances by one. On false the caller discards the step's update;
// the next Quorum recovers in place. The error is non-nil only when no
// decision could be had (ctx ended, the service was lost, the Manager
// closed) or the call is out of order (ErrPhase); the decision is then
// false.
func (m *Manager) ShouldCommit(ctx context.Context) (bool, error) {
	if !m.voteOwed {
		return false, fmt.Errorf("%w: ShouldCommit without a Quorum", ErrPhase)
	}
	m.voteOwed = false
	m.mu.Lock()
	stepErr := m.stepErr
	m.mu.Unlock()
	vote := message{T: "vote", Round: m.round, OK: stepErr == nil}
	if stepErr != nil {
		vote.Why = stepErr.Error()
	}
	if err := m.svc.send(vote); err != nil {
		return false, fmt.Errorf("%w: %w", ErrServiceLost, err)
	}
	round := m.round
	msg, err := m.await(ctx, func(msg message) bool {
		return (msg.T == "commit" || msg.T == "fail") && msg.Round == round
	})
	if err != nil {
		return false, err
	}
	if msg.T == "commit" && msg.OK {
		step := m.step.Add(1)
		// gorun fires --inject ...:after-steps=N faults on these reports
		// (as rank.ReportStep does for other programs).
		collateral.TellStep(collateral.Step{Rank: m.replica, Step: step})
		netfault.ReportStep(step)
		return true, nil
	}
	m.log.Info().Int64("quorum", m.qid).Int64("step", m.step.Load()).Str("why", msg.Why).Msg("step not committed")
	return false, nil
}

// Close leaves the job gracefully (the service does not count it as a
// loss), closes the communicator and the endpoint, and returns once every
// goroutine the Manager started has exited. Idempotent.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()
		var errs []error
		// The communicator first, while the service still counts this
		// replica live: a farewell on a healthy one, an abort on a
		// failed one.
		for _, c := range []*comm.Comm{m.c, m.gc} {
			if c == nil {
				continue
			}
			if c.Err() != nil {
				c.Abort(ErrClosed)
				_ = c.Close()
			} else {
				errs = append(errs, c.Close())
			}
		}
		m.c, m.gc = nil, nil
		_ = m.svc.send(message{T: "bye"})
		close(m.closing)
		_ = m.svc.c.Close()
		m.wg.Wait()
		errs = append(errs, m.ep.Close())
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}
