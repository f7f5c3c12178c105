package flight

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// SignalReady signals only the processes whose ready marker is backed by
// an environment naming this directory: a marker left by a rank whose pid
// now belongs to another process (here, this test) is skipped, since
// SIGUSR2 kills a process without comm's handler. DumpedSince counts the
// markers written since a time.
func TestSignalReadyOnlyThisDirsRanks(t *testing.T) {
	d := At(t.TempDir())
	mark := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d.Path(), name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A rank of this directory: its default SIGUSR2 action ends it, which
	// the test observes.
	rank := exec.Command("sleep", "60")
	rank.Env = append(os.Environ(), d.Env())
	if err := rank.Start(); err != nil {
		t.Fatal(err)
	}
	defer rank.Process.Kill()
	// A stranger: this test process, which must not get the signal.
	mark(fmt.Sprintf("ready.%d", rank.Process.Pid))
	mark(fmt.Sprintf("ready.%d", os.Getpid()))
	mark("ready.nonsense")
	// The child's environment is readable once it exec'd; until then it
	// is this process's copy, which does not name the directory.
	n := 0
	for deadline := time.Now().Add(5 * time.Second); n == 0 && time.Now().Before(deadline); {
		if n = d.SignalReady(); n == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if n != 1 {
		t.Fatalf("SignalReady = %d, want 1 (the rank only)", n)
	}
	err := rank.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ProcessState.String() != "signal: user defined signal 2" {
		t.Errorf("the rank ended with %v, want SIGUSR2", err)
	}

	before := time.Now().Add(-time.Minute)
	mark("dumped.1")
	mark("dumped.2")
	old := filepath.Join(d.Path(), "dumped.3")
	mark("dumped.3")
	if err := os.Chtimes(old, before, before); err != nil {
		t.Fatal(err)
	}
	if got := d.DumpedSince(before.Add(time.Second)); got != 2 {
		t.Errorf("DumpedSince = %d, want 2 (one marker is older)", got)
	}
	var none *Dir
	if none.SignalReady() != 0 || none.DumpedSince(time.Time{}) != 0 || none.Env() != "" || none.Path() != "" {
		t.Error("a nil Dir reports something")
	}
	none.DumpBeforeStop()
	none.Remove()
}

// DumpBeforeStop returns at once when no rank is ready, and waits at most
// BeforeStop for ranks that never write their dump.
func TestDumpBeforeStopBounded(t *testing.T) {
	d := At(t.TempDir())
	start := time.Now()
	d.DumpBeforeStop()
	if e := time.Since(start); e > BeforeStop/2 {
		t.Errorf("no ready rank, yet DumpBeforeStop took %v", e)
	}
	// A rank that ignores SIGUSR2 and never dumps.
	rank := exec.Command("sh", "-c", "trap '' USR2; sleep 60")
	rank.Env = append(os.Environ(), d.Env())
	if err := rank.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rank.Process.Kill(); _ = rank.Wait() }()
	if err := os.WriteFile(filepath.Join(d.Path(), fmt.Sprintf("ready.%d", rank.Process.Pid)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", rank.Process.Pid)); bytes.Contains(env, []byte(d.Env()+"\x00")) {
			break
		}
	}
	start = time.Now()
	d.DumpBeforeStop()
	if e := time.Since(start); e < BeforeStop || e > BeforeStop+2*time.Second {
		t.Errorf("a silent rank: DumpBeforeStop took %v, want about %v", e, BeforeStop)
	}
}
