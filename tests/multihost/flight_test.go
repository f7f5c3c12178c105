package multihost

import (
	"fmt"
	"regexp"
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
	t.Run("desync", func(t *testing.T) {
		j := newJob(t, h, 2, "split:0", nil, "-np", "4")
		if code := j.run(); code != 3 {
			t.Errorf("exit %d, want 3 (a rank's DesyncError)", code)
		}
		// Rank 3 may be stopped by gorun (the first rank to exit with
		// its DesyncError fails the job) before its own communicator
		// fails and dumps; ranks 0-2 get there first on every run seen.
		stderr := j.stderr.String()
		m := regexp.MustCompile(`flight records \(the job failed\), merged from (\d) dumps from the hosts`).FindStringSubmatch(stderr)
		if m == nil || m[1] < "3" {
			t.Errorf("no merged table of at least 3 dumps")
		}
		for _, want := range []string{">>  #4", "first disagreement at #4: ranks 0-1 called AllReduce(float32 sum, count=16) #4, rank"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q", want)
			}
		}
		if !regexp.MustCompile(`, ranks? 2(-3)? called Broadcast\(float32, count=16, root=0\) #4`).MatchString(stderr) {
			t.Errorf("the table does not name rank 2's Broadcast as the other side")
		}
		n := 3
		if m != nil && m[1] == "4" {
			n = 4
		}
		columns(t, stderr, n)
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", j.stdout.String(), stderr)
		}
		j.noSurvivors()
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
