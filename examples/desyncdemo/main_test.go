package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// build compiles gorun and this demo into a temporary directory.
func build(t *testing.T) (gorun, demo string) {
	t.Helper()
	dir := launchertest.Build(t, "cmd/gorun", "examples/desyncdemo")
	return filepath.Join(dir, "gorun"), filepath.Join(dir, "desyncdemo")
}

// End to end under gorun: a desync at call #4 fails every rank with a
// DesyncError naming both calls within seconds, and gorun prints the merged
// flight records with #4 marked; a rank 5 s late is named by the others,
// SIGUSR2 to gorun prints the table meanwhile, and the job completes; a
// rank stuck until --timeout gets the table printed before the job stops.
func TestUnderGorun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches gorun")
	}
	gorun, demo := build(t)
	t.Run("desync", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, errb bytes.Buffer
		cmd := exec.CommandContext(ctx, gorun, "-np", "4", "--timeout", "30s", demo, "-mode", "desync")
		cmd.Stdout, cmd.Stderr = &out, &errb
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("gorun: %v, want exit 3\n%s%s", err, out.String(), errb.String())
		}
		// Ranks that are stopped once the first one exits may not print.
		if n := strings.Count(out.String(), "DesyncError: comm: desync: rank"); n < 1 {
			t.Errorf("no rank reported a DesyncError:\n%s", out.String())
		}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if !strings.Contains(line, "AllReduce(") || !strings.Contains(line, "Broadcast(") {
				t.Errorf("a rank's error does not name both calls: %s", line)
			}
		}
		// The first rank to exit ends the job, so a slow rank may be
		// stopped before it dumps: the table may lack a column.
		for _, want := range []string{">>  #4", "first disagreement at #4: ", "called AllReduce(float32 sum, count=16) #4, ", "called Broadcast(float32, count=16, root=0) #4"} {
			if !strings.Contains(errb.String(), want) {
				t.Errorf("gorun's stderr lacks %q:\n%s", want, errb.String())
			}
		}
		if took > 10*time.Second {
			t.Errorf("the job took %v", took)
		}
		t.Logf("%v\n%s", took, errb.String())
	})
	t.Run("late", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, errb bytes.Buffer
		cmd := exec.CommandContext(ctx, gorun, "-np", "4", "--timeout", "30s", demo, "-mode", "late")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // rank 3 is 5 s late
		_ = cmd.Process.Signal(syscall.SIGUSR2)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("gorun: %v\n%s%s", err, out.String(), errb.String())
		}
		if n := strings.Count(out.String(), ": ok"); n != 4 {
			t.Errorf("%d ranks completed, want 4:\n%s", n, out.String())
		}
		for _, want := range []string{
			"rank 3 is idle since AllReduce(float32 sum, count=16) #3 (has not issued #4)",
			"gorun: flight records (SIGUSR2)",
			"first disagreement at #4: ranks 0-2 called AllReduce(float32 sum, count=16) #4; rank 3 never reached it",
		} {
			if !strings.Contains(errb.String(), want) {
				t.Errorf("gorun's stderr lacks %q:\n%s", want, errb.String())
			}
		}
	})
	t.Run("timeout", func(t *testing.T) {
		// A rank stuck for good: at --timeout gorun asks the ranks for
		// their records first, prints the table, then stops the job.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, errb bytes.Buffer
		cmd := exec.CommandContext(ctx, gorun, "-np", "4", "--timeout", "3s", demo, "-mode", "late", "-delay", "30s")
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 124 {
			t.Fatalf("gorun: %v, want exit 124\n%s%s", err, out.String(), errb.String())
		}
		for _, want := range []string{"gorun: flight records (--timeout)", ">>  #4", "rank 3 never reached it", "gorun: job timed out after 3s"} {
			if !strings.Contains(errb.String(), want) {
				t.Errorf("gorun's stderr lacks %q:\n%s", want, errb.String())
			}
		}
		// Printed at the timeout, the table is not printed again when the
		// job has ended.
		if n := strings.Count(errb.String(), "gorun: flight records ("); n != 1 {
			t.Errorf("gorun printed the flight table %d times, want once:\n%s", n, errb.String())
		}
	})
}
