package overlap

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/stepgraph"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stallStep runs the two-rank graph step in mode with rank 1 asleep for
// sleep before its backward compute b0 (so inside the step, before the
// last all-reduce), under a 100 ms desync check and stallTimeout, and
// returns the ranks' warnings and errors.
func stallStep(t *testing.T, mode Mode, sleep, stallTimeout time.Duration) (string, []error) {
	t.Helper()
	g, err := stepgraph.Parse(realGraphText)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs := &lockedBuf{}
	cfg := comm.LocalConfig()
	cfg.Deterministic = true
	cfg.DesyncCheckAfter = 100 * time.Millisecond
	cfg.StallTimeout = stallTimeout
	cfg.Logger = zerolog.New(logs).Level(zerolog.WarnLevel)
	comms := commtest.StartComms(ctx, t, 2, cfg)
	slow := func(rank int, node string) {
		if rank == 1 && node == "b0" {
			time.Sleep(sleep)
		}
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			if errs[r] = graphRank(ctx, g, c, mode, slow); errs[r] != nil {
				c.Abort(errs[r]) // release the peer rather than leave it waiting
			}
		})
	}
	wg.Wait()
	return logs.String(), errs
}

// A rank that is slow inside a step is named by the rank waiting for it,
// through the communicator's stall diagnosis, in both executor modes; the
// step then completes with correct results. With Config.StallTimeout set,
// the same stall fails the step on the waiting rank with a
// *comm.StallError naming the straggler (and the straggler, arriving late,
// learns it from the abort).
func TestGraphStall(t *testing.T) {
	for _, mode := range []Mode{Native, Grouped} {
		t.Run(mode.String()+"/diagnosed", func(t *testing.T) {
			out, errs := stallStep(t, mode, 600*time.Millisecond, 0)
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			if !strings.Contains(out, "call stalled: rank 1 is idle since AllReduce") || !strings.Contains(out, `"behind":[1]`) {
				t.Errorf("the waiting rank did not name rank 1:\n%s", out)
			}
		})
		t.Run(mode.String()+"/timeout", func(t *testing.T) {
			_, errs := stallStep(t, mode, 1500*time.Millisecond, 300*time.Millisecond)
			var se *comm.StallError
			if !errors.As(errs[0], &se) || !slices.Equal(se.Behind, []int{1}) {
				t.Errorf("waiting rank: %v, want a StallError naming rank 1 behind", errs[0])
			}
			if errs[1] == nil {
				t.Error("the straggler finished its step on a communicator its peer gave up on")
			}
			t.Logf("rank 0: %v\nrank 1: %v", errs[0], errs[1])
		})
	}
}
