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

// A rank that is slow inside a step (its backward compute before the last
// all-reduce) is named by the rank waiting for it, through the
// communicator's stall diagnosis, in both executor modes; the step then
// completes with correct results.
func TestGraphStallDiagnosed(t *testing.T) {
	g, err := stepgraph.Parse(realGraphText)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{Native, Grouped} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			logs := &lockedBuf{}
			cfg := comm.LocalConfig()
			cfg.Deterministic = true
			cfg.DesyncCheckAfter = 100 * time.Millisecond
			cfg.Logger = zerolog.New(logs).Level(zerolog.WarnLevel)
			comms := commtest.StartComms(ctx, t, 2, cfg)
			slow := func(rank int, node string) {
				if rank == 1 && node == "b0" {
					time.Sleep(600 * time.Millisecond)
				}
			}
			runRanks(t, comms, func(c *comm.Comm) error { return graphRank(ctx, g, c, mode, slow) })
			out := logs.String()
			if !strings.Contains(out, "call stalled: rank 1 is idle since AllReduce") || !strings.Contains(out, `"behind":[1]`) {
				t.Errorf("the waiting rank did not name rank 1:\n%s", out)
			}
		})
	}
}

// With Config.StallTimeout set, the same stall inside a step fails the step
// on the waiting rank with a *comm.StallError naming the straggler (and the
// straggler, arriving late, learns it from the abort), in both modes.
func TestGraphStallTimeout(t *testing.T) {
	g, err := stepgraph.Parse(realGraphText)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{Native, Grouped} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := comm.LocalConfig()
			cfg.Deterministic = true
			cfg.DesyncCheckAfter = 100 * time.Millisecond
			cfg.StallTimeout = 300 * time.Millisecond
			comms := commtest.StartComms(ctx, t, 2, cfg)
			slow := func(rank int, node string) {
				if rank == 1 && node == "b0" {
					time.Sleep(1500 * time.Millisecond)
				}
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r, c := range comms {
				wg.Go(func() { errs[r] = graphRank(ctx, g, c, mode, slow) })
			}
			wg.Wait()
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
