package supervisor

import (
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/internal/liveness"
)

// The client's lease on its supervisor, with a stand-in supervisor that
// never says anything and the kernel's evidence faked: while the fake says
// it runs (starved on a loaded host) the lease does not kill it, for many
// leases; once the fake says stopped, it is killed within a look.
func TestSupervisorLeaseSparesStarved(t *testing.T) {
	const lease = 200 * time.Millisecond
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() { _ = cmd.Process.Kill(); <-exited }()
	var stopped atomic.Bool
	var cpu atomic.Int64
	s := &Client{cmd: cmd, sample: func(int) (liveness.Sample, bool) {
		if stopped.Load() {
			return liveness.Sample{State: 'T', CPU: time.Duration(cpu.Load())}, true
		}
		return liveness.Sample{State: 'S', CPU: time.Duration(cpu.Add(1000))}, true
	}}
	s.lastHeard.Store(time.Now().UnixNano())
	done := make(chan struct{})
	var silent atomic.Int64
	watched := make(chan struct{})
	go func() { s.WatchLease(lease, done, &silent); close(watched) }()
	defer func() { close(done); <-watched }()
	select {
	case <-exited:
		t.Fatalf("a supervisor the kernel shows running was killed after %v of silence (lease %v)", time.Duration(silent.Load()), lease)
	case <-time.After(8 * lease):
	}
	stopped.Store(true)
	t0 := time.Now()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped supervisor was not killed within 10 s")
	}
	if d := time.Duration(silent.Load()); d < lease {
		t.Errorf("killed after a silence of %v, below the lease %v", d, lease)
	}
	t.Logf("stopped supervisor killed %v after it was stopped", time.Since(t0).Round(time.Millisecond))
}
