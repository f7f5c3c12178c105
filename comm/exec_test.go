package comm_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// Calls that nobody waits for still run (the worker runs them), so an
// issuer can compute while its collectives progress.
func TestCallsProgressWithoutWait(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	errs := onEach(t, 2, func(r int) error {
		ctx, cancel := waitCtx(t)
		defer cancel()
		bufs := make([][]float32, 20)
		var last comm.Handle
		for i := range bufs {
			bufs[i] = f32(100+i, float32(r+1))
			last = j.comms[r].AllReduce(ctx, comm.Float32s(bufs[i]), comm.Float32s(bufs[i]), comm.Sum)
		}
		for !last.Done() {
			if ctx.Err() != nil {
				return errors.New("calls did not progress without Wait")
			}
			time.Sleep(time.Millisecond)
		}
		for i, b := range bufs {
			if b[len(b)-1] != 3 {
				return fmt.Errorf("call %d: %v, want 3", i, b[len(b)-1])
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Waiting on calls from several goroutines in any order runs them (some on
// the waiters' goroutines) in issue order: every call has its own count, so
// any reordering would be a desync.
func TestConcurrentWaitersKeepIssueOrder(t *testing.T) {
	for _, medium := range []string{"mem", "shm"} {
		t.Run(medium, func(t *testing.T) {
			cfg := comm.LocalConfig()
			var comms []*comm.Comm
			if medium == "mem" {
				comms = newMemJob(t, 3, cfg).comms
			} else {
				comms = newNetJob(t, 3, cfg, false).comms
			}
			const calls = 60
			errs := onEach(t, 3, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				bufs := make([][]float32, calls)
				hs := make([]comm.Handle, calls)
				for i := range hs {
					bufs[i] = f32(1+i*37, float32(r+1))
					hs[i] = comms[r].AllReduce(ctx, comm.Float32s(bufs[i]), comm.Float32s(bufs[i]), comm.Sum)
				}
				order := rand.Perm(calls)
				var wg sync.WaitGroup
				werrs := make([]error, calls)
				for w := range 4 {
					wg.Go(func() {
						for k := w; k < calls; k += 4 {
							i := order[k]
							werrs[i] = hs[i].Wait(ctx)
						}
					})
				}
				wg.Wait()
				for i, err := range werrs {
					if err != nil {
						return fmt.Errorf("call %d: %w", i, err)
					}
					if got := bufs[i][len(bufs[i])-1]; got != 6 {
						return fmt.Errorf("call %d: %v, want 6", i, got)
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// A Wait whose context can end before the call's does not run the call on
// its goroutine: it returns when its context ends, and the call completes
// later on the worker.
func TestWaitWithShorterContextReturnsInTime(t *testing.T) {
	j := newMemJob(t, 2, comm.LocalConfig())
	ctx, cancel := waitCtx(t)
	defer cancel()
	a, b := f32(10, 1), f32(10, 2)
	h0 := j.comms[0].AllReduce(ctx, comm.Float32s(a), comm.Float32s(a), comm.Sum)
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	if err := h0.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a short context: %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Wait returned after %v", d)
	}
	h1 := j.comms[1].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum)
	if err := comm.WaitAll(ctx, h0, h1); err != nil {
		t.Fatal(err)
	}
	if a[0] != 3 || b[0] != 3 {
		t.Fatalf("results %v %v, want 3", a[0], b[0])
	}
}

// Close while other goroutines wait on (and so may be running) queued
// calls: every call completes and Close returns, on every rank.
func TestCloseWhileWaitersRunCalls(t *testing.T) {
	for range 20 {
		j := newMemJob(t, 2, comm.LocalConfig())
		errs := onEach(t, 2, func(r int) error {
			ctx, cancel := waitCtx(t)
			defer cancel()
			var hs []comm.Handle
			for i := range 20 {
				b := f32(1+i, 1)
				hs = append(hs, j.comms[r].AllReduce(ctx, comm.Float32s(b), comm.Float32s(b), comm.Sum))
			}
			var wg sync.WaitGroup
			werrs := make([]error, 3)
			for w := range werrs {
				wg.Go(func() { werrs[w] = hs[len(hs)-1-w*7].Wait(ctx) })
			}
			cerr := j.comms[r].Close()
			wg.Wait()
			return errors.Join(append(werrs, cerr)...)
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
}
