package rendezvous

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/liveness"
)

// Host leaders (Config.LocalWorldSize > 1): local rank 0 of every host is the
// host's only gossip member; the host's other ranks attach to it over a local
// stream (AttachNet) and never speak gossip. Over that stream:
//
//   - an attached rank says hello (its Member), sends its collective messages
//     for the leader to route, and says goodbye when it closes;
//   - the leader hands it the world table once the world forms, every loss
//     or leave after that, the messages addressed to it, a fatal error that
//     ends formation, and its own goodbye.
//
// The leader carries its attached ranks' Members in memberlist's push-pull
// state (LocalState/MergeRemoteState), so the seed's table push at formation
// hands every leader the whole world, and reports an attached rank whose
// stream closes (exit or crash: the kernel closes the socket at once) to every
// other leader as that rank lost. A leader's death, found by gossip, loses its
// whole host; its attached ranks see their stream close and fail naming it.

// AttachNet connects a host's ranks to their leader. Listen is called once by
// the leader; Dial by each other rank, repeatedly until the leader listens.
// Both are safe for concurrent use.
type AttachNet interface {
	// Listen returns a listener for name; it does not block.
	Listen(name string) (net.Listener, error)
	// Dial connects to name; it blocks until connected, refused or ctx ends.
	Dial(ctx context.Context, name string) (net.Conn, error)
}

// PeerCredConn is a connection of an AttachNet that knows the process at
// its other end, as the kernel knows a Unix socket's peer (SO_PEERCRED).
// The leader refuses a peer of another user by it, and a silent stream's
// lease asks the kernel about that process (internal/liveness: stopped,
// gone, or only waiting for a CPU) instead of judging by the lease alone.
// An in-memory stream between ranks of one process names this process:
// what a Unix socket would say of it (bench/rdzvscale runs thousands of
// ranks so).
type PeerCredConn interface {
	net.Conn
	// PeerCred returns the peer's user and process id; ok is false when
	// they are unknown. It does not block; safe for concurrent use.
	PeerCred() (uid, pid int, ok bool)
}

// unixAttach is the default AttachNet: Linux abstract Unix sockets ("@name"),
// which vanish with the process, so no exit path can leave a file behind.
type unixAttach struct{}

var _ AttachNet = unixAttach{}

func (unixAttach) Listen(name string) (net.Listener, error) {
	ln, err := net.Listen("unix", "@"+name)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%w (@%s): %w", ErrAttachNameTaken, name, err)
	}
	return ln, err
}

func (unixAttach) Dial(ctx context.Context, name string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", "@"+name)
}

// attachName is the name a host's ranks meet at. Abstract socket names are
// one namespace for every user of a host (and visible in /proc/net/unix), so
// the name is derived from the job's attach key and the host: nobody without
// the secret can know it before the leader binds it, and so nobody can take
// it first. 32 hex digits of HMAC keep it well under the 107-byte limit.
func attachName(key []byte, host string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("attach socket name\x00" + host))
	return "gorun-" + hex.EncodeToString(m.Sum(nil)[:16])
}

// attachPurpose is the HKDF purpose of the attach handshake key.
const attachPurpose = "gorun rendezvous attach v1"

// Frame types on an attach stream. Each frame is a 4-byte big-endian length,
// then the type byte and its body.
const (
	frameHello  byte = 'H' // rank → leader: encodeMeta(Member)
	frameMsg    byte = 'M' // either way: uvarint destination rank, then a message (collect.go kinds)
	frameBye    byte = 'B' // either way: the sender leaves gracefully
	frameTable  byte = 'T' // leader → rank: uvarint epoch, the world table (encodeTable)
	frameGone   byte = 'G' // leader → rank: uvarint rank, byte left, byte cause
	frameFatal  byte = 'F' // leader → rank: byte kind ('C' conflict, 'F' formation, 'L' lost: uvarint rank first), message
	frameLeader byte = 'I' // leader → rank, once accepted: uvarint the leader's world rank
	frameBeat   byte = 'P' // either way, every AttachBeat: the sender is alive (no body)
)

// beatFrame is a whole frameBeat as it goes on the wire.
var beatFrame = []byte{0, 0, 0, 1, frameBeat}

// readSize is the least room a leasedReader reads into. Small: every
// attach stream has a reader at each end, all of a host's in one leader
// (all of a job's in one test process), and what flows when the world is
// quiet is 5-byte beats; a larger frame gets room for the whole of it
// once its length is read.
const readSize = 1 << 10

// maxFrame bounds a frame: a world table of thousands of members fits.
const maxFrame = 16 << 20

func writeFrame(w io.Writer, typ byte, body []byte) error {
	b := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(b, uint32(1+len(body)))
	b[4] = typ
	_, err := w.Write(append(b, body...))
	return err
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n == 0 || n > maxFrame {
		return 0, nil, fmt.Errorf("rendezvous: attach frame of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	return b[0], b[1:], nil
}

// handshake authenticates both ends of an attach stream with the job secret:
// each side sends a nonce, the rank proves the key over both, then the
// leader does. A process without the secret (another job, another user)
// can neither attach nor pose as the leader.
func handshake(c net.Conn, key []byte, leader bool, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	var mine, theirs [32]byte
	_, _ = rand.Read(mine[:])
	errc := make(chan error, 1)
	// Both sides write first; net.Pipe-like streams have no buffer, so
	// one write runs beside the read. The deadline ends it either way.
	go func() { _, err := c.Write(mine[:]); errc <- err }()
	_, rerr := io.ReadFull(c, theirs[:])
	werr := <-errc
	if err := cmp.Or(rerr, werr); err != nil {
		return fmt.Errorf("attach handshake: %w", err)
	}
	ln, rn := mine, theirs // leader's nonce, rank's nonce
	if !leader {
		ln, rn = theirs, mine
	}
	mac := func(role string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(role))
		h.Write(ln[:])
		h.Write(rn[:])
		return h.Sum(nil)
	}
	first, second := "rank", "leader"
	if leader {
		var got [32]byte
		if _, err := io.ReadFull(c, got[:]); err != nil {
			return fmt.Errorf("attach handshake: %w", err)
		}
		if !hmac.Equal(got[:], mac(first)) {
			return errors.New("attach handshake: peer does not hold the job secret")
		}
		_, err := c.Write(mac(second))
		return err
	}
	if _, err := c.Write(mac(first)); err != nil {
		return fmt.Errorf("attach handshake: %w", err)
	}
	var got [32]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return fmt.Errorf("attach handshake: %w", err)
	}
	if !hmac.Equal(got[:], mac(second)) {
		return errors.New("attach handshake: leader does not hold the job secret")
	}
	return nil
}

// patientConn is a stream whose deadlines are judged on time this process
// could run: a Read or Write that ends at its deadline is resumed while
// the time since the deadline was set, less the process's stalls
// (stallLog.judged) and this call's own lateness past the deadline, is
// within what the deadline allowed, up to limit (StarvedLimit) of clock
// time. The attach handshake and hello are bounded by TCPTimeout so that
// a stranger cannot hold a leader's slot; a process starved for seconds
// (thousands of ranks in one, notes/scale.md) failed them with both ends
// alive. Deadlines are set through it (SetDeadline and the like); it is
// used by one goroutine per direction, as a net.Conn may be.
type patientConn struct {
	net.Conn
	stalls *stallLog
	limit  time.Duration
	slack  time.Duration // lateness not counted (timer granularity)

	mu       sync.Mutex
	set      time.Time     // when the deadline was set
	deadline time.Time     // zero: none
	budget   time.Duration // deadline − set
	// apply sets a deadline the way the last one was set (read, write
	// or both), so that moving it touches no other.
	apply func(time.Time) error
}

func (c *patientConn) SetDeadline(t time.Time) error {
	return c.note(t, c.Conn.SetDeadline)
}

func (c *patientConn) SetReadDeadline(t time.Time) error {
	return c.note(t, c.Conn.SetReadDeadline)
}

func (c *patientConn) SetWriteDeadline(t time.Time) error {
	return c.note(t, c.Conn.SetWriteDeadline)
}

// note records a deadline set now, and sets it with apply.
func (c *patientConn) note(t time.Time, apply func(time.Time) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.set, c.deadline, c.budget, c.apply = now, t, t.Sub(now), apply
	return apply(t)
}

// resume reports whether an operation that err ended may go on: err is
// the deadline, and the time judged since the deadline was set is within
// its budget. Then it has moved the deadline by the time excused.
func (c *patientConn) resume(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deadline.IsZero() {
		return false
	}
	now := time.Now()
	if from := c.deadline.Add(c.slack); now.After(from) && c.stalls != nil {
		c.stalls.add(from, now) // ready at its deadline and not run
	}
	heard, silent := c.stalls.judged(c.set, now, 0, c.limit)
	if heard >= c.budget || (c.limit > 0 && silent >= c.limit) {
		return false
	}
	wait := c.budget - heard
	if c.limit > 0 {
		wait = min(wait, c.limit-silent)
	}
	c.deadline = now.Add(wait)
	return c.apply(c.deadline) == nil
}

func (c *patientConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if n > 0 || err == nil || !c.resume(err) {
			return n, err
		}
	}
}

func (c *patientConn) Write(b []byte) (int, error) {
	sent := 0
	for {
		n, err := c.Conn.Write(b[sent:])
		sent += n
		if err == nil || !c.resume(err) {
			return sent, err
		}
	}
}

// patient wraps c for the attach handshake and hello (patientConn).
func (w *World) patient(c net.Conn) *patientConn {
	return &patientConn{Conn: c, stalls: w.stalls, limit: w.cfg.StarvedLimit, slack: w.cfg.AttachBeat / 4}
}

func attachKey(c *Config) ([]byte, error) {
	return hkdf.Key(sha256.New, c.Secret, []byte(c.JobID), attachPurpose, 32)
}

// link is one attach stream with an unbounded outgoing queue, so that
// nothing that holds World.mu ever blocks on a slow reader. Its writer
// goroutine is owned by the World's WaitGroup.
//
// Closing is a half-close: after shut, the writer flushes the queue and
// shuts the write side only; the reader keeps reading until the peer closes
// too and then closes the connection. Closing a Unix socket with unread
// data makes the peer's next read fail with ECONNRESET, which could drop a
// goodbye still in flight and turn a leave into a loss.
type link struct {
	conn net.Conn
	rank int           // the attached rank (on the leader side), or the leader's
	beat time.Duration // the writer's beat period (Config.AttachBeat)

	mu     sync.Mutex
	queue  []outFrame
	closed bool
	wake   chan struct{}
	done   chan struct{} // closed when the writer returns
	// queued counts the frames ever queued, written those the writer has
	// handed to the kernel; wrote is closed and replaced each time written
	// grows. A leader waits on them (waitWritten) so that news of a loss
	// is in its attached ranks' sockets before the leader's own process
	// can act on that loss, and perhaps exit (see World.publishLocked).
	queued, written uint64
	wrote           chan struct{}
}

func newLink(c net.Conn, rank int, beat time.Duration) *link {
	return &link{conn: c, rank: rank, beat: beat, wake: make(chan struct{}, 1), done: make(chan struct{}), wrote: make(chan struct{})}
}

// procStalls is this process's record of the times it could not run a
// goroutine that was ready to: the evidence an observer has about
// itself. A lease is a claim that the peer would have spoken within it,
// which holds only for time during which the observer itself could run
// and read; a process starved of CPU (a loaded host, a long GC, or
// thousands of ranks in one test process) would otherwise blame its
// peers for its own lost time (notes/scale.md). Every link's writer adds
// what it sees on its beat ticks; every leased reader asks it. One log per
// process, because what it records is the process's, whichever stream saw
// it.
var procStalls stallLog

// stallLog is a set of stalled spans of time, merged where they overlap
// (many goroutines see one starvation). Safe for concurrent use.
type stallLog struct {
	mu    sync.Mutex
	spans []span // disjoint, oldest first, at most maxStalls
}

type span struct{ from, to time.Time }

// maxStalls bounds a stallLog; forgetting old stalls only makes leases
// stricter.
const maxStalls = 256

// add records that the process could not run from from to to. Adds come
// in time order, near enough (to is the adder's now): a span that reaches
// back over the latest ones is merged with them; one that ends before the
// latest began is out of order (another clock's) and dropped.
func (s *stallLog) add(from, to time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.spans)
	if n > 0 && to.Before(s.spans[n-1].from) {
		return
	}
	for n > 0 && !from.After(s.spans[n-1].to) {
		from, to = minTime(from, s.spans[n-1].from), maxTime(to, s.spans[n-1].to)
		n--
	}
	s.spans = append(s.spans[:n], span{from, to})
	if len(s.spans) > maxStalls {
		s.spans = append(s.spans[:0], s.spans[len(s.spans)-maxStalls:]...)
	}
}

// between is the stalled time from t to now. A span that reaches past
// now counts up to now: the latest span is the stall still going on,
// which other goroutines extend as they run, and one that read its clock
// after the caller (now) may have added to it before the caller took the
// lock; dropping it whole dropped the whole ongoing stall, merged into it
// (a 4,096-rank process lagging 4 s judged its attach streams with none of
// it excused). A span that begins at or after now is another clock's (a
// synctest bubble's) and is not counted.
func (s *stallLog) between(t, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum time.Duration
	for i := len(s.spans) - 1; i >= 0 && s.spans[i].to.After(t); i-- {
		sp := s.spans[i]
		if from, to := maxTime(sp.from, t), minTime(sp.to, now); to.After(from) {
			sum += to.Sub(from)
		}
	}
	return sum
}

// judged is how long a peer last heard at since has been silent by now:
// as the observer could tell (heard: the time less excuse and the
// process's stalls since then) and as the clock tells (silent). Past
// limit (StarvedLimit; 0: none) nothing is excused: a process starved
// that long is of no use to its job either. A nil log excuses no stall.
func (s *stallLog) judged(since, now time.Time, excuse, limit time.Duration) (heard, silent time.Duration) {
	silent = now.Sub(since)
	if limit > 0 && silent >= limit {
		return silent, silent
	}
	if s != nil {
		excuse += s.between(since, now)
	}
	return max(silent-excuse, 0), silent
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// outFrame is a queued frame: its header (with a small body after it),
// then a large body on its own. A large body (a world table, the same
// for every attached rank of a leader) is shared, not copied per link; it
// must not change once queued.
type outFrame struct {
	head, body []byte
}

// shareBody is the body size from which a frame's body is queued as it
// is rather than copied after the header.
const shareBody = 4 << 10

// enqueue queues a frame; false once the link is closed. Never blocks.
func (l *link) enqueue(typ byte, body []byte) bool {
	_, ok := l.enqueueSeq(typ, body)
	return ok
}

// enqueueSeq is enqueue that also returns the frame's position: once
// written reaches it, the frame is in the kernel (waitWritten).
func (l *link) enqueueSeq(typ byte, body []byte) (uint64, bool) {
	var f outFrame
	if len(body) >= shareBody {
		f.head, f.body = make([]byte, 5), body
	} else {
		f.head = make([]byte, 5, 5+len(body))
	}
	binary.BigEndian.PutUint32(f.head, uint32(1+len(body)))
	f.head[4] = typ
	if f.body == nil {
		f.head = append(f.head, body...)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, false
	}
	l.queue = append(l.queue, f)
	l.queued++
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return l.queued, true
}

// waitWritten waits until the frame at position seq has been written to
// the connection, the writer has stopped (the stream is gone: nothing more
// can be delivered), or expire fires.
func (l *link) waitWritten(seq uint64, expire <-chan time.Time) {
	for {
		l.mu.Lock()
		n, ch := l.written, l.wrote
		l.mu.Unlock()
		if n >= seq {
			return
		}
		select {
		case <-ch:
		case <-l.done:
			return
		case <-expire:
			return
		}
	}
}

// writer sends queued frames until the link is shut, then flushes what was
// queued and shuts the connection's write side. Between frames it beats
// every l.beat, so that the other end's lease (leasedReader) holds as long as
// this process runs: the beat comes from this goroutine, which a stopped
// or wedged process cannot schedule, not from the kernel, which keeps a
// stopped process's socket open and would say nothing.
func (l *link) writer() {
	defer close(l.done)
	var beat <-chan time.Time
	if l.beat > 0 {
		t := time.NewTicker(l.beat)
		defer t.Stop()
		beat = t.C
	}
	for {
		l.mu.Lock()
		q, closed := l.queue, l.closed
		l.queue = nil
		l.mu.Unlock()
		for _, f := range q {
			_, err := l.conn.Write(f.head)
			if err == nil && f.body != nil {
				_, err = l.conn.Write(f.body)
			}
			if err != nil {
				l.shut()
				_ = l.conn.Close()
				return
			}
		}
		if len(q) > 0 {
			l.mu.Lock()
			l.written += uint64(len(q))
			close(l.wrote)
			l.wrote = make(chan struct{})
			l.mu.Unlock()
		}
		if closed {
			if cw, ok := l.conn.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			} else {
				_ = l.conn.Close()
			}
			return
		}
		idle := time.Now()
		select {
		case <-l.wake:
		case due := <-beat:
			l.noteStall(due, idle)
			l.mu.Lock()
			l.queue = append(l.queue, outFrame{head: beatFrame})
			l.queued++
			l.mu.Unlock()
		}
	}
}

// noteStall records how late the writer ran on a beat tick that was due
// at due while it sat idle since idle: from the later of the two (plus a
// slack of a quarter beat for timer granularity) to now, the goroutine
// was ready and not run: the process was starved. A writer blocked in a
// write (a peer that does not read) is not idle, and that time is never
// counted: it may be the peer's fault.
func (l *link) noteStall(due, idle time.Time) {
	now := time.Now()
	if from := maxTime(due, idle).Add(l.beat / 4); now.After(from) {
		procStalls.add(from, now)
	}
}

// leasedReader reads an attach stream's frames under its lease. The
// other end beats every AttachBeat, so a silence of AttachLease means it
// is frozen (SIGSTOP, a debugger), unresponsive, or starved of CPU on a
// loaded host: which one, the judge (internal/liveness) asks the kernel
// about the peer's process (the stream is a Unix socket, whose peer pid
// the kernel recorded): a stopped process is named at once, one that ran
// or waits for the CPU is given another AttachLease/4, up to
// StarvedLimit; without evidence the lease alone decides, as before
// (notes/verdicts.md). Bytes read but not yet a whole frame are kept,
// so a judged pause in the middle of a frame loses nothing. Beats are
// consumed here. One goroutine reads.
type leasedReader struct {
	c     net.Conn
	lease time.Duration
	judge liveness.Judge
	// buf holds what was read and not yet returned (the start of a
	// frame); reads go into its spare capacity, at least readSize, so a
	// quiet stream holds a few KB, not a large fixed buffer (a process
	// of many ranks holds two readers per attached rank).
	buf   []byte
	heard time.Time // the last byte read
	// starved is set while the peer is judged starved (logged once a
	// silence).
	starved bool
	log     func(silent time.Duration, why string)
	// closing is closed when this end shuts down: a deadline then ends
	// the read at once (the closer set it to bound the wait), judged
	// as before by the lease alone.
	closing <-chan struct{}

	// The observer's own lost time, excused from the peer's silence
	// (silence): deaf is the time since heard that the caller spent
	// away from the stream (handling a frame: the peer's bytes wait
	// meanwhile), back when it last took a frame away; stalls is the
	// process's own scheduling delay (procStalls; nil: none known).
	// limit caps the excuse (StarvedLimit): past it, the silence
	// counts whole.
	deaf   time.Duration
	back   time.Time
	stalls *stallLog
	limit  time.Duration
	// grace is how long a reader that woke late past its deadline
	// listens once more before judging (relistened: done, for this
	// silence): a read whose deadline has passed reports the deadline,
	// not the bytes that arrived while the reader waited to run.
	grace      time.Duration
	relistened bool
}

// claimed is the pid the peer said it has (its hello), used only where
// the stream carries no credentials and a test's fake evidence stands in
// for the kernel (Config.procSample).
func newLeasedReader(c net.Conn, cfg *Config, closing <-chan struct{}, claimed int) *leasedReader {
	r := &leasedReader{c: c, lease: cfg.AttachLease, heard: time.Now(), closing: closing,
		stalls: &procStalls, limit: cfg.StarvedLimit, grace: max(cfg.AttachBeat, 10*time.Millisecond)}
	r.judge = liveness.Judge{Sample: cfg.procSample, Lease: cfg.AttachLease,
		Recheck: max(cfg.AttachLease/4, cfg.AttachBeat), Limit: cfg.StarvedLimit}
	if _, pid, ok := peerCred(c); ok {
		r.judge.PID = pid
	} else if cfg.procSample != nil {
		r.judge.PID = claimed
	}
	return r
}

// next returns the next frame that is not a beat; a silence the judge
// holds against the peer ends it with a *SilenceError (isSilence).
func (r *leasedReader) next() (byte, []byte, error) {
	if !r.back.IsZero() {
		r.deaf += time.Since(r.back)
		r.back = time.Time{}
	}
	deadline := r.heard.Add(r.lease + r.deaf)
	for {
		if typ, body, ok, err := r.frame(); err != nil {
			return 0, nil, err
		} else if ok && typ != frameBeat {
			r.back = time.Now()
			return typ, body, nil
		} else if ok {
			continue
		}
		_ = r.c.SetReadDeadline(deadline)
		want := readSize
		if len(r.buf) >= 4 {
			// A frame has begun: room for the whole of it, so a large
			// frame (a world table) takes a read or two, not one per
			// readSize (frame has checked its length).
			want = max(want, 4+int(binary.BigEndian.Uint32(r.buf[:4]))-len(r.buf))
		}
		if cap(r.buf)-len(r.buf) < want {
			r.buf = slices.Grow(r.buf, want)
		}
		n, err := r.c.Read(r.buf[len(r.buf):cap(r.buf)])
		if n > 0 {
			r.buf = r.buf[:len(r.buf)+n]
			r.heard, r.starved = time.Now(), false
			r.deaf, r.relistened = 0, false
			r.judge.Heard()
			deadline = r.heard.Add(r.lease)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, nil, err
		}
		select {
		case <-r.closing:
			return 0, nil, err
		default:
		}
		now := time.Now()
		heard, silent := r.silence(now)
		if heard < r.lease {
			// The deadline was a recheck's or set before the last
			// bytes, or this process lost time meanwhile: the lease
			// itself has not run out (or not before the limit).
			wait := r.lease - heard
			if r.limit > 0 {
				wait = max(min(wait, r.limit-silent), time.Millisecond)
			}
			deadline = now.Add(wait)
			continue
		}
		if late := now.Sub(deadline); !r.relistened && late > r.grace {
			// This reader ran late past its deadline: whatever the
			// peer sent meanwhile is unread. Read it before judging.
			r.relistened = true
			deadline = now.Add(r.grace)
			continue
		}
		v, why := r.judge.Expired(silent)
		if v != liveness.Wait {
			return 0, nil, &SilenceError{Verdict: v, Why: why, Silent: silent}
		}
		if !r.starved && r.log != nil {
			r.log(silent, why)
		}
		r.starved = true
		deadline = time.Now().Add(r.judge.Recheck)
	}
}

// silence is how long the peer has been silent as this reader could
// tell (heard: the time since the last byte, less the reader's deaf time
// and its process's stalls since then) and as the clock tells (silent).
// Past the limit (StarvedLimit) nothing is excused: a process starved
// that long is of no use to its job either. The two excuses may overlap
// (a handler that was itself starved), which errs toward the peer.
func (r *leasedReader) silence(now time.Time) (heard, silent time.Duration) {
	return r.stalls.judged(r.heard, now, r.deaf, r.limit)
}

// frame takes one whole frame off buf, if there is one.
func (r *leasedReader) frame() (typ byte, body []byte, ok bool, err error) {
	if len(r.buf) < 4 {
		return 0, nil, false, nil
	}
	n := binary.BigEndian.Uint32(r.buf[:4])
	if n == 0 || n > maxFrame {
		return 0, nil, false, fmt.Errorf("rendezvous: attach frame of %d bytes", n)
	}
	if uint32(len(r.buf)-4) < n {
		return 0, nil, false, nil
	}
	if uint32(len(r.buf)-4) == n && n > readSize {
		// A large frame that ends the buffer (a world table): hand the
		// buffer over instead of copying it.
		f := r.buf[4:]
		r.buf = nil
		return f[0], f[1:], true, nil
	}
	f := bytes.Clone(r.buf[4 : 4+n])
	r.buf = r.buf[4+n:]
	if len(r.buf) == 0 && cap(r.buf) > 2*readSize {
		r.buf = nil // let a large frame's array go
	}
	return f[0], f[1:], true, nil
}

// SilenceError ends an attach stream whose peer the judge found frozen,
// gone or unresponsive after its lease (internal/liveness).
type SilenceError struct {
	Verdict liveness.Verdict
	Why     string
	Silent  time.Duration
}

func (e *SilenceError) Error() string {
	return fmt.Sprintf("rendezvous: attach stream silent for %s: %s", e.Silent.Round(time.Millisecond), e.Why)
}

// isSilence reports whether a read ended because the peer was judged
// after its lease.
// A deadline that ended a read while this end shut down counts too, as
// the lease's did before there was a judge.
func isSilence(err error) bool {
	var se *SilenceError
	if errors.As(err, &se) {
		return se.Verdict != liveness.Gone
	}
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// shut stops accepting frames; the writer flushes what is queued (within
// timeout) and half-closes the connection.
func (l *link) shut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// finish is the reader's end: shut, let the writer flush (bounded by
// timeout), and close.
func (l *link) finish(timeout time.Duration) {
	l.shut()
	_ = l.conn.SetWriteDeadline(time.Now().Add(timeout))
	<-l.done
	_ = l.conn.Close()
}

// A world table (frameTable, and a leader's push-pull state) lays out the
// members it lists as a uvarint count, then per member the uvarint rank
// of its leader and its length-prefixed metadata (encodeMeta). It is
// written straight from the member table (appendTableEntry) and read
// straight into it (walkTable): every rank of a job reads the whole
// table once, so a copy per entry on either side is paid N times per
// rank.

// appendTableEntry appends one member of a world table to b.
func appendTableEntry(b []byte, m Member, leader int) []byte {
	b = binary.AppendUvarint(b, uint64(leader))
	b = binary.AppendUvarint(b, uint64(metaSize(m)))
	return appendMeta(b, m)
}

// tableEntry is one rank as a leader announces it: its Member and the rank
// of the gossip member it is attached to.
type tableEntry struct {
	Member
	leader int
}

// walkTable checks a world table, then calls fn with each entry in
// order, its strings made by in; it returns the number of entries. A
// malformed table is refused whole, before fn sees any entry, so a caller
// that applies entries as they come never applies half a table.
func walkTable(b []byte, in *interner, fn func(e *tableEntry)) (int, error) {
	n, err := scanTable(b, &interner{check: true}, nil)
	if err != nil {
		return 0, err
	}
	_, err = scanTable(b, in, fn)
	return n, err
}

// scanTable is one pass of walkTable.
func scanTable(b []byte, in *interner, fn func(e *tableEntry)) (int, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return 0, errBadMsg
	}
	b = b[k:]
	var e tableEntry
	for range n {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > 1<<31 {
			return 0, errBadMsg
		}
		b = b[k:]
		ml, k := binary.Uvarint(b)
		if k <= 0 || ml > uint64(len(b)-k) {
			return 0, errBadMsg
		}
		m, err := decodeMetaIn(b[k:k+int(ml)], in)
		if err != nil {
			return 0, err
		}
		b = b[k+int(ml):]
		if fn != nil {
			e.Member, e.leader = m, int(l)
			fn(&e)
		}
	}
	return int(n), nil
}

// Causes of a loss, as frameGone and kindGone carry them.
const (
	causeDead       byte = iota // declared dead by the failure detector
	causeClosed                 // its attach stream closed without a goodbye
	causeLeader                 // its host leader was lost
	causeLeaderConn             // (attached rank's view of its own leader) the stream closed
	causeSilent                 // its attach stream stayed silent past the lease: frozen or unresponsive
	causeRefused                // its gossip port refused a connection: the process is gone (doubt.go)
)

// ErrSilent is the Cause of a loss found by the attach stream's lease: the
// other end sent nothing, not even its beat, for Config.AttachLease, while
// its socket stayed open. A process stopped by SIGSTOP (or a debugger), or
// one that cannot run at all, looks like this; a process that exits or is
// killed closes its socket instead (ErrAttachClosed, ErrLeaderClosed).
var ErrSilent = errors.New("frozen or unresponsive: silent past its lease on the host's attach stream (stopped, e.g. SIGSTOP, or unable to run)")

// ErrAttachClosed is the Cause of an attached rank's loss seen by its host
// leader: the rank's local stream closed without a goodbye, which the kernel
// does at once when the process exits or is killed.
var ErrAttachClosed = errors.New("its connection to the host leader closed without a goodbye (process exited or was killed)")

// causeError turns a cause code into the LostError's Cause.
func (w *World) causeErrorLocked(cause byte, r int) error {
	switch cause {
	case causeClosed:
		return ErrAttachClosed
	case causeLeaderConn:
		return ErrLeaderClosed
	case causeSilent:
		return ErrSilent
	case causeRefused:
		return ErrRefused
	case causeLeader:
		l := w.members[r].leader
		return fmt.Errorf("its host leader, rank %d (host %s), was lost: %w", l, w.members[l].host, ErrDeclaredDead)
	}
	return ErrDeclaredDead
}

// relayedError is an error a leader reported to its attached rank, kept
// matchable with errors.Is against the sentinel of its kind.
type relayedError struct {
	msg  string
	kind error
}

func (e *relayedError) Error() string        { return e.msg }
func (e *relayedError) Is(target error) bool { return target == e.kind }

// relayedLostError is a loss before formation that a leader reported to
// its attached rank (frameFatal kind 'L'): it keeps the lost rank, so that
// the rank's runtime reports its own failure as that rank's doing
// (LostWorldRank, as LostError).
type relayedLostError struct {
	relayedError
	rank int
}

// LostWorldRank returns the rank whose loss ended formation.
func (e *relayedLostError) LostWorldRank() int { return e.rank }
