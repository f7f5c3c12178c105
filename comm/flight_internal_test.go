package comm

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkFlightRecorder is what the recorder adds to one call on the
// token holder's path: the clock reads and the start and end records.
func BenchmarkFlightRecorder(b *testing.B) {
	r := newRecorder(256, 2)
	cl := &call{kind: KindAllReduce, dtype: Float32, op: Sum, count: 2, root: -1}
	for i := range b.N {
		r.end(r.start(cl, uint64(i), 0, ticks()), nil, ticks())
	}
}

// A reader copying the ring while the writer laps it gets only records
// that are whole: each is one the writer wrote (its count is its seq
// times 3), in order, none torn by a slot's reuse, and the failed ones
// carry their own error text.
func TestRecorderConcurrentCopy(t *testing.T) {
	const size, total = 8, 200000
	r := newRecorder(size, 2)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		defer stop.Store(true)
		for i := range uint64(total) {
			cl := &call{kind: KindAllReduce, dtype: Float32, op: Sum, count: int(3 * (i + 1)), root: -1}
			var err error
			if i%7 == 0 {
				err = errors.New("e" + string(rune('a'+i%26)))
			}
			r.end(r.start(cl, i+1, 0, int64(2*i+1)), err, int64(2*i+2))
		}
	})
	reads := 0
	for !stop.Load() || reads == 0 {
		recs, first, _ := r.last(size)
		reads++
		for j, rec := range recs {
			seq := first + uint64(j) + 1
			if rec.Call.Seq != seq || rec.Call.Count != int(3*seq) {
				t.Fatalf("read %d: record %d of %d from #%d is %+v", reads, j, len(recs), first+1, rec.Call)
			}
			if i := seq - 1; rec.State == StateFailed && (i%7 != 0 || rec.Err != "e"+string(rune('a'+i%26))) {
				t.Fatalf("record #%d: %s %q", seq, rec.State, rec.Err)
			}
		}
		if len(recs) > size {
			t.Fatalf("%d records from a recorder of %d", len(recs), size)
		}
	}
	wg.Wait()
	recs, first, _ := r.last(size)
	if len(recs) != size || first != total-size || recs[size-1].State == StateRunning {
		t.Errorf("after the writer: %d records from #%d, last %s", len(recs), first+1, recs[len(recs)-1].State)
	}
	t.Logf("%d copies while the writer ran", reads)
}

// mutexRecorder is the recorder's previous design, kept as the anchor of
// BenchmarkFlightRecorder: a mutex around each of the two writes, whole
// CallInfo and string state per slot, and three clock reads per call.
type mutexRecorder struct {
	mu   sync.Mutex
	recs []struct {
		call                   CallInfo
		issued, started, ended int64
		state                  CallState
		err                    string
	}
	n uint64
}

func (r *mutexRecorder) start(cl *call, seq uint64, now int64) uint64 {
	r.mu.Lock()
	i := r.n
	r.n++
	s := &r.recs[i%uint64(len(r.recs))]
	s.call, s.issued, s.started, s.ended, s.state, s.err = cl.info(seq), cl.issued, now, 0, StateRunning, ""
	r.mu.Unlock()
	return i
}

func (r *mutexRecorder) end(i uint64, err error, now int64) {
	r.mu.Lock()
	s := &r.recs[i%uint64(len(r.recs))]
	s.ended, s.state = now, StateDone
	if err != nil {
		s.state, s.err = StateFailed, err.Error()
	}
	r.mu.Unlock()
}

func BenchmarkFlightRecorderMutexAnchor(b *testing.B) {
	r := &mutexRecorder{}
	r.recs = make([]struct {
		call                   CallInfo
		issued, started, ended int64
		state                  CallState
		err                    string
	}, 256)
	cl := &call{kind: KindAllReduce, dtype: Float32, op: Sum, count: 2, root: -1}
	for i := range b.N {
		cl.issued = ticks()
		r.end(r.start(cl, uint64(i), ticks()), nil, ticks())
	}
}
