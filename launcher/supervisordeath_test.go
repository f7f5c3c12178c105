package launcher

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/outcome"
)

// supervisorOf returns the pid of the supervisor of the job whose rank 0
// printed "ready 0 PID": the rank's parent.
func supervisorOf(t *testing.T, j *jobRun) int {
	t.Helper()
	m := regexp.MustCompile(`\[0\] ready 0 (\d+)`).FindStringSubmatch(j.stdout.String())
	if m == nil {
		t.Fatalf("no ready line from rank 0: %s", j.stdout)
	}
	pid, _ := strconv.Atoi(m[1])
	ppid := ppidOf(t, pid)
	if ppid == 0 {
		t.Fatalf("rank 0 (pid %d) is gone", pid)
	}
	return ppid
}

// When the local supervisor itself dies or freezes while ranks have
// children in sessions of their own, nothing of the job survives, gorun
// returns promptly (a second SIGINT included) and its error says what
// happened to the supervisor. Launch (jobRun.launch) fails the test on any
// survivor.
func TestRunSupervisorDeath(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		// sigints are sent to gorun after the supervisor was hit.
		sigints int
		want    string
	}{
		{"SIGKILL", syscall.SIGKILL, 0, "was killed by signal 9 (killed)"},
		{"SIGSTOP", syscall.SIGSTOP, 0, "past its lease of 1s (stopped or hung)"},
		{"SIGSTOP then two SIGINTs", syscall.SIGSTOP, 2, "past its lease of 1s (stopped or hung)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJobRun(t, 3, "setsid-grandchild", nil)
			j.cfg.Lease = time.Second
			sigs := make(chan os.Signal, 2)
			j.cfg.Signals = sigs
			errc := make(chan error, 1)
			go func() { errc <- j.launch(context.Background()) }()
			if !launchertest.WaitFor(30*time.Second, func() bool { return j.readyCount() == 3 }) {
				t.Fatalf("ranks not ready: %s%s", j.stdout, j.stderr)
			}
			sup := supervisorOf(t, j)
			if err := syscall.Kill(sup, tc.sig); err != nil {
				t.Fatal(err)
			}
			for range tc.sigints {
				sigs <- syscall.SIGINT
			}
			hit := time.Now()
			var err error
			select {
			case err = <-errc:
			case <-time.After(20 * time.Second):
				_ = syscall.Kill(sup, syscall.SIGKILL)
				t.Fatalf("gorun still waiting 20s after the supervisor got %v", tc.sig)
			}
			var se *outcome.SupervisorError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) || se.Ranks != 3 || se.Leftovers < 3 {
				t.Fatalf("got %T %v, want a outcome.SupervisorError saying %q with 3 ranks and at least their 3 children killed", err, err, tc.want)
			}
			t.Logf("%v after %v: %v", tc.sig, time.Since(hit).Round(time.Millisecond), err)
		})
	}
}
