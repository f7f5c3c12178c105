package comm

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// flightOff turns the recorder off (and with it desync and stall
// detection), only so that a benchmark can measure what recording costs
// (SetFlightRecorder in export_test.go).
var flightOff atomic.Bool

// The flight recorder keeps each communicator's last Config.FlightRecords
// calls, always on, so it is built to cost the token holder as little as
// Go allows: per call, two reads of the tick counter (start, end; a third,
// the issue time, only for a call queued behind another) and two atomic
// stores, no lock, no allocation, no interface call.
//
// The token holder is the only writer. start fills the next slot of a
// preallocated ring with plain stores, then publishes it by storing the
// record count n; end stores the end tick into the slot's one atomic
// field. A record is running while its end tick is older than its start
// (the slot's end tick from its previous lap; ticks never go back), so a
// reused slot needs no reset. Readers (the stuck-call watchdog, a status
// answer, a dump) load n, copy slots, and load n again: a slot the writer
// may have started to reuse meanwhile is dropped from the copy, not
// trusted. Every field is a machine word or smaller, so a copy racing with
// the writer can be stale but not torn into something unsafe (the Go
// memory model's guarantee for word-sized reads). Under the race detector,
// which would rightly report that overlap, the writer takes the readers'
// lock instead (flight_race.go); the logic is otherwise the same.
//
// A failed call's error text (a string, not a word) is written under the
// readers' lock before its end tick is published: failures are rare.

// CallState is where a recorded call is.
type CallState string

// Call states in flight records.
const (
	StateRunning CallState = "running" // started, not finished
	StateDone    CallState = "done"    // finished without error on this rank
	StateFailed  CallState = "failed"  // finished with an error
)

// FlightRecord is one call in a communicator's flight recorder.
type FlightRecord struct {
	// Call is the call's fingerprint. Call.Seq numbers collectives of the
	// group from 1; a Send or Recv carries the number of the collective
	// before it (and P2P is set).
	Call CallInfo `json:"call"`
	P2P  bool     `json:"p2p,omitempty"`
	// PeerSeq, for a Send or Recv, is how many Sends and Recvs this rank
	// has run with that peer, this one included. Between two ranks the
	// point-to-point calls pair off in order: a rank's n-th Send to a peer
	// or Recv from it matches the peer's n-th Recv or Send, between the
	// same two collectives.
	PeerSeq uint64 `json:"peer_seq,omitempty"`
	// Issued equals Started for a call that had nothing ahead of it.
	Issued  time.Time `json:"issued"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	State   CallState `json:"state"`
	Err     string    `json:"err,omitempty"`
	// Fused, when above 1, is how many calls (this one among them) ran
	// as one fused message (see "Fusion" in the package comment).
	Fused int `json:"fused,omitempty"`
	// Label is the caller's name for the call (WithLabel): the torch API
	// call, for one issued by the torch backend. Empty without one.
	Label string `json:"label,omitempty"`
}

// slot is a FlightRecord as the token holder writes it: times in ticks,
// every field a word or less (see above).
type slot struct {
	kind          Kind
	dtype         DType
	op            Op
	failed        bool
	label         Label
	root          int32
	fused         int32 // calls of the fused message it ran in; 0: alone
	count         int64
	seq           uint64
	peerSeq       uint64 // Send/Recv only
	issued, start int64
	end           atomic.Int64 // < start while running
}

// recorder is the ring of records of one communicator.
type recorder struct {
	recs []slot        // ring; recs[i%len] is record number i
	n    atomic.Uint64 // records published so far
	// p2p[r] is how many Sends and Recvs this rank has run with group rank
	// r (written by the token holder on Send and Recv only).
	p2p []atomic.Uint64

	// mu orders readers among themselves and guards errs; under the race
	// detector the writer takes it too.
	mu   sync.Mutex
	errs []string // errs[i%len]: error text of failed record i

	// trace, when set (StartCallTrace), keeps every call's record as it
	// ends, past the ring's size. Off, it costs end one atomic load.
	trace atomic.Pointer[callTrace]
}

// callTrace is every finished call of a communicator since
// StartCallTrace, up to limit records (dropped counts the rest).
type callTrace struct {
	mu      sync.Mutex
	recs    []FlightRecord
	limit   int
	dropped int
}

// newRecorder keeps the last size records. The ring has one slot more, the
// one the writer fills next, so that a reader that finds the writer busy
// can still trust all size.
func newRecorder(size, group int) *recorder {
	r := &recorder{recs: make([]slot, size+1), errs: make([]string, size+1), p2p: make([]atomic.Uint64, group)}
	// Touch every slot now: the ring (256 records, 20 KiB by default) is
	// fresh memory, and each of its pages would otherwise fault on the
	// first call that reaches it, a few microseconds each inside the
	// first sizes of a sweep (notes/shm-latency.md).
	for i := range r.recs {
		r.recs[i].end.Store(0)
	}
	return r
}

// start records cl, run as collective number seq (peerSeq: its number among
// the Send/Recv calls with its peer; 0 for a collective), as running since
// now, and returns its record number. Token holder only.
func (r *recorder) start(cl *call, seq, peerSeq uint64, now int64) uint64 {
	if raceEnabled {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	i := r.n.Load() // only this goroutine stores n: a plain read in effect
	s := &r.recs[i%uint64(len(r.recs))]
	s.kind, s.dtype, s.root, s.count, s.seq, s.peerSeq = cl.kind, cl.dtype, int32(cl.root), int64(cl.count), seq, peerSeq
	s.op = 0
	if cl.reduces() {
		s.op = cl.op
	}
	s.failed = false
	s.label = cl.label
	s.fused = 0
	s.start = now
	s.issued = cl.issued
	if s.issued == 0 {
		s.issued = now
	}
	if peerSeq != 0 {
		r.p2p[cl.root].Store(peerSeq)
	}
	r.n.Store(i + 1)
	return i
}

// fused records that record i ran in a fused message of m calls. Token
// holder only, before end.
func (r *recorder) fused(i uint64, m int) {
	if m < 2 {
		return
	}
	if raceEnabled {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	r.recs[i%uint64(len(r.recs))].fused = int32(m)
}

// end records how record i finished, and keeps a copy of it when calls are
// traced. Token holder only.
func (r *recorder) end(i uint64, err error, now int64) {
	r.endRecord(i, err, now)
	if t := r.trace.Load(); t != nil {
		r.mu.Lock()
		rec := r.read(i, newTickConv()) // the writer's own slot: whole
		r.mu.Unlock()
		t.mu.Lock()
		if len(t.recs) < t.limit {
			t.recs = append(t.recs, rec)
		} else {
			t.dropped++
		}
		t.mu.Unlock()
	}
}

func (r *recorder) endRecord(i uint64, err error, now int64) {
	s := &r.recs[i%uint64(len(r.recs))]
	if err != nil {
		r.mu.Lock()
		s.failed = true
		r.errs[i%uint64(len(r.recs))] = err.Error()
		r.mu.Unlock()
	}
	if raceEnabled {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	s.end.Store(max(now, s.start+1)) // after start even on a coarse clock
}

// read copies record i. Caller holds mu; the copy is trusted only if the
// writer has not begun to reuse the slot meanwhile (see last).
func (r *recorder) read(i uint64, c tickConv) FlightRecord {
	s := &r.recs[i%uint64(len(r.recs))]
	kind, dtype, op, root, count, seq, peerSeq, fused := s.kind, s.dtype, s.op, s.root, s.count, s.seq, s.peerSeq, s.fused
	issued, start, label := s.issued, s.start, s.label
	end := s.end.Load()
	rec := FlightRecord{Call: CallInfo{Kind: kind, DType: dtype, Op: op, Count: int(count), Root: int(root), Seq: seq},
		P2P: kind == KindSend || kind == KindRecv, PeerSeq: peerSeq,
		Issued: c.time(issued), Started: c.time(start), State: StateRunning, Fused: int(fused), Label: label.String()}
	if end > start {
		rec.Ended, rec.State = c.time(end), StateDone
		if s.failed {
			rec.State, rec.Err = StateFailed, r.errs[i%uint64(len(r.recs))]
		}
	}
	return rec
}

// last returns up to k of the most recent records, oldest first, the
// number of the first of them, and the per-peer Send/Recv counts (read
// after the records: never behind them).
func (r *recorder) last(k int) ([]FlightRecord, uint64, []uint64) {
	conv := newTickConv()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.n.Load()
	k = min(k, len(r.recs)-1, int(n))
	first := n - uint64(k)
	out := make([]FlightRecord, k)
	for j := range k {
		out[j] = r.read(first+uint64(j), conv)
	}
	// Drop what the writer may have overwritten while we copied: record
	// i's slot is reused by record i+len, which the writer may be filling
	// while n is i+len.
	if n2 := r.n.Load(); n2 >= uint64(len(r.recs)) {
		if gone := n2 - uint64(len(r.recs)) + 1; gone > first {
			drop := min(gone-first, uint64(k))
			out, first = out[drop:], first+drop
		}
	}
	p2p := make([]uint64, len(r.p2p))
	for i := range p2p {
		p2p[i] = r.p2p[i].Load()
	}
	return out, first, p2p
}

// running returns the latest record, its number, and whether it is still
// running.
func (r *recorder) running() (FlightRecord, uint64, bool) {
	recs, first, _ := r.last(1)
	if len(recs) == 0 {
		return FlightRecord{}, 0, false
	}
	return recs[0], first, recs[0].State == StateRunning
}

// FlightRecords returns a copy of the communicator's flight recorder,
// oldest call first. Safe for concurrent use; does not block on calls.
func (c *Comm) FlightRecords() []FlightRecord {
	recs, _, _ := c.rec.last(len(c.rec.recs))
	return recs
}

// StartCallTrace makes the communicator keep the record of every call that
// ends from now on, up to limit of them (more are counted, not kept), for
// CallTrace: a whole run's calls, where the flight recorder keeps only the
// latest. Calling it again starts afresh. Safe for concurrent use.
func (c *Comm) StartCallTrace(limit int) {
	c.rec.trace.Store(&callTrace{limit: max(limit, 0)})
}

// CallTrace returns the records kept since StartCallTrace, in the order the
// calls ended, and how many more ended past the limit; nil, 0 when calls
// are not traced. Safe for concurrent use, after Close too.
func (c *Comm) CallTrace() ([]FlightRecord, int) {
	t := c.rec.trace.Load()
	if t == nil {
		return nil, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.recs), t.dropped
}
