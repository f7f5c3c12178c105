package comm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// A call issued with comm.IssuerWaits and waited for at once runs on the
// waiting goroutine without waking the worker; one waited for with a
// context Wait cannot run it inline under, or issued among calls nobody
// waits for, still completes, in issue order.
func TestIssuerWaits(t *testing.T) {
	const calls = 200
	cases := []struct {
		name string
		// run issues calls on rank r's communicator and waits for them.
		run func(t *testing.T, c *comm.Comm, r int) error
		// maxWakes bounds the wake-ups sent to the worker per rank (the
		// first one sent always gets through); -1: no bound.
		maxWakes int64
	}{
		{name: "issue then wait", maxWakes: 0, run: func(t *testing.T, c *comm.Comm, r int) error {
			ctx := comm.IssuerWaits(context.Background())
			for i := range calls {
				if err := allReduceOnce(ctx, ctx, c, r, i); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "wait with a context that ends", maxWakes: -1, run: func(t *testing.T, c *comm.Comm, r int) error {
			// Wait cannot run the call itself (giving up on wctx could
			// come sooner): it must hand the call to the worker.
			wctx, cancel := waitCtx(t)
			defer cancel()
			for i := range 20 {
				if err := allReduceOnce(comm.IssuerWaits(context.Background()), wctx, c, r, i); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "among asynchronous calls", maxWakes: -1, run: func(t *testing.T, c *comm.Comm, r int) error {
			// Calls nobody waits for yet, then one whose issuer waits: it
			// runs after them, and they complete with it.
			var hs []comm.Handle
			var bufs [][]byte
			for i := range 5 {
				b := u32s(uint32(r + i))
				bufs = append(bufs, b)
				hs = append(hs, c.AllReduce(context.Background(), mustBuf(comm.Int32, b), mustBuf(comm.Int32, b), comm.Sum))
			}
			if err := allReduceOnce(comm.IssuerWaits(context.Background()), context.Background(), c, r, 5); err != nil {
				return err
			}
			for i, h := range hs {
				if !h.Done() {
					t.Errorf("rank %d: asynchronous call %d not done after a later call completed", r, i)
				}
				if err := h.Wait(context.Background()); err != nil {
					return err
				}
				if got, want := u32of(bufs[i]), uint32(2*i+1); got != want {
					t.Errorf("rank %d: asynchronous call %d: sum %d, want %d", r, i, got, want)
				}
			}
			return nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := newMemJob(t, 2, comm.DefaultConfig())
			for r, err := range onEach(t, 2, func(r int) error { return tc.run(t, j.comms[r], r) }) {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for r, c := range j.comms {
				if w := comm.Kicks(c); tc.maxWakes >= 0 && w > tc.maxWakes {
					t.Errorf("rank %d: the worker was woken %d times for %d calls whose issuer waited (want ≤ %d)",
						r, w, calls, tc.maxWakes)
				}
			}
		})
	}
}

// allReduceOnce sums rank+i over 2 ranks with a call issued under ictx and
// waited for under wctx, and checks the sum.
func allReduceOnce(ictx, wctx context.Context, c *comm.Comm, r, i int) error {
	b := u32s(uint32(r + i))
	if err := c.AllReduce(ictx, mustBuf(comm.Int32, b), mustBuf(comm.Int32, b), comm.Sum).Wait(wctx); err != nil {
		return err
	}
	if got, want := u32of(b), uint32(2*i+1); got != want {
		return fmt.Errorf("call %d: sum %d, want %d", i, got, want)
	}
	return nil
}

func u32s(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func u32of(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
