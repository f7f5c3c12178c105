package comm_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// Handles name calls by their issue number (call objects are recycled):
// every handle must keep reporting its own call, whatever was issued after
// it, across handle pages (256 calls each), in any waiting order, from
// several goroutines at once.
func TestHandlesStayExact(t *testing.T) {
	const calls = 3*256 + 17 // four handle pages
	j := newMemJob(t, 2, comm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	hs := make([][]comm.Handle, 2)
	outs := make([][][]int32, 2)
	for r, c := range j.comms {
		for i := range calls {
			in := []int32{int32(i), int32(r)}
			out := make([]int32, 2)
			outs[r] = append(outs[r], out)
			hs[r] = append(hs[r], c.AllReduce(ctx, comm.Int32s(in), comm.Int32s(out), comm.Sum))
		}
	}
	// Rank 1 waits from the last handle back to the first; rank 0 from
	// several goroutines, each on every third handle.
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			for i := g; i < calls; i += 3 {
				if err := hs[0][i].Wait(ctx); err != nil {
					t.Errorf("rank 0 call %d: %v", i, err)
					return
				}
			}
		})
	}
	for i := calls - 1; i >= 0; i-- {
		if err := hs[1][i].Wait(ctx); err != nil {
			t.Fatalf("rank 1 call %d: %v", i, err)
		}
	}
	wg.Wait()
	for r := range 2 {
		var prev time.Time
		for i, h := range hs[r] {
			if !h.Done() {
				t.Fatalf("rank %d call %d: not Done after Wait", r, i)
			}
			if want := []int32{2 * int32(i), 1}; outs[r][i][0] != want[0] || outs[r][i][1] != want[1] {
				t.Fatalf("rank %d call %d: got %v, want %v", r, i, outs[r][i], want)
			}
			at := h.(interface{ CompletedAt() time.Time }).CompletedAt()
			if at.IsZero() || at.Before(prev) {
				t.Fatalf("rank %d call %d: completed at %v, after call %d at %v", r, i, at, i-1, prev)
			}
			prev = at
		}
	}
}

// A pending handle is not Done, has no completion time, gives up on its
// waiter's context without failing, and completes when its peer comes.
func TestHandlePending(t *testing.T) {
	j := newMemJob(t, 2, comm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	got := make([]int64, 1)
	h := j.comms[0].Recv(ctx, comm.Int64s(got), 1)
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if err := h.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a pending Recv: %v, want the waiter's deadline", err)
	}
	if h.Done() || !h.(interface{ CompletedAt() time.Time }).CompletedAt().IsZero() {
		t.Fatal("pending Recv reports done or a completion time")
	}
	// Waiters blocked on the same handle all wake at its completion.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = h.Wait(ctx) })
	}
	if err := j.comms[1].Send(ctx, comm.Int64s([]int64{42}), 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
	}
	if got[0] != 42 || !h.Done() {
		t.Fatalf("Recv got %d (done %v), want 42", got[0], h.Done())
	}
}

// Handles of calls before a failure keep reporting success, the failed
// call its own error and later calls the communicator's; a call issued
// after Close fails at once with ErrClosed.
func TestHandleErrors(t *testing.T) {
	j := newMemJob(t, 1, comm.DefaultConfig())
	c := j.comms[0]
	ctx := context.Background()
	buf := comm.Float32s(make([]float32, 2))
	var hs []comm.Handle
	for range 300 {
		hs = append(hs, c.AllReduce(ctx, buf, buf, comm.Sum))
	}
	bad := c.AllReduce(ctx, buf, comm.Float32s(make([]float32, 3)), comm.Sum)
	after := c.AllReduce(ctx, buf, buf, comm.Sum)
	if err := after.Wait(ctx); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("call after the invalid one: %v, want the communicator's ErrInvalidArgument", err)
	}
	if err := bad.Wait(ctx); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("invalid call: %v, want ErrInvalidArgument", err)
	}
	for i, h := range hs {
		if err := h.Wait(ctx); err != nil || !h.Done() {
			t.Fatalf("call %d before the failure: %v (done %v)", i, err, h.Done())
		}
	}
	_ = c.Close()
	h := c.AllReduce(ctx, buf, buf, comm.Sum)
	if !h.Done() {
		t.Fatal("call after Close is not done")
	}
	if err := h.Wait(ctx); err == nil {
		t.Fatal("call after Close succeeded")
	}
}

// Issuing and waiting for small calls allocates nothing in the steady
// state but a handle page every 256 calls (under 20 bytes a call), also
// when 200 are issued before any is waited for, as `gorun bench` does:
// fresh heap was a page fault every few dozen calls until the first
// garbage collection (notes/shm-latency.md).
func TestCallAllocations(t *testing.T) {
	j := newMemJob(t, 1, comm.DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	buf := comm.Float32s(make([]float32, 2))
	hs := make([]comm.Handle, 200)
	allocs := testing.AllocsPerRun(64, func() {
		for i := range hs {
			hs[i] = j.comms[0].AllReduce(ctx, buf, buf, comm.Sum)
		}
		for _, h := range hs {
			if err := h.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	if perCall := allocs / float64(len(hs)); perCall > 2.0/256 {
		t.Fatalf("%.4f allocations per call, want at most one handle page per 256 calls (%.4f)", perCall, 1/256.0)
	}
}
