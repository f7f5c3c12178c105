package nccl

import (
	"strings"
	"sync"
	"testing"
)

// A failed load names its reason even when many goroutines load at once:
// dlerror's message is per OS thread, so dlopen must read it on the thread
// that failed.
func TestDlopenErrorNamesReason(t *testing.T) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := 0
	for range 16 {
		wg.Go(func() {
			for range 1000 {
				_, err := dlopen("/nonexistent/libgorun-test-missing.so")
				if err == nil || !strings.Contains(err.Error(), "No such file") {
					mu.Lock()
					bad++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of %d failed loads did not say why", bad, 16*1000)
	}
}
