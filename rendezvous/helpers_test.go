package rendezvous

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

func TestMain(m *testing.M) {
	if helperMain() { // the test binary re-executed as a rank: see proc_test.go
		return
	}
	goleak.VerifyTestMain(m)
}

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// testLogger writes warnings and errors through t.Log; GORUN_TEST_LOG=debug
// shows everything.
func testLogger(t testing.TB) zerolog.Logger {
	lvl := zerolog.WarnLevel
	if v := os.Getenv("GORUN_TEST_LOG"); v != "" {
		if l, err := zerolog.ParseLevel(v); err == nil {
			lvl = l
		}
	}
	return zerolog.New(zerolog.NewTestWriter(t)).Level(lvl)
}

// memAddr is rank r's address on the in-memory network; rank 0's is the seed.
func memAddr(r int) string { return fmt.Sprintf("10.0.%d.%d:7946", r/250, r%250+1) }

// memConfig is LocalConfig for rank r of size on nw, host "h<r/4>" (four
// ranks per host), data address "data-<r>:1".
func memConfig(t testing.TB, nw *rendezvoustest.Network, job string, rank, size int) Config {
	t.Helper()
	tr, err := nw.NewTransport(memAddr(rank))
	if err != nil {
		t.Fatal(err)
	}
	return memConfigOn(t, tr, job, rank, size)
}

func memConfigOn(t testing.TB, tr *rendezvoustest.Transport, job string, rank, size int) Config {
	c := LocalConfig()
	c.JobID, c.Rank, c.WorldSize, c.LocalRank = job, rank, size, rank%4
	c.Host = fmt.Sprintf("h%d", rank/4)
	c.DataAddr = fmt.Sprintf("data-%d:1", rank)
	c.Seed = memAddr(0)
	c.Secret = testSecret
	c.Transport = tr
	c.Logger = testLogger(t)
	return c
}

// joinAll runs Join for every config concurrently and returns worlds and
// errors by index.
func joinAll(ctx context.Context, cfgs []Config) ([]*World, []error) {
	ws := make([]*World, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, c := range cfgs {
		wg.Go(func() { ws[i], errs[i] = Join(ctx, c) })
	}
	wg.Wait()
	return ws, errs
}

// formMem forms a world of size on a fresh in-memory network; it fails the
// test unless every Join succeeds.
func formMem(t testing.TB, size int, tweak func(*Config)) ([]*World, *rendezvoustest.Network) {
	t.Helper()
	nw := &rendezvoustest.Network{}
	cfgs := make([]Config, size)
	for r := range cfgs {
		cfgs[r] = memConfig(t, nw, "job1", r, size)
		if tweak != nil {
			tweak(&cfgs[r])
		}
	}
	ws, errs := joinAll(context.Background(), cfgs)
	for r, err := range errs {
		if err != nil {
			closeAll(ws)
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	return ws, nw
}

// closeAll closes every non-nil world concurrently (a leave waits for a
// gossip round, so serial closes of 256 worlds would be slow).
func closeAll(ws []*World) {
	var wg sync.WaitGroup
	for _, w := range ws {
		if w != nil {
			wg.Go(func() { _ = w.Close() })
		}
	}
	wg.Wait()
}

// bubble runs f in a synctest bubble, then lets fake time run until
// memberlist's own timers (probe timeouts, TCP deadlines) have fired:
// memberlist does not wait for its goroutines on Shutdown, and a bubble whose
// main goroutine has returned no longer advances time.
func bubble(t *testing.T, f func(t *testing.T)) {
	synctest.Test(t, func(t *testing.T) {
		f(t)
		time.Sleep(30 * time.Second)
	})
}

// crash stops w's gossip without a leave, as a SIGKILL would, and waits for
// its goroutines. The World is unusable afterwards except for Close-free
// teardown, which crash does itself.
func crash(w *World) {
	w.closeOnce.Do(func() { w.closeErr = w.shutdown(false) })
}
