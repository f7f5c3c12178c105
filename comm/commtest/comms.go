package commtest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gorun-hpc/gorun/comm"
)

// StartComms connects n communicators with cfg over a fresh in-memory
// network, ranks "rank0:1".."rank{n-1}:1", for tests of packages built on
// comm. It fails the test if any rank cannot connect, and registers a
// Cleanup that closes every communicator (Close waits for calls issued).
func StartComms(ctx context.Context, t testing.TB, n int, cfg comm.Config) []*comm.Comm {
	t.Helper()
	nw := NewNetwork()
	addrs := make([]string, n)
	for r := range addrs {
		addrs[r] = fmt.Sprintf("rank%d:1", r)
	}
	comms := make([]*comm.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Go(func() {
			comms[r], errs[r] = comm.New(ctx, NewStaticGroup(r, addrs, nil), nw.Endpoint(addrs[r]), cfg)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, c := range comms {
			if c != nil {
				wg.Go(func() { _ = c.Close() })
			}
		}
		wg.Wait()
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("comm.New rank %d: %v", r, err)
		}
	}
	return comms
}
