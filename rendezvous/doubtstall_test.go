package rendezvous

import (
	"testing"
	"testing/synctest"
	"time"
)

// After formation a gossip member memberlist declared dead is lost once
// the rest of its lease (GossipLease − SuspicionTimeout, 2 s here) has
// passed without an answer. That rest is judged on time the observer
// could run: a process stalled for seconds (thousands of ranks in one
// process) did not hear answers it could not read, so its own stalls are
// excused, up to StarvedLimit, as the attach leases excuse them.
func TestDoubtExcusesOwnStalls(t *testing.T) {
	const window = 2 * time.Second
	for _, tc := range []struct {
		name string
		// starve adds the observer's stalls to log as the test's clock
		// runs, from start; it runs in its own goroutine until stop.
		starve      func(log *stallLog, start time.Time, stop <-chan struct{})
		alive, lost time.Duration // still in the world at alive, lost by lost
	}{
		{"on time", nil, window - 100*time.Millisecond, window + 100*time.Millisecond},
		{"stalled 1.5s", func(log *stallLog, start time.Time, _ <-chan struct{}) {
			time.Sleep(1700 * time.Millisecond)
			log.add(start.Add(200*time.Millisecond), start.Add(1700*time.Millisecond))
		}, window + 1400*time.Millisecond, window + 1600*time.Millisecond},
		{"starved past the limit", func(log *stallLog, start time.Time, stop <-chan struct{}) {
			for from := start; ; {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				now := time.Now()
				log.add(from, now)
				from = now
			}
		}, 5*time.Second - 100*time.Millisecond, 5*time.Second + 100*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.JobID, cfg.WorldSize, cfg.Host = "doubt", 2, "h0"
				cfg.Secret = testSecret
				cfg.StarvedLimit = 5 * time.Second
				cfg.Logger = testLogger(t)
				w := newWorld(cfg)
				w.stalls = &stallLog{} // not the process's: the test says what stalled
				w.mu.Lock()
				w.members[0].status, w.members[1].status = statusAlive, statusAlive
				w.alive, w.formed, w.epoch = 2, true, 1
				w.doubtLocked(1)
				w.mu.Unlock()
				start := time.Now()
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					if tc.starve != nil {
						tc.starve(w.stalls, start, stop)
					}
				}()
				status := func() memberStatus {
					w.mu.Lock()
					defer w.mu.Unlock()
					return w.members[1].status
				}
				time.Sleep(tc.alive)
				if s := status(); s != statusAlive {
					t.Errorf("at %v: member 1 is %d, want still alive (in doubt)", tc.alive, s)
				}
				time.Sleep(tc.lost - tc.alive)
				if s := status(); s != statusDead {
					t.Errorf("at %v: member 1 is %d, want lost", tc.lost, s)
				}
				close(stop)
				<-done
				close(w.stop)
				w.wg.Wait()
			})
		})
	}
}
