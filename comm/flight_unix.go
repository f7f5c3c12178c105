//go:build unix

package comm

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
)

// dumpOnSignal dumps every open communicator's flight records on SIGUSR2
// until stop is called, and leaves ready.<pid> in dir while it does, so that
// gorun signals only processes that will not die of SIGUSR2 (its default
// action). After each dump it writes dumped.<pid>, which gorun waits for.
func dumpOnSignal(dir string) (stop func()) {
	pid := os.Getpid()
	ready := filepath.Join(dir, fmt.Sprintf("ready.%d", pid))
	dumped := filepath.Join(dir, fmt.Sprintf("dumped.%d", pid))
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR2)
	_ = os.WriteFile(ready, nil, 0o600)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ch:
				DumpFlightRecords("SIGUSR2")
				_ = os.WriteFile(dumped, nil, 0o600)
			case <-done:
				return
			}
		}
	})
	return func() {
		signal.Stop(ch)
		close(done)
		wg.Wait()
		// A communicator opened meanwhile started a new handler, which
		// wrote the same file: leave it.
		live.mu.Lock()
		if live.stopSig == nil {
			_ = os.Remove(ready)
		}
		live.mu.Unlock()
	}
}
