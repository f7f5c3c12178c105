package output

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/fdpoll"
)

// The ranks' pipes of a local job are read by one goroutine, the Job's
// poller, over an epoll set (internal/fdpoll), not by a goroutine per
// stream: at thousands of ranks two goroutines per rank, their stacks and
// their read buffers were most of the launcher's memory. The poller reads
// every ready pipe once per round (at most readChunk, into one buffer it
// shares among the streams) and hands the bytes to the stream's feed, so a
// rank that floods gets one read per round like every other, and a rank
// that is quiet costs its streamer struct and its descriptor. A partial
// line is copied into the stream's pending bytes until its newline comes.
//
// One thing a goroutine per stream did for free: wait for a sink that
// another stream holds in the middle of a long line (see maxLine). The
// poller must not block there, as the holder's next piece needs the same
// goroutine; a stream whose sink is held by another stops being watched
// (its pipe fills and its rank waits, as it would behind a blocked
// streamer), and is watched again once the hold ends or stalls (a hold
// whose next piece waits unread in the holder's pipe has not stalled:
// the poller was late, not the rank).

// polled is what the poller keeps of a stream it reads.
type polled struct {
	s    *streamer
	f    *os.File
	rc   syscall.RawConn
	fd   int
	done bool // EOF, a read error or a cut: ended and closed
	// blocked: not watched while another stream holds one of its sinks.
	blocked bool
}

// poller reads the polled streams of a Job; it runs in one goroutine that
// the Job's wait group owns.
type poller struct {
	fp      *fdpoll.Poller
	streams []*polled
	open    int
	buf     []byte // the shared read buffer, made at the first read
	cut     atomic.Bool
	// mu orders Cut's wake-up before the epoll set's close: a wake-up
	// after it would write to a descriptor number that may be reused.
	mu     sync.Mutex
	closed bool // guarded by mu
}

// stop asks run to end every stream; it does nothing once run returned.
func (p *poller) stop() {
	p.cut.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		_ = p.fp.Wake()
	}
}

// closeSet closes the epoll set once run is done with it.
func (p *poller) closeSet() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.fp.Close()
}

// pollable returns r as a file the poller can read: an *os.File in
// non-blocking mode (a pipe made by os.Pipe) on a system with epoll.
func pollable(r any) (*os.File, syscall.RawConn, int, bool) {
	f, ok := r.(*os.File)
	if !ok || !fdpoll.Supported {
		return nil, nil, 0, false
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, nil, 0, false
	}
	fd, nonblock := -1, false
	_ = rc.Control(func(d uintptr) {
		fd = int(d)
		fl, err := fcntlGetfl(fd)
		nonblock = err == nil && fl&syscall.O_NONBLOCK != 0
	})
	return f, rc, fd, fd >= 0 && nonblock
}

// newPoller watches streams; on failure (no epoll, no descriptors left)
// the caller runs them in goroutines instead.
func newPoller(streams []*polled) (*poller, error) {
	fp, err := fdpoll.New()
	if err != nil {
		return nil, err
	}
	for i, p := range streams {
		if err := fp.Add(p.fd, int32(i)); err != nil {
			fp.Close()
			return nil, err
		}
	}
	return &poller{fp: fp, streams: streams, open: len(streams)}, nil
}

// run reads until every stream ended, then closes the epoll set.
func (p *poller) run() {
	defer p.closeSet()
	var ready []int32
	for p.open > 0 {
		var err error
		ready, _, err = p.fp.Wait(ready[:0], p.blockedWait())
		if err != nil || p.cut.Load() {
			p.endAll()
			return
		}
		p.unblock()
		for _, i := range ready {
			if ps := p.streams[i]; !ps.done && !ps.blocked {
				p.read(ps)
			}
		}
	}
}

// read reads ps once and feeds what came, or ends ps at EOF or on an
// error; a stream whose sink another holds is set aside instead.
func (p *poller) read(ps *polled) {
	if _, held := ps.s.heldElsewhere(); held || p.holderPending(ps) {
		ps.blocked = true
		_ = p.fp.Remove(ps.fd)
		return
	}
	if p.buf == nil {
		p.buf = make([]byte, readChunk)
	}
	var n int
	var rerr error
	// RawConn.Read holds the file against a concurrent Close while the
	// read runs, so a descriptor number reused meanwhile is never read.
	err := ps.rc.Read(func(fd uintptr) bool {
		n, rerr = syscall.Read(int(fd), p.buf)
		return true
	})
	switch {
	case err != nil:
		p.end(ps)
	case rerr == syscall.EAGAIN || rerr == syscall.EINTR:
		// Nothing after all; level-triggered, so asked again.
	case rerr != nil || n <= 0:
		p.end(ps)
	default:
		ps.s.feed(p.buf[:n])
	}
}

// end ends ps: its last line is written and its pipe closed.
func (p *poller) end(ps *polled) {
	if ps.done {
		return
	}
	if !ps.blocked {
		_ = p.fp.Remove(ps.fd)
	}
	ps.done = true
	ps.s.end()
	ps.f.Close()
	p.open--
}

// blockedWait is how long Wait may block: without end unless a stream is
// set aside, then until the earliest hold could stall (holdStall), and at
// most a tick, since a hold can also end in another goroutine.
func (p *poller) blockedWait() time.Duration {
	wait := time.Duration(-1)
	for _, ps := range p.streams {
		if !ps.blocked {
			continue
		}
		until, _ := ps.s.heldElsewhere()
		if d := min(max(time.Until(until), time.Millisecond), 50*time.Millisecond); wait < 0 || d < wait {
			wait = d
		}
	}
	return wait
}

// unblock watches again the streams whose sinks are free.
func (p *poller) unblock() {
	for i, ps := range p.streams {
		if !ps.blocked || ps.done {
			continue
		}
		if _, held := ps.s.heldElsewhere(); held || p.holderPending(ps) {
			continue
		}
		ps.blocked = false
		if err := p.fp.Add(ps.fd, int32(i)); err != nil {
			p.end(ps)
		}
	}
}

// holderPending reports whether a stream holding one of ps's sinks in
// the middle of a long line has bytes waiting in its pipe. Its hold then
// only looks stalled because this goroutine came late to read them (a
// starved gorun, not a quiet rank), and the line's next piece goes first.
// A holder that is itself set aside does not count: it cannot be read.
func (p *poller) holderPending(ps *polled) bool {
	for _, k := range []*Sink{ps.s.term, ps.s.file} {
		if k == nil {
			continue
		}
		k.mu.Lock()
		h := k.holder
		k.mu.Unlock()
		if h == nil || h == ps.s {
			continue
		}
		for _, q := range p.streams {
			if q.s == h && !q.done && !q.blocked && pipeBuffered(q.fd) > 0 {
				return true
			}
		}
	}
	return false
}

// endAll ends every open stream (Cut, or the epoll set failed): holders
// of a long line first, so no one waits on a hold that would end next.
func (p *poller) endAll() {
	for _, holders := range []bool{true, false} {
		for _, ps := range p.streams {
			if !ps.done && ps.s.midLine == holders {
				p.end(ps)
			}
		}
	}
}

// heldElsewhere reports whether another streamer holds one of s's sinks
// in the middle of a long line and has not stalled, and until when its
// hold lasts without a new piece.
func (s *streamer) heldElsewhere() (until time.Time, held bool) {
	for _, k := range []*Sink{s.term, s.file} {
		if k == nil {
			continue
		}
		k.mu.Lock()
		if k.holder != nil && k.holder != s {
			if u := k.lastPiece.Add(holdStall); time.Now().Before(u) && (!held || u.Before(until)) {
				until, held = u, true
			}
		}
		k.mu.Unlock()
	}
	return until, held
}
