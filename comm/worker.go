package comm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Calls run one at a time in issue order, each by whichever goroutine holds
// the run token (c.running): the worker goroutine, or a goroutine blocked
// in Wait on a call that has not started yet. Only the token holder
// receives from the queue, and it runs what it receives before letting go,
// so the order of the queue is the order of execution. The holder is the
// only goroutine that receives on links and touches per-call state, so the
// algorithms below need no locks (the token's atomic hand-over orders one
// holder's writes before the next one's reads).
//
// Why not the worker alone: a call issued and waited for at once would
// then cross two goroutine hand-offs (issuer → worker → waiter), and with
// more than one P each wakes an idle thread; on a small, busy host that
// costs more than the collective itself. The worker still exists so that a
// call progresses while its issuer computes instead of waiting (overlap).

// tunableDur is a setting benchmarks may change while calls run
// (SetTuning in export_test.go).
type tunableDur struct{ ns atomic.Int64 }

func tunable(d time.Duration) *tunableDur {
	t := &tunableDur{}
	t.ns.Store(int64(d))
	return t
}

func (t *tunableDur) get() time.Duration { return time.Duration(t.ns.Load()) }

// inlineWait lets Wait run calls (see above); benchmarks turn it off to
// compare.
var inlineWait atomic.Bool

func init() { inlineWait.Store(true) }

// worker runs calls nobody is waiting for, until the queue is closed and
// drained. It is woken by issue (and by Close, and by a Wait that let go of
// the token with calls still queued).
func (c *Comm) worker() {
	defer close(c.workerExited)
	for range c.wake {
		if c.drain(noTarget) {
			return
		}
	}
}

// kick wakes the worker; it never blocks (one pending wake is enough).
func (c *Comm) kick() {
	select {
	case c.wake <- struct{}{}:
		c.kicks.Add(1)
	default:
	}
}

// noTarget is drain's target when it runs whatever is queued (the worker).
const noTarget = ^uint64(0)

// drain takes the run token if it is free and runs queued calls in order,
// stopping after call number target (a Wait running its own call and the
// ones issued before it; noTarget: until the queue is empty). It reports
// whether it found the queue closed and empty. Whoever lets go of the
// token with calls still queued (or with the queue closing) kicks the
// worker, so no call is left behind.
func (c *Comm) drain(target uint64) (closed bool) {
	if !c.running.CompareAndSwap(false, true) {
		return false
	}
	c.waiterRuns = target != noTarget
	for target == noTarget || c.completed.Load() <= target {
		cl, end := c.take()
		if end {
			closed = true
			break
		}
		if cl == nil {
			break
		}
		first, last, done := cl.seq, cl.seq, true // cl is recycled once executed
		if c.fusable(cl) {
			last, done = c.runFused(cl)
		} else {
			c.execute(cl)
		}
		if done && first <= target && target <= last {
			break
		}
	}
	held := c.heldCalls() > 0
	c.running.Store(false)
	if held || len(c.queue) > 0 || c.closing.Load() {
		// Calls issued while we held the token (or taken from the queue
		// and held, see fuse.go), or a closed queue that only the worker
		// may act on (it exits): the worker may have found the token
		// taken and gone back to sleep.
		c.kick()
	}
	return closed
}

// execute runs one call and completes it. Token holder only.
func (c *Comm) execute(cl *call) {
	if err := c.Err(); err != nil {
		c.finish(cl, err)
		return
	}
	if err := cl.invalid; err != nil {
		c.rec.end(c.rec.start(cl, c.cseq, 0, ticks()), err, ticks())
		c.fail(err)
		c.finish(cl, err)
		return
	}
	if cl.kind == kindProbe { // not a message: no number, no record (probe.go)
		c.finish(cl, c.probe(cl.root))
		return
	}
	var peerSeq uint64 // Send/Recv: their number with this peer (see FlightRecord.PeerSeq)
	switch cl.kind {
	case KindSend, KindRecv:
		c.peers[cl.root].seq++
		// Every collective counts once on every pair, so what this pair
		// has run beyond the collectives is its Sends and Recvs.
		peerSeq = c.peers[cl.root].seq - c.cseq
	default:
		c.cseq++
		for _, p := range c.peers {
			if p != nil {
				p.seq++
			}
		}
	}
	record := !flightOff.Load()
	var slot uint64
	if record {
		slot = c.rec.start(cl, c.cseq, peerSeq, ticks())
	}
	err := c.run(cl)
	if err == nil {
		err = c.flushAll(cl)
	}
	if err != nil {
		c.fail(err)
		if errors.Is(err, errLinkDown) {
			err = c.failErr
		}
	}
	if record {
		c.rec.end(slot, err, ticks())
	}
	c.finish(cl, err)
}

// errLinkDown marks an error from a link that was closed because the
// communicator already failed; the cause is failErr.
var errLinkDown = errors.New("comm: link closed after failure")

// linkErr turns a transport error on the link to p into the error the call
// reports: the communicator's failure if it already failed (we closed the
// link), else a PeerError naming p.
func (c *Comm) linkErr(p int, err error) error {
	select {
	case <-c.failed:
		return errLinkDown
	default:
	}
	reason := "connection lost: " + err.Error()
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		reason = "connection closed (the process exited or crashed, or the link was dropped)"
	}
	return &PeerError{Rank: p, WorldRank: c.g.GlobalRank(p), Host: c.g.Host(p), Reason: reason, Err: ErrPeerLost}
}

func (c *Comm) run(cl *call) error {
	switch cl.kind {
	case KindAllReduce:
		if cl.co == nil {
			return c.allReduce(cl, cl.send, cl.recv)
		}
		// A coalesced all-reduce that does not fuse: its vectors one
		// after another.
		for i := range cl.co.parts {
			if err := c.allReduce(cl, cl.co.parts[i].send, cl.co.parts[i].recv); err != nil {
				return err
			}
		}
		return nil
	case KindReduce:
		return c.reduce(cl)
	case KindAllGather:
		return c.allGather(cl)
	case KindReduceScatter:
		return c.reduceScatter(cl)
	case KindBroadcast:
		return c.broadcast(cl)
	case KindAllToAll, KindAllToAllV:
		return c.allToAll(cl)
	case KindBarrier:
		return c.recursiveDoubling(cl, Uint8, nil, nil)
	case KindSend:
		return c.sendTo(cl, cl.root, cl.send)
	case KindRecv:
		return c.recvFrom(cl, cl.root, cl.recv)
	}
	return fmt.Errorf("%w: unknown call kind %v", ErrInvalidArgument, cl.kind)
}

// scratch returns worker-owned scratch slot i with n bytes, growing it as
// needed and reusing it across calls so the steady state allocates nothing.
func (c *Comm) scratch(i, n int) []byte {
	if cap(c.scr[i]) < n {
		c.scr[i] = make([]byte, n+n/4)
	}
	return c.scr[i][:n]
}

// post queues payload for asynchronous sending to p in segments.
//
// One request per message, whatever its size: the sender goroutine cuts it
// into segments. (Queueing segments instead could fill the queue while the
// sender waits for the peer to read, and the peer for us: a deadlock on
// large messages.) The worker never has more than a few messages per peer
// in flight, far below the queue's capacity, so post never blocks.
func (c *Comm) post(cl *call, p int, payload []byte) {
	h := c.headerTo(cl, p)
	h.Aux = uint64(len(payload))
	c.postHdr(p, h, payload)
}

// postHdr is post with the message's header given.
func (c *Comm) postHdr(p int, h Header, payload []byte) {
	pe := c.peers[p]
	pe.sendq <- sendReq{h: h, payload: payload, seg: c.cfg.SegmentBytes}
	pe.pending++
	c.posts++
	// Let the sender goroutine start now: on a rank with one P it would
	// otherwise wait for this goroutine to block or to yield while it
	// polls for the peer's data (which may wait for this very message).
	runtime.Gosched()
}

// flush waits for every posted send to p.
func (c *Comm) flush(cl *call, p int) error {
	pe := c.peers[p]
	var first error
	for ; pe.pending > 0; pe.pending-- {
		if err := <-pe.sendErr; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return c.sendErr(cl, p, first)
	}
	return nil
}

func (c *Comm) flushAll(cl *call) error {
	var first error
	for p, pe := range c.peers {
		if pe != nil && pe.pending > 0 {
			if err := c.flush(cl, p); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// sendTo sends payload to p and waits until it is handed off. Small payloads
// go inline, without the sender goroutine's hand-off latency.
func (c *Comm) sendTo(cl *call, p int, payload []byte) error {
	pe := c.peers[p]
	if pe.pending == 0 && len(payload) <= pe.link.EagerLimit() && len(payload) <= c.cfg.SegmentBytes {
		pe.inlHdr = c.headerTo(cl, p)
		pe.inlHdr.Aux = uint64(len(payload))
		pe.inlHdr.Len = uint64(len(payload))
		if err := pe.link.Send(&pe.inlHdr, payload); err != nil {
			return c.sendErr(cl, p, err)
		}
		return nil
	}
	c.post(cl, p, payload)
	return c.flush(cl, p)
}

// reduceRecvd is the reduction recvReduce hands to the link (as c.rrFn):
// the link hands out pieces of the destination, and the matching piece of
// the local operand is at the same offset.
func (c *Comm) reduceRecvd(d, s []byte) {
	o := int(uintptr(unsafe.Pointer(unsafe.SliceData(d))) - c.rr.base)
	reduce3(c.rr.op, c.rr.ct, d, c.rr.local[o:o+len(d)], s)
}

// eager reports whether sendRecv sends n bytes to p inline: the send is
// complete, its buffer free to overwrite, before the receive starts.
func (c *Comm) eager(p, n int) bool {
	pe := c.peers[p]
	return pe.pending == 0 && n <= pe.link.EagerLimit() && n <= c.cfg.SegmentBytes
}

// sendRecv sends sbuf to `to` while receiving rbuf from `from`. With reduce
// set, the received data b is combined as rbuf = local op b over compute type
// ct (local nil: rbuf itself; otherwise the same length as rbuf, and rbuf
// itself or not overlapping it). Large sends run on the sender goroutine so
// that the two directions overlap and no pair of ranks can block each other
// on full buffers, except where the calling thread interleaves them itself
// (callerFrame, sendRecvOnCaller).
func (c *Comm) sendRecv(cl *call, to int, sbuf []byte, from int, rbuf []byte, reduce bool, local []byte, ct DType) error {
	if reduce && local == nil {
		local = rbuf
	}
	if c.eager(to, len(sbuf)) {
		if err := c.sendTo(cl, to, sbuf); err != nil {
			return err
		}
	} else if f := c.callerFrame(to, sbuf, rbuf); f > 0 {
		return c.sendRecvOnCaller(cl, to, sbuf, f, from, rbuf, reduce, local, ct)
	} else {
		c.post(cl, to, sbuf)
	}
	if err := c.recvAll(cl, from, rbuf, reduce, local, ct); err != nil {
		return err
	}
	return c.flush(cl, to)
}

// foreignCallers is set by a process whose collectives are called from
// threads Go does not own (C and Python through libgorun; see
// SetForeignCallers).
var foreignCallers atomic.Bool

// SetForeignCallers tells comm that its calls come from threads Go does
// not own, as in libgorun, where a C caller's thread runs Go locked to
// itself. Whenever such a thread lets another goroutine run (a blocking
// channel receive, runtime.Gosched), Go hands its P to another thread and
// puts the caller's thread to sleep until the P comes back: two thread
// switches at least, where a Go program switches goroutines on one thread.
// So such a process's shared-memory waiters yield the P only where one of
// its goroutines must run for the call to progress (see goschedOK): from
// Python through libgorun (2 ranks, 2 MiB all-reduce, alternating pairs,
// notes/torch-backend.md) 2.2-3.5 ms per call with the Gosched calls of
// the shared-memory waits, 1.2-1.3 ms without. And large ring steps run on
// the calling thread alone, not handed to the sender goroutines
// (callerFrame).
func SetForeignCallers(on bool) { foreignCallers.Store(on) }

// callerStepMinEager is the smallest EagerLimit of the link to the next
// rank for which a foreign caller interleaves a large send with its receive
// itself (callerFrame): 64 KiB, so that shared memory (128 KiB with the
// default ring) and in-memory links qualify, while TCP (tcpEager, 16 KiB)
// keeps the sender goroutine, whose frames of TCPSegmentBytes let the
// kernel's copies overlap the receive (from foreign callers over TCP: not
// measured). A variable only so that tests can run steps on tiny rings.
var callerStepMinEager = func() *atomic.Int64 { v := new(atomic.Int64); v.Store(64 << 10); return v }()

// handsOffMin is the smallest share of a call's largest buffer per rank,
// in EagerLimits of the link to the next rank, from which a foreign
// caller's blocking call goes to the worker goroutine (handsOff): 16, half
// the ring on shared memory (2 MiB of the default 4 MiB, so 8 MiB
// all-reduces on 4 ranks). A variable for tests.
var handsOffMin = func() *atomic.Int64 { v := new(atomic.Int64); v.Store(16); return v }()

// handsOff reports whether cl, issued with IssuerWaits by a foreign
// caller, goes to the worker goroutine anyway, which then runs it as a Go
// program's worker does, sending through the per-peer sender goroutines,
// while the caller's thread sleeps in Wait. That costs the caller two
// thread switches (its locked thread gives up the P and gets it back), and
// from ring steps of half the ring on gains what the caller's own steps
// (callerFrame, two frames ahead at most) lose to a sender goroutine that
// keeps the ring full. 4 ranks on 2 cores, in-place all-reduce from torch,
// native time / torch time pooled over several rounds: 8 MiB
// 0.76-0.96 on the caller against 0.95-0.98 handed over; below half the
// ring the hand-over lost (4 MiB 0.83-0.96 against 0.88-0.99, 2 MiB
// 0.72-0.95 against 0.93-0.98), and handing 2-4 MiB over only while the
// CPUs were far apart did not gain either (notes/torch-backend.md).
// Only where callerFrame would apply: more than two
// ranks (the pair exchange never used the sender goroutines) over links
// that qualify.
func (c *Comm) handsOff(cl *call) bool {
	if c.n <= 2 || cl.invalid != nil {
		return false
	}
	el := int64(c.callerStepEager((c.me + 1) % c.n))
	return el > 0 && int64(max(len(cl.send), len(cl.recv))/c.n) >= handsOffMin.Load()*el
}

// callerStepEager is the EagerLimit of the link to p where a foreign
// caller runs its ring steps to p itself (callerFrame) and may hand large
// calls over (handsOff): with foreign callers, over a link whose
// EagerLimit is at least callerStepMinEager. Else 0.
func (c *Comm) callerStepEager(p int) int {
	if !foreignCallers.Load() {
		return 0
	}
	pe := c.peers[p]
	if pe == nil || pe.link == nil {
		return 0
	}
	if el := pe.link.EagerLimit(); int64(el) >= callerStepMinEager.Load() {
		return el
	}
	return 0
}

// callerFrame returns the frame size in which the calling thread sends sbuf
// to p itself, interleaved with receiving rbuf (sendRecvOnCaller), or 0
// where sendRecv hands the send to p's sender goroutine instead.
//
// Only for calls a foreign caller runs on its own thread, in Wait
// (SetForeignCallers): there every hand-off to the sender goroutine and
// back (post's Gosched, flush's channel receive, the P the two pass between
// the caller's locked thread and the sender's thread) costs thread
// switches. Calls the worker goroutine runs, which nobody waits for yet,
// keep the sender goroutine, which on a host with cores to spare sends
// while the worker receives. 4 ranks on 2 cores, 2 MiB ring
// all-reduce from C: 92 context switches per call against a Go program's
// 35 (notes/torch-backend.md). A frame is at most the link's EagerLimit,
// which is what makes the interleaving deadlock-free (sendRecvOnCaller),
// and at most SegmentBytes, a multiple of 8 so frames end on element
// bounds. Not when the send has posted frames still queued before it, nor
// when the buffers overlap (a reduction into rbuf must not reach bytes not
// sent yet, and the peer may frame its message differently).
func (c *Comm) callerFrame(p int, sbuf, rbuf []byte) int {
	if !c.waiterRuns {
		return 0
	}
	el := c.callerStepEager(p)
	if el == 0 || c.peers[p].pending > 0 || overlaps(sbuf, rbuf) {
		return 0
	}
	return min(el, c.cfg.SegmentBytes) &^ 7
}

// sendRecvOnCaller is sendRecv on the calling goroutine alone: it sends
// sbuf to `to` in frames of at most frame bytes, and from the second frame
// on receives one frame of rbuf's message from `from` after each frame it
// sends (then the rest once all of sbuf is sent). Running two frames ahead
// rather than one lets a chunk of two frames (1 MiB on 4 ranks) go out
// whole before the caller waits, as the sender goroutine sends it: 4 ranks
// on 2 cores, 5 interleaved rounds, from torch 1 MiB 0.70 -> 1.01 of
// native, 2 MiB 0.83 -> 0.85, 8 MiB 1.00 -> 1.04 (notes/torch-backend.md).
// Not more than two: EagerLimit promises room for two frames and no more,
// and on shared memory that is all there is right after the producer
// skipped back to the ring's beginning (wrapFrom), until the peer reads
// the skip record. Eight or sixteen frames ahead (tried and measured) left all four
// torch ranks of an 8 MiB all-reduce waiting for room on full rings in 3
// of 12 runs at sixteen, and gained nothing where they did not hang (with
// skips turned off so that they could not: 8 MiB 0.87 of native against
// 0.96 at two; notes/torch-backend.md).
//
// Deadlock freedom, for any framing of the incoming message and any mix
// of ranks that do this and ranks that use their sender goroutine (which
// never stop receiving): every rank has one outgoing and one incoming
// message in a step (a ring, a pair exchange, a staggered all-to-all
// step: cycles). Let s_r be the frames rank r has sent and g_r those it
// has received. A Send blocks only while the next rank has at least two
// of r's frames unread (EagerLimit: two frames of at most that size are
// delivered without the peer reading), s_r - g_{r+1} >= 2; a receive only
// while the previous rank has sent nothing more, s_{r-1} = g_r, and has
// more to send. If one rank is blocked in Send, the next is not in a
// receive (that would need s_r = g_{r+1}), so it is also blocked in Send,
// and so on around the cycle. Each is about to send a frame, so each has
// s_r - g_r <= 1 (it receives whenever it is two ahead) unless its
// incoming message is complete, in which case its previous rank has
// finished sending and is not blocked in Send. Summing s_r - g_{r+1} >= 2
// around the cycle gives sum(s_r - g_r) >= 2n against <= n. If no rank is
// blocked in Send, a rank blocked in a receive has a previous rank blocked
// in a receive too, each with g_r + 2 <= s_r = g_{r+1} (it receives only
// when two ahead or done sending, and the previous one is not done):
// around the cycle g_r < g_r. So some rank always progresses.
func (c *Comm) sendRecvOnCaller(cl *call, to int, sbuf []byte, frame int, from int, rbuf []byte, reduce bool, local []byte, ct DType) error {
	pe := c.peers[to]
	l := pe.link
	var sent, got, soff, roff int
	sdone, rdone := false, false
	for !sdone || !rdone {
		if !sdone {
			end := min(soff+frame, len(sbuf))
			pe.inlHdr = c.headerTo(cl, to)
			pe.inlHdr.Aux = uint64(len(sbuf))
			pe.inlHdr.Len = uint64(end - soff)
			if err := l.Send(&pe.inlHdr, sbuf[soff:end]); err != nil {
				return c.sendErr(cl, to, err)
			}
			soff, sent = end, sent+1
			sdone = soff == len(sbuf)
		}
		if !rdone && (got < sent-1 || sdone) {
			n, err := c.recvPiece(cl, from, rbuf, roff, reduce, local, ct)
			if err != nil {
				return err
			}
			roff, got = roff+n, got+1
			rdone = roff == len(rbuf)
		}
	}
	return nil
}

// recvHeader reads the next frame header from p and checks it against the
// call: an abort or goodbye from p, a frame of another call (desync) or a
// payload that does not fit are errors, and nothing is read into dst.
func (c *Comm) recvHeader(cl *call, p int, h *Header, total, remaining int) error {
	if err := c.nextHeader(p, h); err != nil {
		if errors.Is(err, ErrProtocol) {
			return fmt.Errorf("comm: from %s: %w", c.info[p], err)
		}
		return c.linkErr(p, err)
	}
	if h.Frame != frameData {
		return c.frameErr(p, h, cl.info(c.peers[p].seq).String())
	}
	want := c.expectFrom(cl, p)
	theirs := CallInfo{Kind: h.Kind, DType: h.DType, Op: h.Op, Count: int(h.Count), Root: int(h.Root), Seq: h.Seq}
	if h.Kind == KindAllReduce && h.Root < 0 {
		theirs.Root = -1 // minus the calls of a fused message
	}
	if h.Kind != KindAllReduce && h.Kind != KindReduceScatter && h.Kind != KindReduce {
		theirs.Op = 0
	}
	desync := func(detail string) error {
		mine := cl.info(c.peers[p].seq)
		if cl.kind == KindAllToAllV {
			// Per-peer counts: show what each side has for this pair.
			mine.Count = int(want.Count)
			if detail == "" {
				detail = fmt.Sprintf("counts are what rank %d sends to rank %d", p, c.me)
			}
		}
		return &DesyncError{Rank: c.me, Mine: mine, Peer: p, Theirs: theirs, Detail: detail}
	}
	switch {
	case h.Group != want.Group:
		return desync("frame of another group")
	case h.Kind == KindAllReduce && h.Root < -1 && cl.kind == KindAllReduce:
		// A fused message (fuse.go) where this rank runs the call alone:
		// this rank does not take the call as fusable.
		return desync(fmt.Sprintf("rank %d sent #%d-#%d fused into one message, which rank %d does not fuse (is Config.FuseBytes the same on every rank?)",
			p, h.Seq, h.Seq+uint64(-h.Root-1), c.me))
	case h.Kind != want.Kind || h.DType != want.DType || h.Op != want.Op || h.Root != want.Root || h.Count != want.Count || h.Seq != want.Seq:
		return desync("")
	case h.Aux != uint64(total):
		return desync(fmt.Sprintf("rank %d sends %d bytes, rank %d expects %d", p, h.Aux, c.me, total))
	case h.Len > uint64(remaining) || (h.Len == 0 && remaining > 0):
		return fmt.Errorf("%w: rank %d sent a %d-byte segment with %d bytes left", ErrProtocol, p, h.Len, remaining)
	}
	return nil
}

// frameErr turns an abort or goodbye frame from p into the error it means,
// reading the abort's reason.
func (c *Comm) frameErr(p int, h *Header, before string) error {
	pe := func(reason string, err error) *PeerError {
		return &PeerError{Rank: p, WorldRank: c.g.GlobalRank(p), Host: c.g.Host(p), Reason: reason, Err: err}
	}
	if h.Frame == frameBye {
		return pe("closed its communicator before "+before, ErrClosed)
	}
	if h.Len > maxAbortText {
		return pe("aborted (reason too long to read)", ErrAborted)
	}
	text := make([]byte, h.Len)
	if err := c.peers[p].link.RecvPayload(text); err != nil {
		if c.Err() != nil {
			return errLinkDown // we failed meanwhile and closed the link: report our cause
		}
		return pe("aborted (reason lost: "+err.Error()+")", ErrAborted)
	}
	cause := ErrAborted
	switch h.Aux {
	case 1:
		cause = ErrDesync
	case 2:
		cause = ErrPeerLost
	case 3:
		cause = ErrInvalidArgument
	case 4:
		cause = ErrStalled
	}
	if i := bytes.IndexByte(text, 0); i >= 0 {
		fields := text[i+1:]
		text = text[:i]
		var de DesyncError
		var se StallError
		switch {
		case cause == ErrDesync && json.Unmarshal(fields, &de) == nil:
			d := de.turnedTo(c.me)
			d.ReportedBy = c.info[p]
			return d
		case cause == ErrStalled && json.Unmarshal(fields, &se) == nil:
			se.ReportedBy = c.info[p]
			return &se
		}
	}
	e := pe("aborted", cause)
	e.RemoteText = string(text)
	return e
}

// sendErr explains a failed send to p. A peer that fails sends an abort (or
// goodbye) frame and closes; our send then breaks before we read why. So
// before blaming the connection, read what p left for us, bounded by
// AbortTimeout.
func (c *Comm) sendErr(cl *call, p int, err error) error {
	if c.Err() != nil {
		return errLinkDown
	}
	l := c.peers[p].link
	ch := make(chan error, 1)
	go func() { // owned: waited for below in every case
		var h Header
		for {
			if c.nextHeader(p, &h) != nil {
				ch <- nil
				return
			}
			if h.Frame != frameData {
				ch <- c.frameErr(p, &h, cl.info(c.peers[p].seq).String())
				return
			}
			if h.Len > 64<<20 || l.RecvPayload(make([]byte, h.Len)) != nil {
				ch <- nil
				return
			}
		}
	}()
	var why error
	select {
	case why = <-ch:
	case <-time.After(c.cfg.AbortTimeout):
		_ = l.Close()
		why = <-ch
	}
	if why != nil {
		return why
	}
	if why := c.askWhy(p); why != nil {
		return why
	}
	return c.linkErr(p, err)
}

// askWhy asks peer p over the side channel why it broke the link, for a
// send that failed without an abort frame to read: a peer that failed
// while this rank was blocked writing to it may have reset the connection
// before its abort could be sent (its sender was blocked on this rank the
// same way). While p's communicator is open, its status carries the
// failure; a DesyncError is returned as if the abort had arrived,
// anything else is left to linkErr.
func (c *Comm) askWhy(p int) error {
	if c.statusT == nil || c.cfg.DesyncCheckAfter <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.queryTimeout())
	defer cancel()
	b, err := c.statusT.QueryStatus(ctx, c.g, c.gid, p)
	c.queries.Add(1)
	c.queryBytes.Add(int64(len(b)))
	var st rankStatus
	if err != nil || json.Unmarshal(b, &st) != nil || st.Rank != p || st.Failed == "" {
		return nil
	}
	if st.Desync != nil {
		d := st.Desync.turnedTo(c.me)
		d.ReportedBy = c.info[p] + " (asked over the side channel after it reset the link)"
		return d
	}
	return nil
}

// recvFrom receives exactly len(dst) bytes of the current call from p.
func (c *Comm) recvFrom(cl *call, p int, dst []byte) error {
	return c.recvAll(cl, p, dst, false, nil, 0)
}

// recvAll receives the len(dst) bytes of the current call's message from p
// frame by frame (recvPiece): stored, or with reduce folded in as in
// recvReduce.
func (c *Comm) recvAll(cl *call, p int, dst []byte, reduce bool, local []byte, ct DType) error {
	for off := 0; ; {
		n, err := c.recvPiece(cl, p, dst, off, reduce, local, ct)
		if err != nil {
			return err
		}
		if off += n; off == len(dst) {
			return nil
		}
	}
}

// recvPiece receives the next frame of a message of len(dst) bytes from p,
// of which off have arrived, into dst[off:] (with reduce, folded in as
// dst = local op b, local as in recvReduce), and returns its length.
func (c *Comm) recvPiece(cl *call, p int, dst []byte, off int, reduce bool, local []byte, ct DType) (int, error) {
	h := &c.peers[p].recvHdr
	l := c.peers[p].link
	if err := c.recvHeader(cl, p, h, len(dst), len(dst)-off); err != nil {
		return 0, err
	}
	n := int(h.Len)
	var err error
	switch rr, direct := l.(ReduceReceiver); {
	case !reduce:
		err = l.RecvPayload(dst[off : off+n])
	case direct:
		c.rr.base, c.rr.local, c.rr.op, c.rr.ct = uintptr(unsafe.Pointer(unsafe.SliceData(dst))), local, cl.op, ct
		err = rr.RecvReduce(dst[off:off+n], c.rrFn)
		c.rr.local = nil
	default:
		tmp := c.scratch(1, n)
		if err = l.RecvPayload(tmp); err == nil {
			reduce3(cl.op, ct, dst[off:off+n], local[off:off+n], tmp)
		}
	}
	if err != nil {
		return 0, c.linkErr(p, err)
	}
	return n, nil
}

// recvReduce receives len(dst) bytes b from p and stores dst = local op b
// (local is dst itself, or the same length and not overlapping it).
func (c *Comm) recvReduce(cl *call, p int, dst, local []byte, ct DType) error {
	return c.recvAll(cl, p, dst, true, local, ct)
}
