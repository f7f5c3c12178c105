package multihost

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// Flight records across hosts: 4 ranks on 2 namespace hosts. Each host's
// ranks dump into their host agent's directory, the agents send the dumps
// to gorun, and gorun prints one table of all four ranks, with both hosts
// named in its columns and the first disagreeing call marked: after a
// desync (sent by the agents once their ranks are gone), and on SIGUSR2
// while a rank is late (sent when gorun asks).
func TestFlightRecordsAcrossHosts(t *testing.T) {
	h := requireHosts(t)
	columns := func(t *testing.T, stderr string, n int) {
		t.Helper()
		for r := range n {
			if col := fmt.Sprintf("rank %d (%s)", r, h.Hosts[r/2]); !strings.Contains(stderr, col) {
				t.Errorf("the table has no column %q", col)
			}
		}
	}
	// failed runs a job that fails with a rank's DesyncError and checks
	// gorun's merged table: every rank dumps, the ones whose communicator
	// failed on their own, the rest on the SIGUSR2 their host agent sends
	// before it relays gorun's SIGTERM (wire.Cmd.DumpFirst).
	failed := func(t *testing.T, perRank map[int]string, disagreement string) {
		j := newJob(t, h, 2, "split:0", perRank, "-np", "4")
		if code := j.run(); code != 3 {
			t.Errorf("exit %d, want 3 (a rank's DesyncError)", code)
		}
		stderr := j.stderr.String()
		for _, want := range []string{"flight records (the job failed), merged from 4 dumps from the hosts", ">>  #4", disagreement} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q", want)
			}
		}
		columns(t, stderr, 4)
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", j.stdout.String(), stderr)
		}
		j.noSurvivors()
	}
	t.Run("desync", func(t *testing.T) {
		failed(t, nil, "first disagreement at #4: ranks 0-1 called AllReduce(float32 sum, count=16) #4, "+
			"ranks 2-3 called Broadcast(float32, count=16, root=0) #4")
	})
	t.Run("busy", func(t *testing.T) {
		// Rank 0 is busy outside any call when ranks 2-3 fail the job:
		// its communicator has not failed, so only its host agent's
		// SIGUSR2 before the teardown gets its records into the table.
		failed(t, map[int]string{0: "split-busy:20000"}, "first disagreement at #4: rank 1 called AllReduce(float32 sum, count=16) #4, "+
			"ranks 2-3 called Broadcast(float32, count=16, root=0) #4; rank 0 never reached it")
	})
	t.Run("SIGUSR2", func(t *testing.T) {
		j := newJob(t, h, 2, "split:5000", nil, "-np", "4")
		if err := j.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Every rank passed call #3; ranks 0-2 then wait in #4 for rank 3.
		if !launchertest.WaitFor(30*time.Second, func() bool { return strings.Count(j.stdout.String(), "ready") == 4 }) {
			_ = j.cmd.Process.Kill()
			t.Fatalf("the ranks did not get ready\nstdout:\n%s\nstderr:\n%s", j.stdout.String(), j.stderr.String())
		}
		time.Sleep(300 * time.Millisecond)
		if err := j.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		if code := j.wait(); code != 0 {
			t.Errorf("exit %d, want 0: the late rank arrives and the job completes", code)
		}
		stderr := j.stderr.String()
		for _, want := range []string{
			"flight records (SIGUSR2), merged from 4 dumps from the hosts",
			">>  #4",
			"first disagreement at #4: ranks 0-2 called AllReduce(float32 sum, count=16) #4; rank 3 never reached it",
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q", want)
			}
		}
		columns(t, stderr, 4)
		if n := strings.Count(j.stdout.String(), "ok"); n != 4 {
			t.Errorf("%d ranks finished, want 4", n)
		}
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", j.stdout.String(), stderr)
		}
		j.noSurvivors()
	})
}
