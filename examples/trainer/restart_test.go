package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRealKillRestart: the whole path of a restart with real processes. A
// rank of a 4-rank trainer job is frozen from the start and killed 300 ms
// in; gorun stops the world and starts a new one (--max-restarts 1), and the
// new world's training ends with the losses and parameters of an
// uninterrupted run (the trainer does not checkpoint yet, so the new world
// trains from step 1). No process of the job outlives gorun (the launcher's
// own tests check that with a /proc scan; here gorun's exit after its
// supervisor reported "no descendant left" is what is relied on).
func TestRealKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	ref := reference(t, smallOptions())
	report := filepath.Join(t.TempDir(), "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The marker line tells the worlds apart in rank 0's output.
	script := `echo "world $GORUN_RESTART_COUNT"; exec "$0" "$@"`
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "gorun"), "-np", "4", "--tag-output",
		"--inject", "stop:rank=2:at=0s", "--inject", "kill:rank=2:at=300ms", "--max-restarts", "1", "--report", report, "--timeout", "60s",
		"/bin/sh", "-c", script, filepath.Join(dir, "trainer"),
		"--steps", strconv.Itoa(numSteps), "--model", "small", "--batch", "8", "--deterministic")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gorun: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	// Rank 0's lines of the second world, untagged.
	var lines []string
	second := false
	for _, l := range strings.Split(string(out), "\n") {
		l, ok := strings.CutPrefix(l, "[0] ")
		if !ok {
			continue
		}
		if strings.HasPrefix(l, "world ") {
			second = l == "world 1"
			continue
		}
		if second {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		t.Fatalf("no output from a second world:\n%s\nstderr:\n%s", out, stderr.String())
	}
	losses, params := parseOutput(t, strings.Join(lines, "\n"))
	checkAgainst(t, ref, losses, params)

	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Restarts int `json:"restarts"`
		Faults   []struct {
			Spec       string   `json:"spec"`
			InjectedAt *float64 `json:"injected_at_s"`
			Action     string   `json:"action"`
			DetectedBy string   `json:"detected_by"`
		} `json:"faults"`
		Outcome string `json:"outcome"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Restarts != 1 || rep.Outcome != "succeeded" || len(rep.Faults) != 2 {
		t.Fatalf("report:\n%s", b)
	}
	for _, f := range rep.Faults {
		if f.InjectedAt == nil || f.Action != "restarted" {
			t.Errorf("fault %s: injected %v, action %q; report:\n%s", f.Spec, f.InjectedAt, f.Action, b)
		}
	}
	if by := rep.Faults[1].DetectedBy; by != "rank 2 killed by SIGKILL" {
		t.Errorf("the kill was detected as %q", by)
	}
}
