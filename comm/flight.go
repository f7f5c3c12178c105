package comm

import (
	"sync"
	"sync/atomic"
	"time"
)

// flightOff turns the recorder off (and with it desync and stall
// detection), only so that a benchmark can measure what recording costs
// (SetFlightRecorder in export_test.go).
var flightOff atomic.Bool

// The flight recorder keeps each communicator's last Config.FlightRecords
// calls, always on. It is written on the token holder's path (twice per
// call: at start and at end) under a mutex that only the rare readers (the
// stuck-call watchdog, a status probe from a peer, a dump) contend for, so
// an uncontended lock and two clock reads are its whole cost per call.
// Readers copy what they need under the lock.

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
	Call    CallInfo  `json:"call"`
	P2P     bool      `json:"p2p,omitempty"`
	Issued  time.Time `json:"issued"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	State   CallState `json:"state"`
	Err     string    `json:"err,omitempty"`
}

// slot is a FlightRecord as the token holder writes it: times in ticks.
type slot struct {
	call                   CallInfo
	p2p                    bool
	issued, started, ended int64
	state                  CallState
	err                    string
}

func (s *slot) record(c tickConv) FlightRecord {
	return FlightRecord{Call: s.call, P2P: s.p2p, Issued: c.time(s.issued), Started: c.time(s.started),
		Ended: c.time(s.ended), State: s.state, Err: s.err}
}

// recorder is the ring of records of one communicator.
type recorder struct {
	mu   sync.Mutex
	recs []slot // ring; recs[i%len] is record number i
	n    uint64 // records written so far
}

func newRecorder(size int) *recorder { return &recorder{recs: make([]slot, size)} }

// start records cl as running and returns its record number. Token holder.
func (r *recorder) start(cl *call, seq uint64, now int64) uint64 {
	r.mu.Lock()
	i := r.n
	r.n++
	r.recs[i%uint64(len(r.recs))] = slot{call: cl.info(seq), p2p: cl.kind == KindSend || cl.kind == KindRecv,
		issued: cl.issued, started: now, state: StateRunning}
	r.mu.Unlock()
	return i
}

// end records how record i finished. Token holder.
func (r *recorder) end(i uint64, err error, now int64) {
	r.mu.Lock()
	if r.n-i <= uint64(len(r.recs)) {
		rec := &r.recs[i%uint64(len(r.recs))]
		rec.ended = now
		rec.state = StateDone
		if err != nil {
			rec.state, rec.err = StateFailed, err.Error()
		}
	}
	r.mu.Unlock()
}

// last returns up to k of the most recent records, oldest first.
func (r *recorder) last(k int) []FlightRecord {
	conv := newTickConv()
	r.mu.Lock()
	defer r.mu.Unlock()
	k = min(k, len(r.recs), int(r.n))
	out := make([]FlightRecord, k)
	for j := range k {
		out[j] = r.recs[(r.n-uint64(k)+uint64(j))%uint64(len(r.recs))].record(conv)
	}
	return out
}

// running returns the latest record's number and how long it has been
// running, if it is.
func (r *recorder) running() (FlightRecord, uint64, bool) {
	conv := newTickConv()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		return FlightRecord{}, 0, false
	}
	s := &r.recs[(r.n-1)%uint64(len(r.recs))]
	return s.record(conv), r.n - 1, s.state == StateRunning
}

// FlightRecords returns a copy of the communicator's flight recorder,
// oldest call first. Safe for concurrent use; does not block on calls.
func (c *Comm) FlightRecords() []FlightRecord { return c.rec.last(len(c.rec.recs)) }
