package launcher

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// fakeLookup answers after a delay: names in ok resolve to their address,
// others fail; a negative delay blocks until the context ends (a resolver
// that never answers).
func fakeLookup(delay map[string]time.Duration, ok map[string]string) func(context.Context, string) ([]netip.Addr, error) {
	return func(ctx context.Context, name string) ([]netip.Addr, error) {
		d := delay[name]
		if d < 0 {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if a, found := ok[name]; found {
			return []netip.Addr{netip.MustParseAddr(a)}, nil
		}
		return nil, errors.New("no such host")
	}
}

func TestResolveFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// In list order, not in answer order: c answers first, but b
		// comes before it and resolves once a has failed.
		lookup := fakeLookup(map[string]time.Duration{"a": 20 * time.Millisecond, "b": 50 * time.Millisecond, "c": 0},
			map[string]string{"b": "10.0.0.2", "c": "10.0.0.3"})
		start := time.Now()
		ip, ok := resolveFirst(context.Background(), []string{"a", "b", "c"}, lookup, resolveConfig{})
		if !ok || ip.String() != "10.0.0.2" || time.Since(start) != 50*time.Millisecond {
			t.Errorf("got %v %v after %v, want 10.0.0.2 after 50ms (the lookups in parallel)", ip, ok, time.Since(start))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		// A hundred thousand names, each taking a second to fail: bounded
		// by the candidates and the workers, not a hundred thousand
		// seconds.
		names := make([]string, 100000)
		for i := range names {
			names[i] = "n" + strconv.Itoa(i)
		}
		delay := map[string]time.Duration{}
		for _, n := range names {
			delay[n] = time.Second
		}
		start := time.Now()
		_, ok := resolveFirst(context.Background(), names, fakeLookup(delay, nil), resolveConfig{Workers: 16, Candidates: 256})
		if ok || time.Since(start) != 10*time.Second {
			t.Errorf("got %v after %v, want nothing after 10s (the deadline)", ok, time.Since(start))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		// A resolver that never answers ends at the deadline; one name
		// that answered by then is taken.
		lookup := fakeLookup(map[string]time.Duration{"a": -1, "b": time.Second}, map[string]string{"b": "10.0.0.2"})
		start := time.Now()
		ip, ok := resolveFirst(context.Background(), []string{"a", "b"}, lookup, resolveConfig{Deadline: 3 * time.Second})
		if !ok || ip.String() != "10.0.0.2" || time.Since(start) != 3*time.Second {
			t.Errorf("got %v %v after %v, want 10.0.0.2 at the 3s deadline", ip, ok, time.Since(start))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		// Canceled (gorun interrupted): returns at once.
		ctx, cancel := context.WithCancel(context.Background())
		lookup := fakeLookup(map[string]time.Duration{"a": -1}, nil)
		go func() { time.Sleep(time.Second); cancel() }()
		start := time.Now()
		if _, ok := resolveFirst(ctx, []string{"a"}, lookup, resolveConfig{}); ok || time.Since(start) != time.Second {
			t.Errorf("got %v after %v, want nothing after the 1s cancel", ok, time.Since(start))
		}
	})
}

// A stopping signal ends the watched phase; other signals do not.
func TestWatchStopSignals(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, end := watchStopSignals(context.Background(), sigs)
	sigs <- syscall.SIGUSR1
	sigs <- syscall.SIGINT
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGINT did not end the context")
	}
	if sig := end(); sig != syscall.SIGINT {
		t.Errorf("end() = %v, want SIGINT", sig)
	}
	ctx, end = watchStopSignals(context.Background(), nil)
	if sig := end(); sig != 0 || ctx.Err() == nil {
		t.Errorf("end() = %v with no signal, context %v", sig, ctx.Err())
	}
}
