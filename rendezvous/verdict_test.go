package rendezvous

import (
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorun-hpc/gorun/internal/liveness"
)

// The attach stream's judge with the kernel faked: an attached rank that
// never beats (its own AttachBeat is an hour) sits on a one-host job whose
// leader has a 1 s lease. What the fake says about the rank's process
// decides: alive and running, it is starved and stays in the world however
// long it is silent, up to StarvedLimit; stopped, it is named at once;
// asleep without running, at the next look; without evidence, at the lease,
// as before the judge.
func TestAttachVerdicts(t *testing.T) {
	const lease, limit = time.Second, 20 * time.Second
	for _, tc := range []struct {
		name string
		// first is the process's state until switchAt, then second.
		first, second string
		switchAt      time.Duration
		// lostAfter bounds when the leader must declare the rank lost,
		// counted from the last frame it heard; notBefore is the
		// earliest it may.
		notBefore, lostAfter time.Duration
	}{
		{"starved then stopped", "running", "stopped", 10 * time.Second, 10 * time.Second, 10*time.Second + lease/2},
		{"waits for the CPU then stopped", "runnable", "stopped", 10 * time.Second, 10 * time.Second, 10*time.Second + lease/2},
		{"stopped", "stopped", "stopped", 0, lease, lease + 100*time.Millisecond},
		{"asleep and never running", "asleep", "asleep", 0, lease + lease/4, lease + lease/2},
		{"no evidence", "none", "none", 0, lease, lease + 100*time.Millisecond},
		{"running but silent past the limit", "running", "running", 0, limit, limit + lease/2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var cpu atomic.Int64
				var state atomic.Value
				state.Store(tc.first)
				fake := func(pid int) (liveness.Sample, bool) {
					switch state.Load().(string) {
					case "running":
						return liveness.Sample{State: 'S', CPU: time.Duration(cpu.Add(int64(time.Millisecond)))}, true
					case "runnable":
						return liveness.Sample{State: 'R', CPU: time.Duration(cpu.Load())}, true
					case "stopped":
						return liveness.Sample{State: 'T', CPU: time.Duration(cpu.Load())}, true
					case "asleep":
						return liveness.Sample{State: 'S', CPU: time.Duration(cpu.Load())}, true
					}
					return liveness.Sample{}, false
				}
				ws, _ := formHier(t, 1, 2, func(c *Config) {
					if c.LocalRank == 0 {
						c.AttachLease, c.AttachBeat, c.StarvedLimit = lease, lease/16, limit
						c.procSample = fake
					} else {
						c.AttachBeat, c.AttachLease, c.StarvedLimit = time.Hour, 3*time.Hour, 0
					}
				})
				defer closeAll(ws)
				synctest.Wait() // formed: the rank's last frame is behind us
				heard := time.Now()
				if tc.switchAt > 0 {
					go func() {
						time.Sleep(tc.switchAt)
						state.Store(tc.second)
					}()
				}
				select {
				case <-ws[0].Failed():
				case <-time.After(tc.lostAfter + time.Minute):
					t.Fatalf("rank 1 never declared lost (%v)", ws[0].Err())
				}
				took := time.Since(heard)
				var le *LostError
				if !errors.As(ws[0].Err(), &le) || le.Rank != 1 || !errors.Is(le, ErrSilent) {
					t.Fatalf("leader: Err = %v, want rank 1 lost as silent", ws[0].Err())
				}
				if took < tc.notBefore || took > tc.lostAfter {
					t.Errorf("rank 1 declared lost %v after its last frame, want within [%v, %v]", took, tc.notBefore, tc.lostAfter)
				}
				t.Logf("declared lost after %v", took)
			})
		})
	}
}
