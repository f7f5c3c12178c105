package comm_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// With foreign callers (libgorun: collectives called from C threads), the
// large steps of the ring and of the staggered exchanges of a call run by
// its waiter run on the waiting goroutine, sending and receiving in turns,
// instead of handing every send to a sender goroutine (comm's callerFrame):
// no message is posted, the results are the reference's, and steps whose
// messages are several times a ring's size complete, which needs the turns
// (a rank that sent its whole message before receiving would wait forever
// for room in its full ring while its neighbour does the same). Calls the
// worker goroutine runs, and calls from Go's own threads, post their large
// sends, which also shows that the count sees a post.
func TestForeignCallersRunLargeStepsThemselves(t *testing.T) {
	// Rings of 64 KiB carry frames of at most 2 KiB (EagerLimit), so a
	// step of 160 KB is many frames and more than the ring holds.
	old := comm.SetCallerStepMinEager(0)
	t.Cleanup(func() { comm.SetCallerStepMinEager(old) })
	testRingBytes = 64 << 10
	t.Cleanup(func() { testRingBytes = 0 })
	const count = 40_000 // float32: 160 KB per block, 2.5 rings
	for _, n := range []int{3, 4} {
		for _, mode := range []string{"foreign/waited", "foreign/handed/waited", "foreign/worker", "go/waited"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, mode), func(t *testing.T) {
				foreign, waited := strings.HasPrefix(mode, "foreign"), strings.HasSuffix(mode, "waited")
				comm.SetForeignCallers(foreign)
				t.Cleanup(func() { comm.SetForeignCallers(false) })
				// Steps of 78-156 EagerLimits: "foreign/waited" keeps
				// them on the caller (no hand-over below 1000), the
				// handed mode gives them to the worker (from 16, the
				// default).
				hand := 1000
				if strings.Contains(mode, "handed") {
					hand = 16
				}
				oldHand := comm.SetHandsOffMin(hand)
				t.Cleanup(func() { comm.SetHandsOffMin(oldHand) })
				cfg := comm.LocalConfig()
				cfg.LatencyNs = 1e-3 // the ring wherever the host is not crowded
				j := newNetJob(t, n, cfg, false)
				var tcs []tcase
				add := func(k comm.Kind, dt comm.DType, count int) {
					tc := tcase{kind: k, dt: dt, op: comm.Sum, count: count, idx: len(tcs)}
					tc.inplace = tc.idx%2 == 1
					tcs = append(tcs, tc)
				}
				// An all-reduce's ring steps carry a chunk of an n-th
				// of the vector; the others' steps a whole block.
				add(comm.KindAllReduce, comm.Float32, n*count+1)
				add(comm.KindAllReduce, comm.BFloat16, n*count) // reduced in float32 scratch
				add(comm.KindReduceScatter, comm.Float32, count)
				add(comm.KindAllGather, comm.Int64, count)
				add(comm.KindAllToAll, comm.Float32, count)
				errs := onEach(t, n, func(r int) error {
					wctx, cancel := waitCtx(t)
					defer cancel()
					hs := make([]comm.Handle, len(tcs))
					checks := make([]func() error, len(tcs))
					for i, tc := range tcs {
						if waited {
							// Wait runs the call itself: its context
							// never ends, and the worker is not woken.
							ctx := comm.IssuerWaits(context.Background())
							hs[i], checks[i] = issue(ctx, j.comms[r], tc, true)
							if err := hs[i].Wait(ctx); err != nil {
								return fmt.Errorf("%v: %w", tc, err)
							}
							continue
						}
						hs[i], checks[i] = issue(context.Background(), j.comms[r], tc, true)
					}
					for i, h := range hs {
						// A Wait whose context may end first leaves the
						// call to the worker.
						if err := h.Wait(wctx); err != nil {
							return fmt.Errorf("%v: %w", tcs[i], err)
						}
						if err := checks[i](); err != nil {
							return err
						}
					}
					return nil
				})
				for r, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}
				for r, c := range j.comms {
					switch posts := comm.Posts(c); {
					case mode == "foreign/waited" && posts != 0:
						t.Errorf("rank %d posted %d messages to its sender goroutines, want 0", r, posts)
					case mode != "foreign/waited" && posts == 0:
						t.Errorf("rank %d posted no message: want its large sends posted (%s)", r, mode)
					}
				}
			})
		}
	}
}
