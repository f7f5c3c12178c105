package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeComm is one rank's view of a group whose other ranks contribute
// exactly what this one does: an all-reduce sum multiplies by n, an
// all-gather repeats, a reduce-scatter returns n times this rank's block.
// Every call is logged with its send buffer, so golden files show the
// executor's packing. Handles complete at once unless hold is set; then
// they complete, in issue order, when release is called.
type fakeComm struct {
	rank, n  int
	clock    *fakeClock
	out      *strings.Builder
	peerHash int64 // when non-zero, rank n-1 contributes it to plan checks
	hold     bool

	mu      sync.Mutex
	cond    *sync.Cond    // on mu, signalled when waits grows
	waits   int           // Wait calls so far, guarded by mu
	pending []*fakeHandle // guarded by mu
}

// awaitWaits blocks until Wait has been called n times in all.
func (f *fakeComm) awaitWaits(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.waits < n {
		f.cond.Wait()
	}
}

var _ Comm = (*fakeComm)(nil)

type fakeHandle struct {
	f    *fakeComm
	done chan struct{}
	at   time.Time
	fin  func()
}

func (h *fakeHandle) Wait(ctx context.Context) error {
	h.f.mu.Lock()
	h.f.waits++
	h.f.cond.Broadcast()
	h.f.mu.Unlock()
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *fakeHandle) Done() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

func (h *fakeHandle) CompletedAt() time.Time { return h.at }

func newFakeComm(rank, n int, clock *fakeClock, out *strings.Builder) *fakeComm {
	f := &fakeComm{rank: rank, n: n, clock: clock, out: out}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *fakeComm) Rank() int { return f.rank }
func (f *fakeComm) Size() int { return f.n }

func (f *fakeComm) handle(fin func()) Handle {
	h := &fakeHandle{f: f, done: make(chan struct{}), fin: fin}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hold {
		f.pending = append(f.pending, h)
		return h
	}
	fin()
	h.at = f.clock.Now()
	close(h.done)
	return h
}

// release completes the oldest held call at the clock's current time.
func (f *fakeComm) release() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pending) == 0 {
		return false
	}
	h := f.pending[0]
	f.pending = f.pending[1:]
	h.fin()
	h.at = f.clock.Now()
	close(h.done)
	return true
}

func (f *fakeComm) logf(format string, args ...any) {
	if f.out != nil {
		fmt.Fprintf(f.out, format, args...)
	}
}

func vals(b comm.Buffer) string {
	switch b.DType() {
	case comm.Float32:
		return fmt.Sprint(comm.AsFloat32(b))
	case comm.Int64:
		return "hash"
	}
	return fmt.Sprintf("%d elements", b.Len())
}

func (f *fakeComm) AllReduce(_ context.Context, send, recv comm.Buffer, op comm.Op) Handle {
	f.logf("comm: all_reduce %s %s\n", op, vals(send))
	return f.handle(func() {
		s, r := comm.AsFloat32(send), comm.AsFloat32(recv)
		for i := range s {
			r[i] = s[i] * float32(f.n)
		}
	})
}

func (f *fakeComm) AllGather(_ context.Context, send, recv comm.Buffer) Handle {
	if send.DType() == comm.Int64 {
		return f.handle(func() {
			s, _ := send.Host()
			r, _ := recv.Host()
			for p := range f.n {
				copy(r[p*8:], s)
			}
			if f.peerHash != 0 {
				binary.LittleEndian.PutUint64(r[(f.n-1)*8:], uint64(f.peerHash))
			}
		})
	}
	f.logf("comm: all_gather %s\n", vals(send))
	return f.handle(func() {
		s, _ := send.Host()
		r, _ := recv.Host()
		for p := range f.n {
			copy(r[p*len(s):], s)
		}
	})
}

func (f *fakeComm) ReduceScatter(_ context.Context, send, recv comm.Buffer, op comm.Op) Handle {
	f.logf("comm: reduce_scatter %s %s\n", op, vals(send))
	return f.handle(func() {
		s, r := comm.AsFloat32(send), comm.AsFloat32(recv)
		for i := range r {
			r[i] = s[f.rank*len(r)+i] * float32(f.n)
		}
	})
}

func (f *fakeComm) Broadcast(_ context.Context, send, recv comm.Buffer, root int) Handle {
	f.logf("comm: broadcast root %d %s\n", root, vals(send))
	return f.handle(func() {})
}
