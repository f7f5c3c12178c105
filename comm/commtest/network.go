package commtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// Network is an in-memory data plane shared by the endpoints of one test.
// Safe for concurrent use.
type Network struct {
	mu      sync.Mutex
	pipes   map[pipeKey]*pipe // guarded by mu
	killed  map[string]bool   // guarded by mu
	dropped map[string]bool   // guarded by mu
	delay   time.Duration     // guarded by mu
	// status answers side-channel queries (comm.StatusTransport) by
	// address and group; guarded by mu.
	status map[statusKey]*statusFn
}

type statusKey struct {
	addr string
	gid  comm.GroupID
}

type statusFn struct{ f func() []byte }

type pipeKey struct {
	gid  comm.GroupID
	a, b string // a < b
}

// pipe is the pair of queues between two members of one group: q[0] carries
// a→b, q[1] b→a.
type pipe struct{ q [2]*queue }

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{pipes: map[pipeKey]*pipe{}, killed: map[string]bool{}, dropped: map[string]bool{},
		status: map[statusKey]*statusFn{}}
}

// Endpoint returns the transport of the member that advertises addr.
func (nw *Network) Endpoint(addr string) comm.Transport { return &endpoint{nw: nw, addr: addr} }

// Kill makes addr vanish as a crashed process would: every link to or from it
// breaks at once, unread frames are lost, and peers see io.EOF.
func (nw *Network) Kill(addr string) {
	nw.mu.Lock()
	nw.killed[addr] = true
	var qs []*queue
	for k, p := range nw.pipes {
		if k.a == addr || k.b == addr {
			qs = append(qs, p.q[0], p.q[1])
		}
	}
	nw.mu.Unlock()
	for _, q := range qs {
		q.kill()
	}
}

// Drop silently discards every frame addr sends from now on, as a hung or
// partitioned peer would; only a failure report (StaticGroup.Fail) or a
// context can end a call waiting for it.
func (nw *Network) Drop(addr string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.dropped[addr] = true
}

// SetDelay delays every frame by d (0 removes the delay).
func (nw *Network) SetDelay(d time.Duration) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.delay = d
}

type endpoint struct {
	nw   *Network
	addr string
}

var _ comm.StatusTransport = (*endpoint)(nil)

// ServeStatus implements comm.StatusTransport: a query reaches status
// unless this address was killed (a dropped one still answers, as a hung
// process's listener does).
func (e *endpoint) ServeStatus(gid comm.GroupID, status func() []byte) (withdraw func()) {
	fn := &statusFn{f: status}
	k := statusKey{e.addr, gid}
	e.nw.mu.Lock()
	e.nw.status[k] = fn
	e.nw.mu.Unlock()
	return func() {
		e.nw.mu.Lock()
		if e.nw.status[k] == fn {
			delete(e.nw.status, k)
		}
		e.nw.mu.Unlock()
	}
}

// QueryStatus implements comm.StatusTransport.
func (e *endpoint) QueryStatus(ctx context.Context, g comm.Group, gid comm.GroupID, r int) ([]byte, error) {
	addr := g.DataAddr(r)
	e.nw.mu.Lock()
	fn, killed := e.nw.status[statusKey{addr, gid}], e.nw.killed[addr]
	e.nw.mu.Unlock()
	switch {
	case killed:
		return nil, fmt.Errorf("commtest: %s was killed", addr)
	case fn == nil:
		return nil, errors.New("no communicator for this group (closed or not yet created)")
	}
	return fn.f(), ctx.Err()
}

func (e *endpoint) Connect(ctx context.Context, g comm.Group, gid comm.GroupID) ([]comm.Link, error) {
	if got := g.DataAddr(g.Rank()); got != e.addr {
		return nil, fmt.Errorf("commtest: group says this rank is at %q, endpoint is %q", got, e.addr)
	}
	nw := e.nw
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.killed[e.addr] {
		return nil, fmt.Errorf("commtest: %s was killed", e.addr)
	}
	links := make([]comm.Link, g.Size())
	for r := range g.Size() {
		if r == g.Rank() {
			continue
		}
		peer := g.DataAddr(r)
		k := pipeKey{gid: gid, a: e.addr, b: peer}
		out := 0
		if peer < e.addr {
			k.a, k.b, out = peer, e.addr, 1
		}
		p := nw.pipes[k]
		if p == nil {
			p = &pipe{q: [2]*queue{newQueue(), newQueue()}}
			nw.pipes[k] = p
			if nw.killed[peer] {
				p.q[0].kill()
				p.q[1].kill()
			}
		}
		links[r] = &link{nw: nw, self: e.addr, out: p.q[out], in: p.q[1-out]}
	}
	return links, nil
}

type frame struct {
	h       comm.Header
	payload []byte
}

// queue is one direction of a pipe: unbounded, so a send never blocks.
type queue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	frames []frame // guarded by mu
	closed bool    // guarded by mu: no more frames; readers drain, then EOF
	dead   bool    // guarded by mu: killed; readers get EOF at once
}

func newQueue() *queue {
	q := &queue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *queue) push(f frame) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.dead {
		return io.ErrClosedPipe
	}
	q.frames = append(q.frames, f)
	q.cond.Broadcast()
	return nil
}

func (q *queue) pop() (frame, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.frames) == 0 && !q.closed && !q.dead {
		q.cond.Wait()
	}
	if q.dead || len(q.frames) == 0 {
		return frame{}, io.EOF
	}
	f := q.frames[0]
	q.frames[0] = frame{}
	q.frames = q.frames[1:]
	return f, nil
}

func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
}

func (q *queue) kill() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dead = true
	q.frames = nil
	q.cond.Broadcast()
}

// link is one member's end of a pipe.
type link struct {
	nw      *Network
	self    string
	out, in *queue
	cur     frame // worker-only: the frame whose header was last received
	once    sync.Once
}

var _ comm.Link = (*link)(nil)

func (l *link) Send(h *comm.Header, payload []byte) error {
	l.nw.mu.Lock()
	d, drop := l.nw.delay, l.nw.dropped[l.self]
	l.nw.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
	if drop {
		return nil
	}
	return l.out.push(frame{h: *h, payload: append([]byte(nil), payload...)})
}

func (l *link) RecvHeader(h *comm.Header) error {
	f, err := l.in.pop()
	if err != nil {
		return err
	}
	l.cur = f
	*h = f.h
	return nil
}

func (l *link) RecvPayload(dst []byte) error {
	if len(dst) != len(l.cur.payload) {
		return errors.New("commtest: payload length does not match header")
	}
	copy(dst, l.cur.payload)
	l.cur = frame{}
	return nil
}

func (l *link) EagerLimit() int { return math.MaxInt }
func (l *link) Kind() string    { return "mem" }

// Close ends both directions: the peer reads what was already sent, then EOF.
func (l *link) Close() error {
	l.once.Do(func() {
		l.out.close()
		l.in.kill()
	})
	return nil
}
