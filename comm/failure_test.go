package comm_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

func f32(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// Every rank must get an error naming both calls when one rank issues a
// different collective at the same position.
func TestDesyncNamesBothCallsOnEveryRank(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		j := newMemJob(t, n, comm.LocalConfig())
		errs := onEach(t, n, func(r int) error {
			ctx, cancel := waitCtx(t)
			defer cancel()
			buf := f32(10, 1)
			if r == n-1 {
				out := make([]float32, 10*n)
				return j.comms[r].AllGather(ctx, comm.Float32s(buf), comm.Float32s(out)).Wait(ctx)
			}
			return j.comms[r].AllReduce(ctx, comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx)
		})
		for r, err := range errs {
			if !errors.Is(err, comm.ErrDesync) {
				t.Errorf("n=%d rank %d: got %v, want a desync error", n, r, err)
				continue
			}
			if !strings.Contains(err.Error(), "AllReduce(float32 sum, count=10") || !strings.Contains(err.Error(), "AllGather(float32, count=10") {
				t.Errorf("n=%d rank %d: error does not name both calls: %v", n, r, err)
			}
		}
		// The communicator stays failed: later calls fail at once.
		ctx, cancel := waitCtx(t)
		if err := j.comms[0].Barrier(ctx).Wait(ctx); !errors.Is(err, comm.ErrDesync) {
			t.Errorf("call after desync: %v", err)
		}
		cancel()
	}
}

func TestDesyncOnCountDtypeRootAndSplits(t *testing.T) {
	type call func(ctx context.Context, c comm.Communicator, r int) error
	tests := map[string]call{
		"count": func(ctx context.Context, c comm.Communicator, r int) error {
			b := f32(10+r, 1)
			return c.AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum).Wait(ctx)
		},
		"op": func(ctx context.Context, c comm.Communicator, r int) error {
			b := f32(10, 1)
			return c.AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Op(1+r)).Wait(ctx)
		},
		"dtype": func(ctx context.Context, c comm.Communicator, r int) error {
			if r == 0 {
				b := make([]float64, 4)
				return c.AllReduce(ctx, comm.Float64s(b), comm.Float64s(b), comm.Sum).Wait(ctx)
			}
			b := make([]int64, 4)
			return c.AllReduce(ctx, comm.Int64s(b), comm.Int64s(b), comm.Sum).Wait(ctx)
		},
		"root": func(ctx context.Context, c comm.Communicator, r int) error {
			b := f32(10, 1)
			return c.Broadcast(ctx, comm.Float32s(b), comm.Float32s(b), r).Wait(ctx)
		},
		"splits": func(ctx context.Context, c comm.Communicator, r int) error {
			send, recv := f32(8, 1), f32(8, 0)
			sc, rc := []int{2, 2}, []int{2, 2}
			if r == 0 {
				sc[1] = 3 // rank 1 expects 2 from rank 0
			}
			return c.AllToAllV(ctx, comm.Float32s(send), sc, comm.Float32s(recv), rc).Wait(ctx)
		},
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) {
			j := newMemJob(t, 2, comm.LocalConfig())
			errs := onEach(t, 2, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				err := fn(ctx, j.comms[r], r)
				if err == nil {
					// This rank's part completed with correct data before
					// the peer noticed; it learns at its next call.
					err = j.comms[r].Barrier(ctx).Wait(ctx)
				}
				return err
			})
			for r, err := range errs {
				if !errors.Is(err, comm.ErrDesync) {
					t.Errorf("rank %d: got %v, want desync", r, err)
				}
			}
			t.Log(errs[0])
		})
	}
}

// A locally invalid call fails on its rank and, since the peers cannot skip
// it, on theirs too; nothing is written out of bounds.
func TestWrongSizesAreErrors(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	canary := f32(12, 7)
	recv := canary[:9:9] // a recv shorter than send must not be overrun
	errs := onEach(t, 2, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		send := f32(10, 1)
		if r == 0 {
			return j.comms[r].AllReduce(ctx, comm.Float32s(send), comm.Float32s(recv), comm.Sum).Wait(ctx)
		}
		return j.comms[r].AllReduce(ctx, comm.Float32s(send), comm.Float32s(send), comm.Sum).Wait(ctx)
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("rank %d: got %v, want ErrInvalidArgument", r, err)
		}
	}
	for i, v := range canary {
		if v != 7 {
			t.Fatalf("canary[%d] = %v: memory written", i, v)
		}
	}
	t.Log(errs[1])
}

func TestInvalidArgumentsAreCaught(t *testing.T) {
	ctx, cancel := waitCtx(t)
	defer cancel()
	b4 := comm.Float32s(make([]float32, 4))
	i4 := comm.Int32s(make([]int32, 4))
	calls := map[string]func(c comm.Communicator) comm.Handle{
		"nil send":       func(c comm.Communicator) comm.Handle { return c.AllReduce(ctx, nil, b4, comm.Sum) },
		"dtype mismatch": func(c comm.Communicator) comm.Handle { return c.AllReduce(ctx, b4, i4, comm.Sum) },
		"bad op":         func(c comm.Communicator) comm.Handle { return c.AllReduce(ctx, b4, b4, comm.Op(99)) },
		"bad root":       func(c comm.Communicator) comm.Handle { return c.Broadcast(ctx, b4, b4, 5) },
		"gather size":    func(c comm.Communicator) comm.Handle { return c.AllGather(ctx, b4, b4) },
		"scatter size":   func(c comm.Communicator) comm.Handle { return c.ReduceScatter(ctx, b4, b4, comm.Sum) },
		"a2a counts":     func(c comm.Communicator) comm.Handle { return c.AllToAllV(ctx, b4, []int{3, 3}, b4, []int{2, 2}) },
		"send to self":   func(c comm.Communicator) comm.Handle { return c.Send(ctx, b4, 0) },
		"device buffer":  func(c comm.Communicator) comm.Handle { return c.AllReduce(ctx, deviceBuf{}, deviceBuf{}, comm.Sum) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			j := newMemJob(t, 2, comm.LocalConfig())
			err := call(j.comms[0]).Wait(ctx)
			if !errors.Is(err, comm.ErrInvalidArgument) && !errors.Is(err, comm.ErrDeviceBuffer) {
				t.Fatalf("got %v", err)
			}
			// The peer learns about it on its next call instead of hanging.
			if err := j.comms[1].Barrier(ctx).Wait(ctx); err == nil {
				t.Fatal("peer's call succeeded after an invalid call")
			}
		})
	}
}

type deviceBuf struct{}

func (deviceBuf) DType() comm.DType    { return comm.Float32 }
func (deviceBuf) Len() int             { return 4 }
func (deviceBuf) Host() ([]byte, bool) { return nil, false }

// A peer that dies mid-collective fails the others with an error naming it.
func TestPeerKilledMidCollective(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		cfg := comm.LocalConfig()
		cfg.SegmentBytes = 4096
		j := newMemJob(t, n, cfg)
		victim := n - 1
		errs := onEach(t, n, func(r int) error {
			ctx, cancel := waitCtx(t)
			defer cancel()
			b := f32(1<<14, 1)
			for i := 0; ; i++ {
				h := j.comms[r].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum)
				if r == victim && i == 3 {
					j.nw.Kill(j.addrs[r]) // mid-call: its frames are lost
					return nil
				}
				if err := h.Wait(ctx); err != nil {
					return err
				}
			}
		})
		for r, err := range errs {
			if r == victim {
				continue
			}
			if !strings.Contains(err.Error(), "rank "+itoa(victim)) {
				t.Errorf("n=%d rank %d: error does not name rank %d: %v", n, r, victim, err)
			}
		}
		t.Log(errs[0])
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

// A hung peer (frames dropped, connection up) is detected through the
// group's failure event, as the rendezvous reports it.
func TestGroupFailureEndsHungCollective(t *testing.T) {
	j := newMemJob(t, 3, comm.LocalConfig())
	j.nw.Drop(j.addrs[2])
	errs := onEach(t, 2, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		b := f32(100, 1)
		h := j.comms[r].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum)
		if r == 0 {
			for _, g := range j.groups {
				g.Fail(2)
			}
		}
		return h.Wait(ctx)
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrPeerLost) || !strings.Contains(err.Error(), "rank 2") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Cancelling a call's context fails it and, through the abort, the peers.
func TestContextCancellation(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	ctx, cancel := context.WithCancel(context.Background())
	b := f32(4, 1)
	h := j.comms[0].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum) // rank 1 never joins
	cancel()
	wctx, wcancel := waitCtx(t)
	defer wcancel()
	if err := h.Wait(wctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	if err := j.comms[1].Barrier(wctx).Wait(wctx); err == nil || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("peer after cancel: %v", err)
	}
}

// Calls issued with one context share one cancellation hook (ctxhook.go).
// A context that ends after its calls completed fails nothing; one that
// ends while a call issued with it is pending fails the communicator, even
// after calls with another context have replaced its hook.
func TestContextCancellationSharedHook(t *testing.T) {
	for _, tc := range []struct {
		name string
		// pendingA: rank 0's call with context A is still waiting for
		// rank 1 when A is cancelled; otherwise it completed before.
		pendingA bool
		// thenB: rank 0 issues a call with context B after A's.
		thenB bool
		fails bool
	}{
		{"completed, same hook", false, false, false},
		{"completed, hook replaced", false, true, false},
		{"pending, same hook", true, false, true},
		{"pending, hook replaced", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newMemJob(t, 2, comm.LocalConfig())
			wctx, wcancel := waitCtx(t)
			defer wcancel()
			ctxA, cancelA := context.WithCancel(context.Background())
			defer cancelA()
			ctxB, cancelB := context.WithCancel(context.Background())
			defer cancelB()
			b0, b1 := f32(4, 1), f32(4, 2)
			// Several calls with A, all complete: the hook counts them
			// in and out.
			for range 3 {
				errs := onEach(t, 2, func(r int) error {
					b := comm.Float32s([]float32{1})
					return j.comms[r].AllReduce(ctxA, b, b, comm.Sum).Wait(wctx)
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
			}
			var hA, hB comm.Handle
			if tc.pendingA {
				hA = j.comms[0].AllReduce(ctxA, comm.Float32s(b0), comm.Float32s(b0), comm.Sum)
			}
			if tc.thenB {
				hB = j.comms[0].Barrier(ctxB)
			}
			cancelA()
			// The hook runs on its own goroutine after the cancel: give it
			// time to act (or to wrongly act) before rank 1 joins.
			deadline := time.Now().Add(50 * time.Millisecond)
			if tc.fails {
				deadline = time.Now().Add(10 * time.Second)
			}
			for j.comms[0].Err() == nil && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if err := j.comms[0].Err(); tc.fails != (err != nil) || (err != nil && !errors.Is(err, context.Canceled)) {
				t.Fatalf("rank 0 after cancelling context A: %v (want failure: %v)", err, tc.fails)
			}
			if tc.fails {
				// The peer learns it through the abort, at the latest at
				// its next call.
				_ = j.comms[1].AllReduce(wctx, comm.Float32s(b1), comm.Float32s(b1), comm.Sum).Wait(wctx)
				if err := j.comms[1].Barrier(wctx).Wait(wctx); err == nil || !strings.Contains(err.Error(), "cancelled") {
					t.Fatalf("peer after cancel: %v", err)
				}
				_ = hA.Wait(wctx)
				return
			}
			// Nothing of A pending: the group goes on.
			errs := onEach(t, 2, func(r int) error {
				if r == 0 && hB != nil {
					return hB.Wait(wctx)
				}
				return j.comms[r].Barrier(wctx).Wait(wctx)
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d after cancelling a finished context: %v", r, err)
				}
			}
		})
	}
}

// Giving up on Wait does not cancel the call.
func TestWaitTimeoutDoesNotCancel(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	b0, b1 := f32(4, 1), f32(4, 2)
	h := j.comms[0].AllReduce(context.Background(), comm.Float32s(b0), comm.Float32s(b0), comm.Sum)
	short, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := h.Wait(short); !errors.Is(err, context.DeadlineExceeded) || h.Done() {
		t.Fatalf("Wait before peer joined: %v done=%v", err, h.Done())
	}
	ctx, cancel2 := waitCtx(t)
	defer cancel2()
	if err := j.comms[1].AllReduce(ctx, comm.Float32s(b1), comm.Float32s(b1), comm.Sum).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(ctx); err != nil || b0[0] != 3 {
		t.Fatalf("err=%v b0=%v", err, b0)
	}
}

func TestAbortReleasesPendingAndFutureCalls(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	ctx, cancel := waitCtx(t)
	defer cancel()
	var hs []comm.Handle
	for range 5 {
		b := f32(4, 1)
		hs = append(hs, j.comms[0].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum))
	}
	j.comms[0].Abort(nil)
	j.comms[0].Abort(nil) // idempotent
	for i, h := range hs {
		if err := h.Wait(ctx); !errors.Is(err, comm.ErrAborted) {
			t.Errorf("pending call %d: %v", i, err)
		}
	}
	if err := j.comms[0].Barrier(ctx).Wait(ctx); !errors.Is(err, comm.ErrAborted) {
		t.Errorf("future call: %v", err)
	}
	if err := j.comms[1].Barrier(ctx).Wait(ctx); !errors.Is(err, comm.ErrAborted) {
		t.Errorf("peer: %v", err)
	}
}

func TestCloseThenCall(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	ctx, cancel := waitCtx(t)
	defer cancel()
	if err := j.comms[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.comms[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.comms[0].Barrier(ctx).Wait(ctx); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("call after Close: %v", err)
	}
	err := j.comms[1].Barrier(ctx).Wait(ctx)
	if !errors.Is(err, comm.ErrClosed) || !strings.Contains(err.Error(), "rank 0") {
		t.Errorf("peer of a closed rank: %v", err)
	}
}

func TestSendRecvAndBarrier(t *testing.T) {
	const n = 4
	j := newMemJob(t, n, comm.LocalConfig())
	errs := onEach(t, n, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		c := j.comms[r]
		out, in := f32(1000, float32(r)), f32(1000, -1)
		hs := c.Send(ctx, comm.Float32s(out), (r+1)%n)
		hr := c.Recv(ctx, comm.Float32s(in), (r+n-1)%n)
		if err := c.Barrier(ctx).Wait(ctx); err != nil {
			return err
		}
		if err := hs.Wait(ctx); err != nil {
			return err
		}
		if err := hr.Wait(ctx); err != nil {
			return err
		}
		if in[999] != float32((r+n-1)%n) {
			return errors.New("wrong data received")
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestRecvSizeMismatchIsDesync(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	errs := onEach(t, 2, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		if r == 0 {
			return j.comms[0].Send(ctx, comm.Float32s(f32(5, 1)), 1).Wait(ctx)
		}
		return j.comms[1].Recv(ctx, comm.Float32s(f32(4, 1)), 0).Wait(ctx)
	})
	if !errors.Is(errs[1], comm.ErrDesync) {
		t.Fatalf("receiver: %v", errs[1])
	}
	t.Log(errs[1])
}
