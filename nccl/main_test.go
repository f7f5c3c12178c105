package nccl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/gorun-hpc/gorun/nccl/nccltest"
)

// standins are the stand-in libraries every test loads (built once in
// TestMain; no NCCL or GPU loads on the machines CI runs on).
var standins nccltest.Libraries

func TestMain(m *testing.M) {
	// The test binary is also the helper process of the tests that need a
	// fresh process (a library loaded with other settings, a rank of a
	// multi-process world).
	if h := os.Getenv("GORUN_NCCL_HELPER"); h != "" {
		os.Exit(helperMain(h))
	}
	dir, err := os.MkdirTemp("", "gorun-nccl-standin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	standins, err = nccltest.Build(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// goleak's check runs inside m.Run's wrapper so that the directory
	// is removed on every path.
	code := 0
	func() {
		defer os.RemoveAll(dir)
		code = runChecked(m)
	}()
	os.Exit(code)
}

func runChecked(m *testing.M) int {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// testConfig points at the stand-ins.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Library = LibraryConfig{NCCL: standins.NCCL, CUDA: standins.CUDA, MinVersion: MinVersion}
	return cfg
}

// memBoot is an in-memory Bootstrap for ranks that are goroutines of one
// test: a shared all-gather and a failure the test triggers (standing in for
// the rendezvous declaring a member lost).
type memBoot struct {
	me int
	w  *memWorld
}

type memWorld struct {
	n      int
	mu     sync.Mutex
	rounds map[int]*memRound
	seq    []int // per rank: next round
	failed chan struct{}
	err    error
}

type memRound struct {
	got  [][]byte
	left int
	done chan struct{}
}

func newMemWorld(n int) *memWorld {
	return &memWorld{n: n, rounds: map[int]*memRound{}, seq: make([]int, n), failed: make(chan struct{})}
}

// lose fails the group as the rendezvous does when rank r is lost.
func (w *memWorld) lose(r int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = fmt.Errorf("rendezvous: rank %d (host memhost) lost: test", r)
		close(w.failed)
	}
}

func (b memBoot) Rank() int               { return b.me }
func (b memBoot) Size() int               { return b.w.n }
func (b memBoot) GlobalRank(r int) int    { return r }
func (b memBoot) Host(int) string         { return "memhost" }
func (b memBoot) DataAddr(int) string     { return "" }
func (b memBoot) Failed() <-chan struct{} { return b.w.failed }
func (b memBoot) Err() error {
	b.w.mu.Lock()
	defer b.w.mu.Unlock()
	return b.w.err
}

func (b memBoot) AllGather(ctx context.Context, p []byte) ([][]byte, error) {
	w := b.w
	w.mu.Lock()
	k := w.seq[b.me]
	w.seq[b.me]++
	r := w.rounds[k]
	if r == nil {
		r = &memRound{got: make([][]byte, w.n), left: w.n, done: make(chan struct{})}
		w.rounds[k] = r
	}
	r.got[b.me] = append([]byte(nil), p...)
	if r.left--; r.left == 0 {
		close(r.done)
	}
	w.mu.Unlock()
	select {
	case <-r.done:
		return r.got, nil
	case <-w.failed:
		return nil, b.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startComms makes n communicators over one memWorld, concurrently (New
// blocks until all have joined), and closes them when the test ends.
func startComms(t *testing.T, n int, cfg Config) ([]*Comm, *memWorld) {
	t.Helper()
	w := newMemWorld(n)
	cs := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { cs[r], errs[r] = New(context.Background(), memBoot{me: r, w: w}, cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range cs {
			if c != nil {
				c.Abort(nil)
				c.Close()
			}
		}
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Abort(errors.New("test over")) // a failed test may leave calls pending
		}
		for _, c := range cs {
			c.Close()
		}
	})
	return cs, w
}
