package launcher

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Environment of TestNoFalseFreezeUnderLoad: how many ranks and for how
// long they all-reduce beside the CPU hog. The test runs only when the
// duration is set: it loads every core on purpose, and beside the other
// packages that `go test ./...` runs at once it would starve their timing
// tests. `make test` runs it alone after the suite for 8 s; `make
// test-overload` runs its 32 ranks for 60 s.
const (
	overloadNPEnv   = "GORUN_OVERLOAD_NP"
	overloadSecsEnv = "GORUN_OVERLOAD_SECS"
)

// TestNoFalseFreezeUnderLoad: the freeze detection (the attach lease, and
// gossip between host leaders) must not take a starved rank for a frozen
// one. 32 ranks (one host: the default host leader mode) all-reduce while
// one busy loop per core competes for the CPU; every rank must finish and
// the job exit 0. A false detection fails the job with a lost rank.
func TestNoFalseFreezeUnderLoad(t *testing.T) {
	secs, err := strconv.Atoi(os.Getenv(overloadSecsEnv))
	if err != nil || secs <= 0 || testing.Short() {
		t.Skipf("loads every core: runs alone, with %s set (make test, make test-overload)", overloadSecsEnv)
	}
	np := 32
	if v, err := strconv.Atoi(os.Getenv(overloadNPEnv)); err == nil && v > 1 {
		np = v
	}
	for range runtime.NumCPU() {
		hog := exec.Command("sh", "-c", "while :; do :; done")
		if err := hog.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hog.Process.Kill(); _ = hog.Wait() })
	}
	j := newJobRun(t, np, "allreduce-for:"+strconv.Itoa(secs*1000), nil)
	// Bounded, generously: starting 32 ranks beside the hog takes a while.
	j.cfg.Timeout = time.Duration(secs)*time.Second + 3*time.Minute
	start := time.Now()
	if err := j.launch(context.Background()); err != nil {
		t.Fatalf("%d ranks under a CPU hog for %d s: the job failed (a healthy rank was declared lost?): %v\nstderr:\n%s", np, secs, err, j.stderr)
	}
	if done := strings.Count(j.stdout.String(), "] done "); done != np {
		t.Fatalf("%d of %d ranks finished:\n%s", done, np, j.stdout)
	}
	t.Logf("%d ranks, %d CPU hogs, %d s of all-reduces: no false detection; job took %v", np, runtime.NumCPU(), secs, time.Since(start))
}
