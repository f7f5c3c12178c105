package connlimit

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// Config bounds the unauthenticated connections of one listener.
type Config struct {
	// Max is how many connections may be in their handshake at once. 1024:
	// a rank of a 4096-rank world is dialed by thousands of peers at
	// formation, and those wait in the backlog for a slot, each handshake
	// taking milliseconds; 1024 pending connections cost about 12 MiB
	// (goroutine and a 4 KiB buffer each).
	Max int
	// PerSource is how many of them one source may hold. 128: every rank
	// of one host dials from that host's address, several streams each.
	PerSource int
	// Evict makes a full gate close its oldest pending connection (of the
	// newcomer's source when PerSource is what is full; a silent one
	// before one that has spoken, see Spoke) to admit the new one,
	// instead of refusing the newcomer (PerSource) or leaving it in the
	// backlog (Max). For a listener whose genuine clients finish their
	// handshake within a round trip of connecting while an outsider can
	// share their address: the outsider's held connections are then what
	// gives way, never a newcomer, and the newcomer is evicted only if
	// more than a bound's worth of connections arrive during its own
	// handshake (its client retries). Accept then never blocks on a slot.
	Evict bool
}

// DefaultConfig returns the bounds the listeners use unless told otherwise.
func DefaultConfig() Config { return Config{Max: 1024, PerSource: 128} }

// Validate reports a bound that cannot work.
func (c Config) Validate() error {
	if c.Max < 1 || c.PerSource < 1 || c.PerSource > c.Max {
		return fmt.Errorf("connlimit: Max %d and PerSource %d must be positive with PerSource ≤ Max", c.Max, c.PerSource)
	}
	return nil
}

// ErrClosed is returned by Accept once the Gate is closed.
var ErrClosed = errors.New("connlimit: gate closed")

// Source names where a connection comes from; the default is the remote IP
// address (without the port), and "unix" for a Unix socket peer.
type Source func(net.Conn) string

// RemoteIP is the default Source.
func RemoteIP(c net.Conn) string {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case nil:
		return "?"
	default:
		return a.Network()
	}
}

// Gate admits connections from a listener within Config's bounds. Its
// methods are safe for concurrent use; Accept is meant for one accept loop.
type Gate struct {
	cfg    Config
	source Source

	// slots holds one token per connection in its handshake; Accept takes
	// one before it accepts, so a full gate leaves new connections in the
	// kernel's backlog.
	slots chan struct{}
	done  chan struct{} // closed by Close

	mu      sync.Mutex
	closed  bool                // guarded by mu
	pending map[net.Conn]string // guarded by mu: connection → its source
	per     map[string]int      // guarded by mu: connections per source
	refused int                 // guarded by mu: closed for PerSource
	// order is the pending connections oldest first, for Evict; entries
	// no longer pending are skipped and dropped lazily. Guarded by mu.
	order   []net.Conn
	evicted int // guarded by mu: closed to make room (Evict)
	// spoke holds the pending connections whose peer has sent the first
	// bytes of its handshake (Spoke); eviction spares them while a silent
	// one is left. Guarded by mu.
	spoke map[net.Conn]bool
}

// New returns a Gate; a zero Config field takes its default, and source
// nil means RemoteIP.
func New(cfg Config, source Source) (*Gate, error) {
	d := DefaultConfig()
	if cfg.Max == 0 {
		cfg.Max = d.Max
	}
	if cfg.PerSource == 0 {
		cfg.PerSource = min(d.PerSource, cfg.Max)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if source == nil {
		source = RemoteIP
	}
	return &Gate{cfg: cfg, source: source, slots: make(chan struct{}, cfg.Max), done: make(chan struct{}),
		pending: map[net.Conn]string{}, per: map[string]int{}, spoke: map[net.Conn]bool{}}, nil
}

// Accept waits for a free slot, accepts the next connection and admits it
// when its source holds fewer than PerSource slots; a connection over that
// is closed and the next one accepted. It returns the connection and a
// release function that the caller must call once the connection is
// authenticated or dropped (it is idempotent and does not close the
// connection). It blocks; it returns the listener's error, or ErrClosed
// after Close.
func (g *Gate) Accept(ln net.Listener) (net.Conn, func(), error) {
	if g.cfg.Evict {
		return g.acceptEvicting(ln)
	}
	for {
		select {
		case g.slots <- struct{}{}:
		case <-g.done:
			return nil, nil, ErrClosed
		}
		c, err := ln.Accept()
		if err != nil {
			<-g.slots
			return nil, nil, err
		}
		src := g.source(c)
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			<-g.slots
			_ = c.Close()
			return nil, nil, ErrClosed
		}
		if g.per[src] >= g.cfg.PerSource {
			g.refused++
			g.mu.Unlock()
			<-g.slots
			// Closed before a byte is said: the peer's client takes it as
			// "busy" and retries (comm's dialer does).
			_ = c.Close()
			continue
		}
		g.per[src]++
		g.pending[c] = src
		g.mu.Unlock()
		var once sync.Once
		return c, func() { once.Do(func() { g.release(c) }) }, nil
	}
}

// acceptEvicting is Accept under Config.Evict: it accepts at once and
// makes room by closing the oldest pending connections.
func (g *Gate) acceptEvicting(ln net.Listener) (net.Conn, func(), error) {
	select {
	case <-g.done:
		return nil, nil, ErrClosed
	default:
	}
	c, err := ln.Accept()
	if err != nil {
		return nil, nil, err
	}
	release, ok := g.admitEvicting(c)
	if !ok {
		_ = c.Close()
		return nil, nil, ErrClosed
	}
	return c, release, nil
}

// admitEvicting admits c under Config.Evict, making room first; false
// only when the gate is closed.
func (g *Gate) admitEvicting(c net.Conn) (func(), bool) {
	src := g.source(c)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, false
	}
	for g.per[src] >= g.cfg.PerSource {
		g.evictOldestLocked(src)
	}
	for len(g.pending) >= g.cfg.Max {
		g.evictOldestLocked("")
	}
	g.per[src]++
	g.pending[c] = src
	g.order = append(g.order, c)
	var once sync.Once
	return func() { once.Do(func() { g.release(c) }) }, true
}

// evictOldestLocked closes the oldest pending connection that has not
// spoken, else the oldest that has, of source src when src is not "", and
// forgets it (its owner's release is then a no-op). The caller holds mu
// and knows such a connection exists.
//
// A connection whose peer's bytes wait unread in its receive buffer has
// spoken too (waiting): its owner's goroutine has not run yet, which a
// flood's own churn makes likely.
//
// Why silent first: a real client speaks as soon as it is connected and
// finishes within a round trip or two, while what an outsider holds open
// to take slots is cheapest kept silent. Oldest first within each kind,
// so a newcomer is the last to go. An outsider that speaks too is evicted
// oldest first like any client, which still spares a client that is
// faster than the outsider's redialing.
func (g *Gate) evictOldestLocked(src string) {
	var victim net.Conn
	for _, c := range g.order {
		if s, ok := g.pending[c]; ok && (src == "" || s == src) {
			if !g.spoke[c] && !waiting(c) {
				victim = c
				break
			}
			if victim == nil {
				victim = c
			}
		}
	}
	g.forgetLocked(victim)
	g.evicted++
	_ = victim.Close()
	live := g.order[:0]
	for _, c := range g.order {
		if _, ok := g.pending[c]; ok {
			live = append(live, c)
		}
	}
	clear(g.order[len(live):])
	g.order = live
}

// Spoke records that pending connection c's peer has sent the first bytes
// of its handshake, so that eviction (Config.Evict) spares c while a
// silent connection is left. A no-op for a connection no longer pending.
func (g *Gate) Spoke(c net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.pending[c]; ok {
		g.spoke[c] = true
	}
}

// forgetLocked drops c from the pending counts. The caller holds mu.
func (g *Gate) forgetLocked(c net.Conn) {
	src := g.pending[c]
	delete(g.pending, c)
	delete(g.spoke, c)
	if g.per[src]--; g.per[src] == 0 {
		delete(g.per, src)
	}
}

// Admit counts a connection that another loop accepted (a listener the Gate
// does not own, such as memberlist's). It never blocks: over either bound
// it returns false and the caller closes the connection (under
// Config.Evict it makes room instead, and returns false only once closed). The release
// function is as Accept's.
func (g *Gate) Admit(c net.Conn) (func(), bool) {
	if g.cfg.Evict {
		return g.admitEvicting(c)
	}
	select {
	case g.slots <- struct{}{}:
	default:
		g.mu.Lock()
		g.refused++
		g.mu.Unlock()
		return nil, false
	}
	src := g.source(c)
	g.mu.Lock()
	if g.closed || g.per[src] >= g.cfg.PerSource {
		g.refused++
		g.mu.Unlock()
		<-g.slots
		return nil, false
	}
	g.per[src]++
	g.pending[c] = src
	g.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { g.release(c) }) }, true
}

func (g *Gate) release(c net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.pending[c]; ok {
		g.releaseLocked(c)
	} // else evicted
}

// Claim ends c's handshake as its release function does (which then does
// nothing) and reports whether c was still in it: false when the gate
// evicted c or was closed meanwhile, and c is (being) closed. An owner
// calls Claim once c has proved itself and before telling its peer so:
// on true the gate can no longer close c; on false the handshake must
// fail, so that no peer is told it was accepted on a connection the
// gate then closes.
func (g *Gate) Claim(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.pending[c]; !ok {
		return false // evicted
	}
	g.releaseLocked(c)
	return !g.closed
}

// releaseLocked gives pending connection c's slot back. The caller holds
// mu and knows c is pending.
func (g *Gate) releaseLocked(c net.Conn) {
	g.forgetLocked(c)
	if g.cfg.Evict {
		// Keep order from growing with released entries: compact when
		// most of it is stale (amortised O(1) per connection).
		if len(g.order) > 2*len(g.pending)+64 {
			live := g.order[:0]
			for _, o := range g.order {
				if _, ok := g.pending[o]; ok {
					live = append(live, o)
				}
			}
			clear(g.order[len(live):])
			g.order = live
		}
		return
	}
	<-g.slots
}

// Close ends Accept and closes every connection still in its handshake
// (their owners see their reads fail and call release). Idempotent.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	close(g.done)
	for c := range g.pending {
		_ = c.Close()
	}
}

// Stats is a snapshot for logs and tests.
type Stats struct {
	// Pending is how many connections are in their handshake now.
	Pending int
	// Refused is how many were turned away for a bound so far (Accept:
	// PerSource; Admit: either).
	Refused int
	// Evicted is how many pending connections were closed to admit newer
	// ones (Config.Evict).
	Evicted int
}

// Stats returns the current counts.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Pending: len(g.pending), Refused: g.refused, Evicted: g.evicted}
}

// Heard returns pending connection c wrapped so that its first read of
// any bytes calls Spoke(c), for an owner whose handshake reads through
// code that does not know the gate. Everything else is c's own.
func (g *Gate) Heard(c net.Conn) net.Conn { return &heardConn{Conn: c, g: g} }

type heardConn struct {
	net.Conn
	g     *Gate
	heard atomic.Bool
}

func (h *heardConn) Read(b []byte) (int, error) {
	n, err := h.Conn.Read(b)
	if n > 0 && !h.heard.Load() {
		h.heard.Store(true)
		h.g.Spoke(h.Conn)
	}
	return n, err
}
