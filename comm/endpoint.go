package comm

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/gorun-hpc/gorun/internal/connlimit"
)

// EndpointConfig configures a rank's data-plane listener.
type EndpointConfig struct {
	// Addr is the address to listen on, e.g. ":0" for any free port.
	Addr string
	// AdvertiseHost is the host part of Addr() when Addr does not name one
	// (":0"); default: the machine's hostname.
	AdvertiseHost string
	// Secret is the job secret; every connection proves it knows it
	// (HMAC-SHA256 challenge-response, both directions). Required.
	Secret []byte
	// ForceTCP disables shared memory even between ranks on one host, for
	// testing and benchmarking the TCP path. Ranks on the same host use
	// shared memory only when both sides allow it.
	ForceTCP bool
	// HandshakeTimeout bounds a connection's authentication, so a foreign
	// or silent client cannot hold a goroutine. 10 s.
	HandshakeTimeout time.Duration
	// GreetingTimeout bounds the wait for a new connection's first bytes:
	// a real peer sends them as soon as it is connected, so a connection
	// held open in silence gives its slot back sooner. 5 s (a loaded
	// machine can delay a starting rank's goroutines by seconds).
	GreetingTimeout time.Duration
	// MaxHandshakes bounds the connections in their handshake at once,
	// so thousands of held half-open connections cannot exhaust the
	// process's file descriptors or memory; MaxHandshakesPerSource bounds
	// those from one IP address. Zero means 1024 and 128
	// (internal/connlimit). Over either bound the oldest connection still
	// in its handshake is closed to admit the new one (connlimit's
	// Evict), not the newcomer refused: a peer's ranks share their host's
	// address with anyone on that host, and a real peer proves itself
	// within a round trip, so what gives way is what a stranger holds
	// open. A dialer whose connection is closed so retries it until its
	// context ends (errBusy).
	MaxHandshakes, MaxHandshakesPerSource int
	// DialRetry is the pause between attempts to reach a peer that is not
	// listening yet. 20 ms.
	DialRetry time.Duration
	// ShmDir is where shared-memory segments are created; they are unlinked
	// as soon as both sides have mapped them. "/dev/shm".
	ShmDir string
	// ShmRingBytes is the size of each direction's ring. 4 MiB: several
	// pipeline segments in flight, and still L3-friendly.
	ShmRingBytes int
	// TCPSpin is how long a TCP receive polls the socket before parking
	// the goroutine in the netpoller. A reply that is on its way arrives
	// sooner than the netpoller wakes a parked goroutine (two context
	// switches): 20 µs halved the 8-byte all-reduce latency between two
	// processes on loopback (40 → 19 µs) with no change in bandwidth. Zero
	// means the default; negative disables polling.
	TCPSpin time.Duration
	// TCPBufferBytes, when positive, sets SO_SNDBUF and SO_RCVBUF of every
	// data connection (capped by the kernel at net.core.wmem_max and
	// rmem_max). Zero keeps the kernel's autotuning, which on loopback
	// measured as fast as 1 and 4 MiB fixed buffers; set it for links whose
	// bandwidth-delay product exceeds what autotuning reaches.
	TCPBufferBytes int
	// TCPUserTimeout bounds how long data sent on a data connection may go
	// unacknowledged (TCP_USER_TIMEOUT), and, with keepalive probes after
	// half of it idle, how long a silent peer host is trusted: past it the
	// connection fails and the link's call fails naming the peer. The peer's
	// kernel acknowledges whatever its process does (a busy, starved or
	// stopped rank still acks), so this fires only when the network or the
	// host is gone: a cut link, a partition, a blackholed host, where TCP's
	// own retransmissions would wait about 15 minutes. Zero means
	// $GORUN_TCP_USER_TIMEOUT (a Go duration), else none while LinkLease
	// is on (the default: the lease judges a cut sooner and rightly),
	// else 10 s; negative leaves the kernel's behaviour. Linux only.
	//
	// Why not both by default: since Linux 5.11 TCP_USER_TIMEOUT also
	// aborts a connection whose peer keeps its receive window closed that
	// long while answering every probe — a healthy rank that does not
	// read for 10 s (a long step, a checkpoint) while a peer's large send
	// waits. Measured here (Linux 6.18, loopback, 4 s): the write failed
	// with "connection timed out" after 4.27 s, the reader alive. The
	// lease tells the two apart (linkwatch.go).
	TCPUserTimeout time.Duration
	// LinkLease is the data plane's own liveness check on TCP links (the
	// links between hosts): a link whose peer host has acknowledged
	// nothing for LinkLease while something awaited its acknowledgement
	// (data in flight, a zero-window probe, or a keepalive probe, which
	// the kernel sends on a link idle for a quarter of the lease) counts
	// as cut, and every communicator using it fails naming the peer and
	// the network between the two hosts (linkwatch.go). It is the
	// partition lease: what gossip and the attach streams allow a silent
	// member, so that a cut link is named as soon as a cut host would be,
	// while a shorter cut heals. The peer's kernel acknowledges whatever
	// its process does (busy, starved, stopped), so an overloaded or
	// frozen rank never trips it. Zero means $GORUN_LINK_LEASE (a Go
	// duration, or "off"), else 4 s (package rank passes the rendezvous
	// lease, GORUN_RDZV_LEASE, unless GORUN_LINK_LEASE is set); negative
	// turns the check off, and TCPUserTimeout then defaults to 10 s.
	// Linux only.
	LinkLease time.Duration
	// TCPStreams is how many TCP connections a link to a peer uses; large
	// frames are striped across them (headers and small frames use the
	// first). Each connection is authenticated like the first. The dialing
	// side's setting decides for the pair. Zero means $GORUN_TCP_STREAMS,
	// else 1: on loopback between two processes 2 and 4 streams measured no
	// faster than 1 (both cores are busy copying, and more sockets only add
	// work); across hosts several streams can get past a single flow's
	// window. At most 16; Linux only (elsewhere 1).
	TCPStreams int
	// TCPLocalCongestion is the TCP congestion control of the data
	// connections between ranks on one host (--transport tcp, or a pair
	// whose shared memory could not be set up). Empty means "reno";
	// "system" keeps the host's default. Loopback loses nothing, so
	// there is nothing for congestion control to do, but a host whose
	// default is BBR paces and probes its loopback connections: on the
	// 2-core reference host (default bbr), a 2-rank 2 MiB all-reduce took
	// 561 µs under bbr and 290 µs under reno (Open MPI, under bbr, 333),
	// and 300 calls under bbr retransmitted about 780 segments the peer
	// already had (tail loss probes answered by D-SACKs), none under reno
	// (notes/tcp-latency.md). Connections to other hosts keep the host's
	// default, the operator's choice for the network. Reno is the one
	// algorithm the kernel lets every process choose. Linux only.
	TCPLocalCongestion string
	// Logger receives connection events (foreign connections at Warn).
	Logger zerolog.Logger
}

// systemCongestion is the TCPLocalCongestion that keeps the host's default.
const systemCongestion = "system"

// defaultTCPUserTimeout is TCPUserTimeout's default without a link lease:
// a lost network ends a call within the 10 s gorun promises for naming a
// frozen rank.
const defaultTCPUserTimeout = 10 * time.Second

// defaultLinkLease is LinkLease's default: the rendezvous' lease.
const defaultLinkLease = 4 * time.Second

// LinkLeaseEnv overrides EndpointConfig.LinkLease when the field is zero:
// a positive Go duration, or "off".
const LinkLeaseEnv = "GORUN_LINK_LEASE"

func parseLinkLease(v string) (time.Duration, error) {
	if v == "off" {
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: %s=%q is neither a positive duration nor \"off\"", ErrInvalidArgument, LinkLeaseEnv, v)
	}
	return d, nil
}

// DefaultEndpointConfig returns the production settings, listening on ":0".
func DefaultEndpointConfig() EndpointConfig {
	return EndpointConfig{
		Addr:               ":0",
		HandshakeTimeout:   10 * time.Second,
		GreetingTimeout:    5 * time.Second,
		DialRetry:          20 * time.Millisecond,
		ShmDir:             "/dev/shm",
		ShmRingBytes:       4 << 20,
		TCPSpin:            20 * time.Microsecond,
		TCPLocalCongestion: "reno",
		Logger:             zerolog.Nop(),
	}
}

// Validate reports the first invalid field.
func (c EndpointConfig) Validate() error {
	switch {
	case len(c.Secret) == 0:
		return fmt.Errorf("%w: EndpointConfig.Secret is empty: every data-plane connection must be authenticated", ErrInvalidArgument)
	case c.HandshakeTimeout <= 0 || c.DialRetry <= 0:
		return fmt.Errorf("%w: HandshakeTimeout and DialRetry must be positive", ErrInvalidArgument)
	case c.GreetingTimeout < 0 || c.GreetingTimeout > c.HandshakeTimeout:
		return fmt.Errorf("%w: GreetingTimeout %s not in 0..HandshakeTimeout", ErrInvalidArgument, c.GreetingTimeout)
	case c.MaxHandshakes < 0 || c.MaxHandshakesPerSource < 0:
		return fmt.Errorf("%w: MaxHandshakes and MaxHandshakesPerSource must not be negative", ErrInvalidArgument)
	case c.ShmRingBytes < 1<<16 || c.ShmRingBytes&(c.ShmRingBytes-1) != 0:
		return fmt.Errorf("%w: ShmRingBytes %d must be a power of two ≥ 64 KiB", ErrInvalidArgument, c.ShmRingBytes)
	case c.TCPStreams < 0 || c.TCPStreams > maxTCPStreams:
		return fmt.Errorf("%w: TCPStreams %d not in 1..%d", ErrInvalidArgument, c.TCPStreams, maxTCPStreams)
	case c.TCPBufferBytes < 0:
		return fmt.Errorf("%w: TCPBufferBytes %d is negative", ErrInvalidArgument, c.TCPBufferBytes)
	}
	return nil
}

// Endpoint is a rank's data plane: one TCP listener shared by all of the
// rank's communicators, connections authenticated with the job secret, and
// shared-memory rings to peers on the same host. It implements Transport.
type Endpoint struct {
	cfg  EndpointConfig
	ln   net.Listener
	gate *connlimit.Gate // bounds connections in their handshake
	addr string
	log  zerolog.Logger

	mu      sync.Mutex
	pending map[pendingKey]chan *accepted // guarded by mu
	closed  bool                          // guarded by mu
	status  map[GroupID]*statusFn         // guarded by mu: ServeStatus

	wg sync.WaitGroup
}

var _ Transport = (*Endpoint)(nil)
var _ StatusTransport = (*Endpoint)(nil)

// statusFn is a communicator's answer to status queries (a pointer, so
// that a withdrawal removes only its own registration).
type statusFn struct{ f func() []byte }

type pendingKey struct {
	gid    GroupID
	from   int
	stream int // connection index within the link
}

// accepted is an authenticated incoming connection waiting for its group.
type accepted struct {
	conn  net.Conn
	br    *bufio.Reader
	hello hello
	shm   *shmSegment // mapped when the dialer offered and we accepted
}

// Listen opens the data-plane listener. The returned Endpoint's Addr is what
// the rank advertises to the rendezvous.
func Listen(cfg EndpointConfig) (*Endpoint, error) {
	d := DefaultEndpointConfig()
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = d.HandshakeTimeout
	}
	if cfg.GreetingTimeout == 0 {
		cfg.GreetingTimeout = min(d.GreetingTimeout, cfg.HandshakeTimeout)
	}
	if cfg.DialRetry == 0 {
		cfg.DialRetry = d.DialRetry
	}
	if cfg.ShmDir == "" {
		cfg.ShmDir = d.ShmDir
	}
	if cfg.ShmRingBytes == 0 {
		cfg.ShmRingBytes = d.ShmRingBytes
	}
	if cfg.Addr == "" {
		cfg.Addr = d.Addr
	}
	if cfg.TCPSpin == 0 {
		cfg.TCPSpin = d.TCPSpin
	}
	if cfg.TCPLocalCongestion == "" {
		cfg.TCPLocalCongestion = d.TCPLocalCongestion
	}
	if cfg.LinkLease == 0 {
		cfg.LinkLease = defaultLinkLease
		if v := os.Getenv(LinkLeaseEnv); v != "" {
			d, err := parseLinkLease(v)
			if err != nil {
				return nil, err
			}
			cfg.LinkLease = d
		}
	}
	if cfg.TCPUserTimeout == 0 {
		switch v := os.Getenv("GORUN_TCP_USER_TIMEOUT"); {
		case v != "":
			t, err := time.ParseDuration(v)
			if err != nil || t <= 0 {
				return nil, fmt.Errorf("%w: GORUN_TCP_USER_TIMEOUT=%q is not a positive duration", ErrInvalidArgument, v)
			}
			cfg.TCPUserTimeout = t
		case cfg.LinkLease > 0 && tcpInfoWorks:
			cfg.TCPUserTimeout = -1 // the lease judges (see TCPUserTimeout)
		default:
			cfg.TCPUserTimeout = defaultTCPUserTimeout
		}
	}
	if cfg.TCPStreams == 0 {
		cfg.TCPStreams = 1
		if v := os.Getenv("GORUN_TCP_STREAMS"); v != "" {
			k, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("%w: GORUN_TCP_STREAMS=%q: %w", ErrInvalidArgument, v, err)
			}
			cfg.TCPStreams = k
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	gate, err := connlimit.New(connlimit.Config{Max: cfg.MaxHandshakes, PerSource: cfg.MaxHandshakesPerSource, Evict: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("comm: data-plane listener: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if h, _, _ := net.SplitHostPort(cfg.Addr); h != "" {
		host = h
	} else if cfg.AdvertiseHost != "" {
		host = cfg.AdvertiseHost
	} else if hn, err := os.Hostname(); err == nil {
		host = hn
	}
	e := &Endpoint{cfg: cfg, ln: ln, gate: gate, addr: net.JoinHostPort(host, port), log: cfg.Logger, pending: map[pendingKey]chan *accepted{}}
	if !cfg.ForceTCP {
		if n := sweepShm(cfg.ShmDir); n > 0 {
			e.log.Info().Int("segments", n).Str("dir", cfg.ShmDir).Msg("comm: removed shared memory left by dead processes")
		}
	}
	e.wg.Go(e.acceptLoop)
	liveEndpoints.Add(1)
	return e, nil
}

// liveEndpoints counts this process's endpoints not yet closed. Where there
// are several, the process holds several ranks (in-process groups, tests),
// and a placement per process (spreadOnce, rehome) would put them all on
// one CPU: it is then not made.
var liveEndpoints atomic.Int32

func (e *Endpoint) tcpOptions() tcpOptions {
	return tcpOptions{spin: e.cfg.TCPSpin, bufBytes: e.cfg.TCPBufferBytes, userTimeout: e.cfg.TCPUserTimeout, lease: max(e.cfg.LinkLease, 0)}
}

// Addr is the address peers dial: host:port. Safe for concurrent use.
func (e *Endpoint) Addr() string { return e.addr }

// Close stops listening and drops connections no communicator has claimed;
// links already handed out belong to their communicators. Idempotent.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	liveEndpoints.Add(-1)
	err := e.ln.Close()
	// Connections still in their handshake (a stranger's, held open) are
	// closed now rather than waited for until their deadline.
	e.gate.Close()
	var drop []*accepted
	for _, ch := range e.pending {
		select {
		case a := <-ch:
			drop = append(drop, a)
		default:
		}
	}
	e.mu.Unlock()
	for _, a := range drop {
		a.close()
	}
	e.wg.Wait()
	return err
}

func (a *accepted) close() {
	_ = a.conn.Close()
	if a.shm != nil {
		a.shm.unmap()
	}
}

func (e *Endpoint) acceptLoop() {
	for {
		conn, release, err := e.gate.Accept(e.ln)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		e.wg.Go(func() { e.serve(conn, release) })
	}
}

// serve authenticates one incoming connection and parks it for its group.
// A connection that fails is logged and dropped; nothing else is affected.
//
// Parking: connections arrive before, during or after the communicator
// that wants them calls Connect, in any order. Each is keyed by (group,
// dialing rank, connection index) and handed over through a channel of
// capacity one made by whichever side comes first (waiterLocked): the
// accept side never blocks, and a second connection for the same key is a
// duplicate (a confused or hostile peer) and is dropped. The gate's slot
// is released once the handshake is over, so a parked link does not hold
// one.
func (e *Endpoint) serve(conn net.Conn, release func()) {
	start := time.Now()
	_ = conn.SetDeadline(start.Add(e.cfg.HandshakeTimeout))
	_ = conn.SetReadDeadline(start.Add(e.cfg.GreetingTimeout))
	// A small buffer: an unauthenticated connection must cost little (the
	// links read large frames straight into place, not through it).
	br := bufio.NewReaderSize(conn, 4<<10)
	h, shm, err := e.serverHandshake(conn, br, start)
	release()
	if err != nil {
		e.log.Warn().Err(err).Str("remote", conn.RemoteAddr().String()).Msg("comm: dropped data-plane connection")
		_ = conn.Close()
		return
	}
	if h.streams == 0 {
		e.answerStatus(conn, h)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	a := &accepted{conn: conn, br: br, hello: h, shm: shm}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		a.close()
		return
	}
	ch := e.waiterLocked(pendingKey{h.gid, h.from, h.stream})
	select {
	case ch <- a:
	default:
		e.log.Warn().Int("from", h.from).Int("stream", h.stream).Msg("comm: duplicate connection for a group rank dropped")
		a.close()
	}
}

func (e *Endpoint) waiterLocked(k pendingKey) chan *accepted {
	ch := e.pending[k]
	if ch == nil {
		ch = make(chan *accepted, 1)
		e.pending[k] = ch
	}
	return ch
}

// hello is what the dialer says after authentication.
type hello struct {
	gid      GroupID
	from, to int
	size     int
	shmName  string
	shmBytes int
	// The link's connection count and this connection's index. Only
	// connection 0 may offer shared memory.
	streams, stream int
}

// errBusy: the listener closed the connection before it finished the
// handshake though it knows the secret (or before saying anything): its
// gate made room for a newer connection (connlimit's Evict, while an
// outsider floods the port); the dialer tries again.
var errBusy = errors.New("comm: peer busy (connection closed during its handshake)")

// helloLen is the encoded size of a hello without the shared-memory name.
const helloLen = 8 + 4*3 + 4 + 2 + 2 + 2

const (
	handshakeMagic = "GORUNDP2"
	nonceLen       = 32
	ackTCP         = 1
	ackShm         = 2
	ackStatus      = 3 // the connection carries one status answer
	// ackRefused: the proof was right but the hello is not (a bug or a
	// mismatched build); final, unlike a close before the ack.
	ackRefused = 4
)

// maxStatusBytes bounds a status answer we are willing to read.
const maxStatusBytes = 4 << 20

// ServeStatus answers status queries for group gid with status() until
// withdrawn. A later registration for the same gid replaces an earlier one.
func (e *Endpoint) ServeStatus(gid GroupID, status func() []byte) (withdraw func()) {
	fn := &statusFn{f: status}
	e.mu.Lock()
	if e.status == nil {
		e.status = map[GroupID]*statusFn{}
	}
	e.status[gid] = fn
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		if e.status[gid] == fn {
			delete(e.status, gid)
		}
		e.mu.Unlock()
	}
}

// answerStatus writes the status of the group a query names (length, then
// the answer; length 0 when this rank has no communicator for it) and
// closes the connection. Called by the listener's goroutine for the
// connection, never by the communicator, so a rank stuck in a call answers.
func (e *Endpoint) answerStatus(conn net.Conn, h hello) {
	defer conn.Close()
	e.mu.Lock()
	fn := e.status[h.gid]
	e.mu.Unlock()
	var b []byte
	if fn != nil {
		b = fn.f()
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	_, _ = conn.Write(append(n[:], b...))
}

// QueryStatus asks rank r of g for its status of group gid over a new
// authenticated connection (the side channel of desync detection).
func (e *Endpoint) QueryStatus(ctx context.Context, g Group, gid GroupID, r int) ([]byte, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", g.DataAddr(r))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	br := bufio.NewReaderSize(conn, 4<<10)
	ack, err := e.clientHandshake(conn, br, hello{gid: gid, from: g.Rank(), to: r, size: g.Size()})
	if err != nil {
		return nil, err
	}
	if ack != ackStatus {
		return nil, fmt.Errorf("%w: status query answered with %d", ErrProtocol, ack)
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	switch {
	case size == 0:
		return nil, errors.New("no communicator for this group (closed or not yet created)")
	case size > maxStatusBytes:
		return nil, fmt.Errorf("%w: status of %d bytes", ErrProtocol, size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, err
	}
	return b, nil
}

// mac proves knowledge of the secret for one connection: both nonces make it
// unrepeatable, the role byte keeps the two directions apart, and the
// client's proof also covers its hello, so the hello cannot be altered in
// flight.
func mac(secret []byte, role byte, cn, sn []byte, more ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte{role})
	m.Write(cn)
	m.Write(sn)
	for _, b := range more {
		m.Write(b)
	}
	return m.Sum(nil)
}

// The data-plane handshake, one per connection (a link may have several):
//
//	dialer (client)                            listener (server)
//	"GORUNDP2" ‖ cn (32 random bytes) ───────► within GreetingTimeout, or
//	                                           the slot goes to another
//	◄──────── sn (32 random bytes) ‖ HMAC(secret, 'S' ‖ cn ‖ sn)
//	checks the server knows the secret
//	HMAC(secret, 'C' ‖ cn ‖ sn ‖ hello ‖ shm name) ‖ hello ‖ shm name ──►
//	                                           checks the proof (which also
//	                                           covers the hello, so it cannot
//	                                           be altered in flight), maps the
//	                                           offered segment if it can
//	◄──────── ack: ackTCP, ackShm (the segment is mapped on both sides),
//	          ackStatus (a status query, not a link) or ackRefused (a
//	          hello that makes no sense)
//
// Both nonces make every proof single-use, and the role byte keeps a
// server's proof from being replayed as a client's. Nothing about the
// group is revealed before the client proved the secret: a stranger learns
// only that the port speaks this protocol. A client that sees the
// connection close before any byte knows the server had no slot for its
// source (connlimit) and retries (errBusy), as does one that sees it close
// after the server's proof and before the ack (its gate evicted the
// connection to admit a newer one); anything else is an ErrAuth.
// The hello's layout (helloLen bytes, little-endian): group id (8), from,
// to, size, shm bytes (4 each), streams, stream, shm name length (2 each).
//
// serverHandshake is the listener's side; HandshakeTimeout bounds all of
// it from start.
func (e *Endpoint) serverHandshake(conn net.Conn, br *bufio.Reader, start time.Time) (hello, *shmSegment, error) {
	var h hello
	var b [len(handshakeMagic) + nonceLen]byte
	if _, err := io.ReadFull(br, b[:]); err != nil {
		return h, nil, fmt.Errorf("%w: reading greeting: %w", ErrAuth, err)
	}
	_ = conn.SetReadDeadline(start.Add(e.cfg.HandshakeTimeout))
	if string(b[:len(handshakeMagic)]) != handshakeMagic {
		return h, nil, fmt.Errorf("%w: not a gorun data-plane client", ErrAuth)
	}
	e.gate.Spoke(conn) // spared by evictions while silent ones are left
	cn := append([]byte(nil), b[len(handshakeMagic):]...)
	sn := make([]byte, nonceLen)
	_, _ = rand.Read(sn)
	if _, err := conn.Write(append(sn, mac(e.cfg.Secret, 'S', cn, sn)...)); err != nil {
		return h, nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	var resp [sha256.Size + helloLen]byte
	if _, err := io.ReadFull(br, resp[:]); err != nil {
		return h, nil, fmt.Errorf("%w: reading proof: %w", ErrAuth, err)
	}
	p := resp[sha256.Size:]
	nameLen := int(binary.LittleEndian.Uint16(p[28:]))
	if nameLen > 255 {
		return h, nil, fmt.Errorf("%w: shared-memory name of %d bytes", ErrAuth, nameLen)
	}
	name := make([]byte, nameLen)
	if _, err := io.ReadFull(br, name); err != nil {
		return h, nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	if !hmac.Equal(resp[:sha256.Size], mac(e.cfg.Secret, 'C', cn, sn, p, name)) {
		return h, nil, fmt.Errorf("%w: client does not know the job secret", ErrAuth)
	}
	if !e.gate.Claim(conn) {
		// The gate closed it for a newer connection while the proof was
		// on its way: the dialer sees the close before our ack and dials
		// again (errBusy). Past this point the gate cannot close it, so
		// no dialer is told it was accepted on a closed connection.
		return h, nil, errors.New("comm: connection closed by the handshake bound to admit a newer one")
	}
	h.gid = GroupID(binary.LittleEndian.Uint64(p))
	h.from = int(binary.LittleEndian.Uint32(p[8:]))
	h.to = int(binary.LittleEndian.Uint32(p[12:]))
	h.size = int(binary.LittleEndian.Uint32(p[16:]))
	h.shmBytes = int(binary.LittleEndian.Uint32(p[20:]))
	h.streams = int(binary.LittleEndian.Uint16(p[24:]))
	h.stream = int(binary.LittleEndian.Uint16(p[26:]))
	h.shmName = string(name)
	if h.streams == 0 && h.stream == 0 && h.shmName == "" {
		// A status query (QueryStatus), not a link.
		_, err := conn.Write([]byte{ackStatus})
		return h, nil, err
	}
	if h.streams < 1 || h.streams > maxTCPStreams || h.stream >= h.streams || (h.stream > 0 && h.shmName != "") {
		// Said, not only closed: a close before the ack is an eviction,
		// which the dialer retries, and this one must not be.
		_, _ = conn.Write([]byte{ackRefused})
		return h, nil, fmt.Errorf("%w: connection %d of %d (shared memory %q)", ErrProtocol, h.stream, h.streams, h.shmName)
	}
	ack := byte(ackTCP)
	var seg *shmSegment
	if h.shmName != "" && !e.cfg.ForceTCP {
		s, err := openShm(e.cfg.ShmDir, h.shmName, h.shmBytes)
		if err != nil {
			e.log.Warn().Err(err).Msg("comm: shared memory offered but not usable; using TCP")
		} else {
			seg, ack = s, ackShm
		}
	}
	if _, err := conn.Write([]byte{ack}); err != nil {
		if seg != nil {
			seg.unmap()
		}
		return h, nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	return h, seg, nil
}

// clientHandshake is the dialer's side of the handshake above; it returns
// the listener's ack.
func (e *Endpoint) clientHandshake(conn net.Conn, br *bufio.Reader, h hello) (byte, error) {
	cn := make([]byte, nonceLen)
	_, _ = rand.Read(cn)
	if _, err := conn.Write(append([]byte(handshakeMagic), cn...)); err != nil {
		return 0, err
	}
	var b [nonceLen + sha256.Size]byte
	if _, err := io.ReadFull(br, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// Closed before a byte: the listener had no slot for our
			// source (connlimit); worth another try.
			return 0, fmt.Errorf("%w: %w", errBusy, err)
		}
		return 0, handshakeReadErr("the server's proof", err)
	}
	sn := b[:nonceLen]
	if !hmac.Equal(b[nonceLen:], mac(e.cfg.Secret, 'S', cn, sn)) {
		return 0, fmt.Errorf("%w: server does not know the job secret", ErrAuth)
	}
	var p [helloLen]byte
	binary.LittleEndian.PutUint64(p[:], uint64(h.gid))
	binary.LittleEndian.PutUint32(p[8:], uint32(h.from))
	binary.LittleEndian.PutUint32(p[12:], uint32(h.to))
	binary.LittleEndian.PutUint32(p[16:], uint32(h.size))
	binary.LittleEndian.PutUint32(p[20:], uint32(h.shmBytes))
	binary.LittleEndian.PutUint16(p[24:], uint16(h.streams))
	binary.LittleEndian.PutUint16(p[26:], uint16(h.stream))
	binary.LittleEndian.PutUint16(p[28:], uint16(len(h.shmName)))
	out := mac(e.cfg.Secret, 'C', cn, sn, p[:], []byte(h.shmName))
	out = append(append(out, p[:]...), h.shmName...)
	if _, err := conn.Write(out); err != nil {
		return 0, err
	}
	var ack [1]byte
	if _, err := io.ReadFull(br, ack[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// The server proved the secret, so it is the peer, and our
			// proof is right: a close now is its gate evicting this
			// connection to admit a newer one; worth another try.
			return 0, fmt.Errorf("%w: %w", errBusy, err)
		}
		return 0, handshakeReadErr("the server's acceptance", err)
	}
	if ack[0] == ackRefused {
		return 0, fmt.Errorf("%w: the server refused this connection's hello (connection %d of %d, shared memory %q)", ErrAuth, h.stream, h.streams, h.shmName)
	}
	return ack[0], nil
}

// handshakeReadErr says why the dialer did not read what the listener
// owed it. A listener that accepted but said nothing before the deadline
// is stopped or starved (the stall diagnosis queries frozen ranks), which
// is not an authentication failure; a listener that closed or reset the
// connection after reading our proof refused it, which is.
func handshakeReadErr(what string, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("comm: the peer accepted the connection but did not send %s in time (stopped or starved?): %w", what, err)
	}
	return fmt.Errorf("%w: reading %s: %w", ErrAuth, what, err)
}

// Connect dials every higher rank and waits for every lower rank to dial
// it, then returns one Link per peer: shared memory where both sides are on
// one host and allow it, TCP otherwise. The direction rule (lower rank
// listens, higher rank dials) gives every pair exactly one link without
// any negotiation, and all pairs are set up concurrently, so a world's
// links take about as long as the slowest pair, not the sum. If any pair
// fails, every link made so far is closed and the first error returned.
func (e *Endpoint) Connect(ctx context.Context, g Group, gid GroupID) ([]Link, error) {
	me, n := g.Rank(), g.Size()
	links := make([]Link, n)
	eg, ctx := errgroup.WithContext(ctx)
	for r := range n {
		switch {
		case r > me:
			eg.Go(func() error {
				l, err := e.dial(ctx, g, gid, r)
				links[r] = l
				return err
			})
		case r < me:
			eg.Go(func() error {
				l, err := e.await(ctx, g, gid, r)
				links[r] = l
				return err
			})
		}
	}
	if err := eg.Wait(); err != nil {
		for _, l := range links {
			if l != nil {
				_ = l.Close()
			}
		}
		return nil, err
	}
	local, idx := 0, 0
	for r := range n {
		if g.Host(r) == g.Host(me) {
			if r < me {
				idx++
			}
			local++
		}
	}
	markCrowded(links, local)
	if local > onlineCPUs() && liveEndpoints.Load() == 1 {
		spreadOnce(idx, local)
	}
	return links, nil
}

func (e *Endpoint) dial(ctx context.Context, g Group, gid GroupID, r int) (Link, error) {
	me := g.Rank()
	addr := g.DataAddr(r)
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			var l Link
			l, err = e.dialed(ctx, conn, g, gid, r)
			if err == nil {
				return l, nil
			}
			_ = conn.Close()
			if !errors.Is(err, errBusy) {
				return nil, fmt.Errorf("comm: connecting rank %d to rank %d at %s: %w", me, r, addr, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("comm: rank %d could not reach rank %d at %s: %w (last error: %v)", me, r, addr, ctx.Err(), err)
		case <-time.After(e.cfg.DialRetry):
		}
	}
}

// streams is the connection count of the TCP links this endpoint dials.
func (e *Endpoint) streams() int {
	if !tcpStripes {
		return 1
	}
	return e.cfg.TCPStreams
}

// dialed authenticates conn as connection 0 of the link to r and, if the
// link is TCP, dials and authenticates its other connections.
func (e *Endpoint) dialed(ctx context.Context, conn net.Conn, g Group, gid GroupID, r int) (Link, error) {
	me := g.Rank()
	_ = conn.SetDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	br := bufio.NewReaderSize(conn, 64<<10)
	h := hello{gid: gid, from: me, to: r, size: g.Size(), streams: e.streams()}
	var seg *shmSegment
	if !e.cfg.ForceTCP && g.Host(r) == g.Host(me) {
		s, err := createShm(e.cfg.ShmDir, gid, me, r, e.cfg.ShmRingBytes)
		if err != nil {
			e.log.Warn().Err(err).Msg("comm: cannot create shared memory; using TCP")
		} else {
			seg = s
			h.shmName, h.shmBytes = s.name, e.cfg.ShmRingBytes
		}
	}
	ack, err := e.clientHandshake(conn, br, h)
	if seg != nil {
		seg.unlink() // both sides have mapped it, or the peer declined: nothing must outlive us
	}
	if err != nil {
		if seg != nil {
			seg.unmap()
		}
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	if ack == ackShm && seg != nil {
		return newShmLink(conn, br, seg, gid, true), nil
	}
	if seg != nil {
		seg.unmap()
	}
	conns, pre := []net.Conn{conn}, [][]byte{leftover(br)}
	for i := 1; i < h.streams; i++ {
		c, b, err := e.dialStream(ctx, g.DataAddr(r), hello{gid: gid, from: me, to: r, size: g.Size(), streams: h.streams, stream: i})
		if err != nil {
			for _, c := range conns[1:] {
				_ = c.Close()
			}
			return nil, fmt.Errorf("connection %d of %d: %w", i, h.streams, err)
		}
		conns, pre = append(conns, c), append(pre, b)
	}
	return e.newTCPLink(conns, pre, g, r), nil
}

// dialStream opens and authenticates one more TCP connection of a link.
func (e *Endpoint) dialStream(ctx context.Context, addr string, h hello) (net.Conn, []byte, error) {
	for {
		c, b, err := e.dialStreamOnce(ctx, addr, h)
		if !errors.Is(err, errBusy) {
			return c, b, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(e.cfg.DialRetry):
		}
	}
}

func (e *Endpoint) dialStreamOnce(ctx context.Context, addr string, h hello) (net.Conn, []byte, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	br := bufio.NewReaderSize(conn, 4<<10)
	ack, err := e.clientHandshake(conn, br, h)
	if err == nil && ack != ackTCP {
		err = fmt.Errorf("%w: unexpected acknowledgement %d", ErrProtocol, ack)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, leftover(br), nil
}

// leftover returns what br read past the handshake: the start of the
// peer's first frames, if it is already sending.
func leftover(br *bufio.Reader) []byte {
	if br.Buffered() == 0 {
		return nil
	}
	b := make([]byte, br.Buffered())
	_, _ = io.ReadFull(br, b)
	return b
}

func (e *Endpoint) await(ctx context.Context, g Group, gid GroupID, r int) (Link, error) {
	a, err := e.awaitConn(ctx, g, pendingKey{gid, r, 0}, 0)
	if err != nil {
		return nil, err
	}
	if a.shm != nil {
		return newShmLink(a.conn, a.br, a.shm, gid, false), nil
	}
	// The dialer said how many connections the link has; wait for the rest.
	streams := a.hello.streams
	conns, pre := []net.Conn{a.conn}, [][]byte{leftover(a.br)}
	for i := 1; i < streams; i++ {
		b, err := e.awaitConn(ctx, g, pendingKey{gid, r, i}, streams)
		if err != nil {
			for _, c := range conns {
				_ = c.Close()
			}
			return nil, fmt.Errorf("connection %d of %d: %w", i, streams, err)
		}
		conns, pre = append(conns, b.conn), append(pre, leftover(b.br))
	}
	return e.newTCPLink(conns, pre, g, r), nil
}

// newTCPLink makes the link to group rank r over conns, first setting the
// congestion control of a link to a rank on this host (see
// TCPLocalCongestion). A kernel that refuses it leaves the connections as
// they are, with a warning: the link works either way.
func (e *Endpoint) newTCPLink(conns []net.Conn, pre [][]byte, g Group, r int) *tcpLink {
	if cc := e.cfg.TCPLocalCongestion; cc != systemCongestion && g.Host(r) == g.Host(g.Rank()) {
		for _, c := range conns {
			if err := setCongestion(c, cc); err != nil {
				e.log.Warn().Err(err).Str("congestion", cc).Int("peer", r).Msg("comm: cannot set the congestion control of a TCP link on this host; keeping the system's")
				break
			}
		}
	}
	return newTCPLink(conns, pre, e.tcpOptions())
}

// awaitConn waits for the authenticated connection k and checks that its
// hello fits this group (and, for streams > 0, the link's connection count).
func (e *Endpoint) awaitConn(ctx context.Context, g Group, k pendingKey, streams int) (*accepted, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	ch := e.waiterLocked(k)
	e.mu.Unlock()
	select {
	case a := <-ch:
		e.mu.Lock()
		delete(e.pending, k)
		e.mu.Unlock()
		if a.hello.to != g.Rank() || a.hello.size != g.Size() {
			a.close()
			return nil, fmt.Errorf("%w: rank %d connected as rank %d of %d, but this is rank %d of %d", ErrProtocol, k.from, a.hello.to, a.hello.size, g.Rank(), g.Size())
		}
		if streams > 0 && a.hello.streams != streams {
			a.close()
			return nil, fmt.Errorf("%w: rank %d opened connection %d of %d, after announcing %d", ErrProtocol, k.from, k.stream, a.hello.streams, streams)
		}
		return a, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("comm: rank %d waited for rank %d (%s) to connect: %w", g.Rank(), k.from, g.DataAddr(k.from), ctx.Err())
	}
}
