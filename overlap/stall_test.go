package overlap

import (
	"bytes"
	"context"
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
