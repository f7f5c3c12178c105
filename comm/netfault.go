package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// Data-plane fault injection (internal/netfault describes the faults).
//
// When, and only when, GORUN_NETFAULT arms a fault in this process, New
// wraps every link of every communicator in a faultLink. The wrapping is
// decided once per link at connection time, so a process with nothing
// armed runs exactly the unwrapped path: no flag is tested per frame.
//
// A wrapped link does two things:
//
//   - It carries a CRC-32C of each frame's header fields and payload in a
//     4-byte trailer (the frame's Len grows by 4), and checks it before the
//     communicator sees any field of the frame. A corrupted frame is
//     therefore refused with a *FrameCheckError naming the link, never
//     reduced into a result. Every rank of a job must agree on whether the
//     trailer is there: gorun gives every rank the same GORUN_NETFAULT; a
//     harness that starts ranks itself must do the same.
//   - It acts out the faults that touch the link: holding frames (delay,
//     partition), flipping a bit after the checksum was taken (corrupt) and
//     closing the link (drop, and a partition that outlasts its lease).
//
// The receive side reads the whole frame into a buffer of the link's own
// before checking it, so RecvPayload and RecvReduce copy; that costs
// bandwidth only in a job that asked for faults.

// netPlan is the process's armed plan, read from the environment once.
var netPlan struct {
	once sync.Once
	plan netfault.Plan
	ok   bool
	err  error
}

// netPlanOverride replaces the environment's plan (tests in this process;
// nil: the environment decides).
var netPlanOverride atomic.Pointer[netfault.Plan]

func loadNetPlan() (netfault.Plan, bool, error) {
	if p := netPlanOverride.Load(); p != nil {
		return *p, len(p.Specs) > 0, nil
	}
	netPlan.once.Do(func() { netPlan.plan, netPlan.ok, netPlan.err = netfault.FromEnv() })
	return netPlan.plan, netPlan.ok, netPlan.err
}

// FrameCheckError is a frame whose checksum did not match: the bytes
// changed between the sender's checksum and this receiver.
type FrameCheckError struct {
	From, To  int // world ranks: the link's sending and receiving ends
	Want, Got uint32
}

func (e *FrameCheckError) Error() string {
	return fmt.Sprintf("frame from world rank %d to world rank %d failed its checksum (CRC-32C %08x, computed %08x): corrupted on the link %d->%d",
		e.From, e.To, e.Want, e.Got, e.From, e.To)
}

// Unwrap makes a checksum failure an ErrProtocol: the frame cannot be used.
func (e *FrameCheckError) Unwrap() error { return ErrProtocol }

// ErrLinkFault marks a link closed by an injected drop or by a partition
// that outlasted its lease.
var ErrLinkFault = errors.New("comm: link cut")

// faultTrailer is the checksum's size on the wire.
const faultTrailer = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// unwrapLink returns the transport's own link under a faultLink.
func unwrapLink(l Link) Link {
	if f, ok := l.(*faultLink); ok {
		return f.inner
	}
	return l
}

// faultLink is a Link with a checksum trailer and the faults that touch
// it. Send is safe for concurrent use (smu); the receive side belongs to
// one goroutine, as Link requires.
type faultLink struct {
	inner    Link
	me, peer int // world ranks
	epoch    time.Time
	specs    []netfault.Spec // those that touch this link, from me
	// gates[i] is spec i's step gate (after-steps=), nil for a timed one.
	gates []*netfault.StepGate

	closed    chan struct{} // closed by Close: wakes held senders and the timer
	closeOnce sync.Once
	wg        sync.WaitGroup // the timer goroutine

	// cut is the error every call returns once the link was cut on
	// purpose (drop, partition past its lease).
	cutMu sync.Mutex
	cut   error
	cutC  chan struct{} // closed when cut is set

	// Send side, guarded by smu.
	smu   sync.Mutex
	sbuf  []byte
	shdr  Header
	fired []bool // per spec: a corrupt that has already flipped its bit

	// Receive side (one goroutine).
	rhdr Header
	rbuf []byte
	rlen int
}

var (
	_ Link           = (*faultLink)(nil)
	_ ReduceReceiver = (*faultLink)(nil)
)

func newFaultLink(inner Link, plan netfault.Plan, me, peer int, meHost, peerHost string) *faultLink {
	l := &faultLink{inner: inner, me: me, peer: peer, epoch: plan.Epoch, closed: make(chan struct{}), cutC: make(chan struct{})}
	for _, s := range plan.Specs {
		if s.Touches(me, peer, meHost, peerHost) {
			l.specs = append(l.specs, s)
			var g *netfault.StepGate
			if s.AfterSteps > 0 {
				g = netfault.Gate(s.AfterSteps)
			}
			l.gates = append(l.gates, g)
		}
	}
	l.fired = make([]bool, len(l.specs))
	// The cuts are timed, not triggered by traffic: a rank blocked in a
	// receive must see its link go at the fault's time. One goroutine per
	// cut: it waits for the fault's start (a time, or a step gate), then
	// for its offset (0 for drop, the lease for a partition).
	for i, s := range l.specs {
		var after time.Duration
		var err error
		switch {
		case s.Kind == netfault.Drop:
			err = fmt.Errorf("%w: dropped by injected fault %q", ErrLinkFault, s.Text)
		case s.Kind == netfault.Partition && (s.For == 0 || s.For >= s.Lease):
			after = s.Lease
			err = fmt.Errorf("%w: no frame could cross it for %s, the lease (injected partition %q)", ErrLinkFault, s.Lease, s.Text)
		default:
			continue
		}
		g := l.gates[i]
		l.wg.Go(func() {
			start := l.epoch.Add(s.At)
			if g != nil {
				select {
				case <-g.Done():
					start = g.At()
				case <-l.closed:
					return
				}
			}
			t := time.NewTimer(time.Until(start.Add(after)))
			defer t.Stop()
			select {
			case <-t.C:
				l.cutLink(err)
			case <-l.closed:
			}
		})
	}
	return l
}

// elapsed reports how long spec i has been under way (negative: not yet
// due); ok is false while an after-steps fault waits for its step.
func (l *faultLink) elapsed(i int) (d time.Duration, ok bool) {
	if g := l.gates[i]; g != nil {
		select {
		case <-g.Done():
			return time.Since(g.At()), true
		default:
			return 0, false
		}
	}
	return time.Since(l.epoch) - l.specs[i].At, true
}

// active reports whether spec i acts now, and for how much longer (0: for
// ever).
func (l *faultLink) active(i int) (bool, time.Duration) {
	el, ok := l.elapsed(i)
	s := l.specs[i]
	if !ok || el < 0 || (s.For > 0 && el >= s.For) {
		return false, 0
	}
	if s.For == 0 {
		return true, 0
	}
	return true, s.For - el
}

// cutLink makes err the answer of every call and closes the transport's
// link, which unblocks both ends.
func (l *faultLink) cutLink(err error) {
	l.cutMu.Lock()
	if l.cut == nil {
		l.cut = err
		close(l.cutC)
	}
	l.cutMu.Unlock()
	_ = l.inner.Close()
}

// cutErr returns the cut's error, or err when the link was not cut.
func (l *faultLink) cutErr(err error) error {
	l.cutMu.Lock()
	defer l.cutMu.Unlock()
	if l.cut != nil {
		return l.cut
	}
	return err
}

// hold blocks while a delay or a partition holds frames at now, and
// reports false if the link was closed meanwhile.
func (l *faultLink) hold() bool {
	for {
		var wait time.Duration
		for i, s := range l.specs {
			on, left := l.active(i)
			switch {
			case !on:
			case s.Kind == netfault.Delay:
				wait = max(wait, s.Delay)
			case s.Kind == netfault.Partition && (s.For == 0 || s.For >= s.Lease):
				// Held until the lease runs out and the link is cut
				// (cutC): no frame crosses the cut in between.
				wait = max(wait, 1<<62)
			case s.Kind == netfault.Partition:
				wait = max(wait, left)
			}
		}
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-l.closed:
			t.Stop()
			return false
		case <-l.cutC:
			t.Stop()
			return false
		}
		// A delay holds each frame once; a partition until it ends.
		if !l.partitioned() {
			return true
		}
	}
}

// partitioned reports whether a partition holds the link now.
func (l *faultLink) partitioned() bool {
	for i, s := range l.specs {
		if on, _ := l.active(i); on && s.Kind == netfault.Partition {
			return true
		}
	}
	return false
}

// frameSum is the CRC-32C of h's fields (Len as the payload's length) and
// payload.
func frameSum(h *Header, payload []byte) uint32 {
	var b [HeaderSize]byte
	hh := *h
	hh.Len = uint64(len(payload))
	hh.Encode(b[:])
	return crc32.Update(crc32.Checksum(b[:], castagnoli), castagnoli, payload)
}

// Send holds the frame while a fault says so, then sends it with its
// checksum trailer (one bit flipped after the checksum if a corrupt fault
// is due).
func (l *faultLink) Send(h *Header, payload []byte) error {
	if err := l.cutErr(nil); err != nil {
		return err
	}
	if !l.hold() {
		return l.cutErr(ErrClosed)
	}
	l.smu.Lock()
	defer l.smu.Unlock()
	n := len(payload)
	if cap(l.sbuf) < n+faultTrailer {
		l.sbuf = make([]byte, n+faultTrailer)
	}
	b := l.sbuf[:n+faultTrailer]
	copy(b, payload)
	binary.LittleEndian.PutUint32(b[n:], frameSum(h, payload))
	for i, s := range l.specs {
		if s.Kind != netfault.Corrupt || l.fired[i] {
			continue
		}
		if el, ok := l.elapsed(i); ok && el >= 0 {
			l.fired[i] = true
			b[0] ^= 0x10 // the first payload byte, or the trailer of an empty frame
		}
	}
	l.shdr = *h
	l.shdr.Len = uint64(len(b))
	if err := l.inner.Send(&l.shdr, b); err != nil {
		return l.cutErr(err)
	}
	return nil
}

// RecvHeader reads the next frame whole and checks its trailer before
// handing out the header.
func (l *faultLink) RecvHeader(h *Header) error {
	if err := l.cutErr(nil); err != nil {
		return err
	}
	if err := l.inner.RecvHeader(&l.rhdr); err != nil {
		return l.cutErr(err)
	}
	n := int(l.rhdr.Len)
	if n < faultTrailer || n > maxFaultFrame {
		return fmt.Errorf("%w: a %d-byte frame from world rank %d has no checksum trailer (every rank must run with the same %s)",
			ErrProtocol, n, l.peer, netfault.Env)
	}
	if cap(l.rbuf) < n {
		l.rbuf = make([]byte, n)
	}
	b := l.rbuf[:n]
	if err := l.inner.RecvPayload(b); err != nil {
		return l.cutErr(err)
	}
	want := binary.LittleEndian.Uint32(b[n-faultTrailer:])
	l.rlen = n - faultTrailer
	if got := frameSum(&l.rhdr, b[:l.rlen]); got != want {
		return &FrameCheckError{From: l.peer, To: l.me, Want: want, Got: got}
	}
	*h = l.rhdr
	h.Len = uint64(l.rlen)
	return nil
}

// maxFaultFrame bounds the buffer a frame's claimed length can make the
// receive side allocate.
const maxFaultFrame = 1 << 30

// RecvPayload copies the checked payload out.
func (l *faultLink) RecvPayload(dst []byte) error {
	if len(dst) != l.rlen {
		return fmt.Errorf("%w: payload of %d bytes read as %d", ErrProtocol, l.rlen, len(dst))
	}
	copy(dst, l.rbuf)
	return nil
}

// RecvReduce folds the checked payload into dst.
func (l *faultLink) RecvReduce(dst []byte, f func(dst, src []byte)) error {
	if len(dst) != l.rlen {
		return fmt.Errorf("%w: payload of %d bytes read as %d", ErrProtocol, l.rlen, len(dst))
	}
	if len(dst) > 0 {
		f(dst, l.rbuf[:l.rlen])
	}
	return nil
}

// EagerLimit leaves room for the trailer and its padding.
func (l *faultLink) EagerLimit() int { return max(l.inner.EagerLimit()-8, 0) }

func (l *faultLink) Kind() string { return l.inner.Kind() }

// Close closes the transport's link, wakes held senders and waits for the
// timer goroutine. Idempotent.
func (l *faultLink) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		_ = l.inner.Close()
		l.wg.Wait()
	})
	return nil
}
