package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// AnySource is the source of a Matcher receive that takes a message from
// whichever source has one first.
const AnySource = -1

// Matcher receives from any of a set of sources: point-to-point messages
// from several peers, each on a communicator (possibly one communicator
// per peer, as a torch backend keeps one per direction). Receives are
// matched to messages as MPI matches them: a message goes to the first
// receive, in posting order, that accepts its source (AnySource, or that
// source by name), and messages from one source are received in the order
// they were sent. Every message is received exactly once, into one
// receive's buffer.
//
// How: one goroutine per source probes its communicator (Comm.Probe, which
// keeps the message in the link) and, once a message waits, hands it to the
// first posted receive that accepts it by issuing that receive's Recv on
// the source's communicator, then probes again (after that Recv, in the
// communicator's order). A source with no receive that accepts it keeps its
// message waiting. So every receive of a source's communicator must go
// through the Matcher while it serves that source: a Recv issued on it
// directly would race the Matcher's for the next message. A Probe is a call
// in its communicator's order, so sources that share one communicator are
// probed one after another: there, a message waits behind a silent
// source's probe. Receiving from any source needs one communicator per
// source (per direction of each pair, as the torch backend has).
//
// A Matcher's goroutines are owned by it and end with Close. Safe for
// concurrent use.
type Matcher struct {
	ctx    context.Context // ends with Close: the probes' waits
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the fields below; cond signals a new receive or Close to
	// sources holding a message.
	mu      sync.Mutex
	cond    *sync.Cond
	sources map[int]*matchSource
	posted  []*MatchedRecv // posting order; not matched yet
	closed  bool
}

// matchSource is one source of a Matcher.
type matchSource struct {
	c    *Comm
	peer int
	err  error // the source failed (its communicator did); guarded by Matcher.mu
}

// NewMatcher returns a Matcher with no sources; Add them as they come.
func NewMatcher() *Matcher {
	m := &Matcher{sources: map[int]*matchSource{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.cond = sync.NewCond(&m.mu)
	return m
}

// Add makes peer of c source id (a name of the caller's choice, e.g. the
// sender's rank, reported by MatchedRecv.Source) and starts serving it.
// Receives posted before it was added may match its messages. Does not
// block.
func (m *Matcher) Add(id int, c *Comm, peer int) error {
	if c == nil || peer < 0 || peer >= c.Size() || peer == c.Rank() || id < 0 {
		return fmt.Errorf("%w: matcher source %d: peer %d of a communicator of %d (this is rank %d)",
			ErrInvalidArgument, id, peer, sizeOf(c), rankOf(c))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, dup := m.sources[id]; dup {
		return fmt.Errorf("%w: matcher source %d added twice", ErrInvalidArgument, id)
	}
	s := &matchSource{c: c, peer: peer}
	m.sources[id] = s
	m.wg.Go(func() { m.serve(id, s) })
	return nil
}

func sizeOf(c *Comm) int {
	if c == nil {
		return 0
	}
	return c.Size()
}

func rankOf(c *Comm) int {
	if c == nil {
		return -1
	}
	return c.Rank()
}

// Recv posts a receive into buf from source from (an id given to Add, or
// AnySource). The returned receive is a Handle; its Source says where the
// message came from. A message whose size differs from buf's fails the
// receive, and the source's communicator, as Recv does. ctx is the Recv's
// context once matched (see Comm.Recv); before that, Close ends the
// receive with ErrClosed. Does not block.
func (m *Matcher) Recv(ctx context.Context, buf Buffer, from int) *MatchedRecv {
	r := &MatchedRecv{ctx: ctx, buf: buf, from: from, src: -1, matched: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch s, ok := m.sources[from]; {
	case m.closed:
		r.match(-1, nil, ErrClosed)
	case from < AnySource:
		r.match(-1, nil, fmt.Errorf("%w: matcher receive from source %d", ErrInvalidArgument, from))
	case ok && s.err != nil:
		r.match(-1, nil, s.err)
	default:
		m.posted = append(m.posted, r)
		m.cond.Broadcast()
	}
	return r
}

// Close ends every receive not yet matched with ErrClosed and stops the
// Matcher's goroutines; it returns once they have exited. Receives already
// matched go on. Probes still waiting stay with their communicators (the
// next receive there takes their message; closing the communicator ends
// them). Idempotent.
func (m *Matcher) Close() {
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		for _, r := range m.posted {
			r.match(-1, nil, ErrClosed)
		}
		m.posted = nil
		m.cancel()
		m.cond.Broadcast()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// serve probes source id and gives each of its messages to the first
// posted receive that accepts it, until Close or the source fails.
func (m *Matcher) serve(id int, s *matchSource) {
	for {
		h := s.c.Probe(context.Background(), s.peer)
		if err := h.Wait(m.ctx); err != nil {
			if m.ctx.Err() == nil {
				m.failSource(id, s, err)
			}
			return
		}
		m.mu.Lock()
		r := m.claimLocked(id)
		for r == nil && !m.closed {
			m.cond.Wait()
			r = m.claimLocked(id)
		}
		if r == nil {
			m.mu.Unlock()
			return
		}
		// Issued under mu: two sources never reorder their claims, and a
		// receive is matched before a later one is.
		rh := s.c.Recv(r.ctx, r.buf, s.peer)
		r.match(id, rh, nil)
		m.mu.Unlock()
	}
}

// claimLocked takes the first posted receive that accepts source id.
func (m *Matcher) claimLocked(id int) *MatchedRecv {
	for i, r := range m.posted {
		if r.from == AnySource || r.from == id {
			m.posted = append(m.posted[:i], m.posted[i+1:]...)
			return r
		}
	}
	return nil
}

// failSource records that source id failed: receives naming it fail with
// its error, and receives from any source do once every source failed.
func (m *Matcher) failSource(id int, s *matchSource, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.err = fmt.Errorf("comm: receive from source %d: %w", id, err)
	alive := false
	for _, o := range m.sources {
		alive = alive || o.err == nil
	}
	kept := m.posted[:0]
	for _, r := range m.posted {
		switch {
		case r.from == id:
			r.match(-1, nil, s.err)
		case r.from == AnySource && !alive:
			r.match(-1, nil, errors.Join(errNoSource, s.err))
		default:
			kept = append(kept, r)
		}
	}
	m.posted = kept
}

var errNoSource = errors.New("comm: every source of the receive failed")

// MatchedRecv is a receive posted on a Matcher: a Handle that completes
// when its message has been received.
type MatchedRecv struct {
	ctx  context.Context
	buf  Buffer
	from int

	matched chan struct{} // closed by match
	src     int           // written before matched is closed
	h       Handle        // the Recv, once matched; nil when err is set
	err     error         // failed before a message was matched
}

var _ Handle = (*MatchedRecv)(nil)

// match settles which message r receives (h, from source id), or that it
// failed (err). Under Matcher.mu, once per receive.
func (r *MatchedRecv) match(id int, h Handle, err error) {
	r.src, r.h, r.err = id, h, err
	close(r.matched)
}

// Wait blocks until the message has been received or ctx ends. Safe for
// concurrent use.
func (r *MatchedRecv) Wait(ctx context.Context) error {
	select {
	case <-r.matched:
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.err != nil {
		return r.err
	}
	return r.h.Wait(ctx)
}

// Done reports without blocking whether the receive has completed.
func (r *MatchedRecv) Done() bool {
	select {
	case <-r.matched:
		return r.err != nil || r.h.Done()
	default:
		return false
	}
}

// Source is the id (see Matcher.Add) of the source whose message r
// received, or -1 while it has not been matched (or failed unmatched).
func (r *MatchedRecv) Source() int {
	select {
	case <-r.matched:
		return r.src
	default:
		return -1
	}
}
