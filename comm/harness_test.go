package comm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
)

// hangGuard bounds every test that talks to peers: a hang fails the test
// instead of stalling the suite. Generous, since the machine is shared.
const hangGuard = 60 * time.Second

type memJob struct {
	nw     *commtest.Network
	addrs  []string
	groups []*commtest.StaticGroup
	comms  []*comm.Comm
}

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

// newMemJob starts n communicators over one in-memory network and closes
// them at the end of the test.
func newMemJob(t testing.TB, n int, cfg comm.Config) *memJob {
	t.Helper()
	j := &memJob{nw: commtest.NewNetwork()}
	for r := range n {
		j.addrs = append(j.addrs, fmt.Sprintf("mem%d:1", r))
	}
	if cfg.Logger.GetLevel() == zerolog.Disabled || true {
		cfg.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for r := range n {
		g := commtest.NewStaticGroup(r, j.addrs, nil)
		c, err := comm.New(ctx, g, j.nw.Endpoint(j.addrs[r]), cfg)
		if err != nil {
			t.Fatal(err)
		}
		j.groups = append(j.groups, g)
		j.comms = append(j.comms, c)
	}
	t.Cleanup(func() { j.close(t) })
	return j
}

func (j *memJob) close(t testing.TB) {
	var wg sync.WaitGroup
	for _, c := range j.comms {
		wg.Go(func() { _ = c.Close() })
	}
	wg.Wait()
}

// onEach runs fn for every rank concurrently and returns the errors by rank.
func onEach(t testing.TB, n int, fn func(r int) error) []error {
	t.Helper()
	errs := make([]error, n)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = fn(r) })
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatalf("ranks did not finish within %v (hang)", hangGuard)
	}
	return errs
}

func waitCtx(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), hangGuard)
}
