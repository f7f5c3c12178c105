package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestRealKillRestart: the whole path of a restart with real processes. A
// rank of a 4-rank trainer job is frozen from the start and killed 300 ms
// in; gorun stops the world and starts a new one (--max-restarts 1), and the
// new world's training ends with the losses and parameters of an
// uninterrupted run (without --checkpoint the new world trains from step 1;
// TestRealKillResume covers resuming). No process of the job outlives gorun (the launcher's
// own tests check that with a /proc scan; here gorun's exit after its
// supervisor reported "no descendant left" is what is relied on).
func TestRealKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	ref := reference(t, smallOptions())
	report := filepath.Join(t.TempDir(), "report.json")
	out, stderr := runWorlds(t, dir,
		[]string{"-np", "4", "--inject", "stop:rank=2:at=0s", "--inject", "kill:rank=2:at=300ms", "--max-restarts", "1", "--report", report},
		"--steps", strconv.Itoa(numSteps), "--model", "small", "--batch", "8", "--deterministic")
	lines := worldLines(string(out))["1"]
	if len(lines) == 0 {
		t.Fatalf("no output from a second world:\n%s\nstderr:\n%s", out, stderr)
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

// worldLines splits rank 0's tagged output by the "world N" marker lines
// the test's wrapper script prints: world number → its lines, untagged.
func worldLines(out string) map[string][]string {
	worlds := map[string][]string{}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		l, ok := strings.CutPrefix(l, "[0] ")
		if !ok {
			continue
		}
		if w, ok := strings.CutPrefix(l, "world "); ok {
			cur = w
			continue
		}
		worlds[cur] = append(worlds[cur], l)
	}
	return worlds
}

// TestRealKillResume: the checkpoint promise (a bit-exact resume), with real
// processes. Rank 1 is killed by gorun once it has reported step 7
// (--inject kill:rank=1:after-steps=7; the trainer checkpoints every 3
// steps); gorun starts a new world (--max-restarts 1), whose trainer
// resumes from the checkpoint of step 6 or later — not from scratch — and
// the steps of the first world before that checkpoint plus those of the
// second are the losses of an uninterrupted run, bit for bit, as are the
// final parameters. On 2 and 4 ranks, data parallel and sharded.
func TestRealKillResume(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	// The kill comes after step 7, and the first world must still be
	// training when it lands: the supervisor fires it on its next 20 ms
	// tick, and on a quiet machine 20 steps (0.6 ms each) ended first.
	const steps = 120
	ro := smallOptions()
	ro.steps = steps
	ref := reference(t, ro)
	for _, tc := range []struct {
		np   int
		mode string
	}{{2, "dp"}, {2, "sharded"}, {4, "dp"}, {4, "sharded"}} {
		t.Run(fmt.Sprintf("np%d-%s", tc.np, tc.mode), func(t *testing.T) {
			ckpt := t.TempDir()
			report := filepath.Join(t.TempDir(), "report.json")
			out, _ := runWorlds(t, dir,
				[]string{"-np", strconv.Itoa(tc.np), "--inject", "kill:rank=1:after-steps=7", "--max-restarts", "1", "--report", report},
				"--steps", strconv.Itoa(steps), "--model", "small", "--batch", "8", "--deterministic", "--mode", tc.mode,
				"--checkpoint", ckpt, "--checkpoint-every", "3")
			w := worldLines(string(out))
			first, _ := parseSteps(w["0"])
			second, resumed := parseSteps(w["1"])
			if resumed < 6 || resumed%3 != 0 || resumed > len(first) {
				t.Fatalf("the second world resumed from step %d, want a checkpoint of step 6 or later that the first world reached (it printed %d steps)\n%s", resumed, len(first), out)
			}
			if len(first) < 7 {
				t.Fatalf("the first world printed %d steps, but rank 1 was to be killed after step 7\n%s", len(first), out)
			}
			losses := append(first[:resumed:resumed], second...)
			_, params := parseOutput(t, strings.Join(w["1"], "\n"))
			checkAgainst(t, ref, losses, params)

			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatal(err)
			}
			var rep struct {
				Restarts int `json:"restarts"`
				Faults   []struct {
					InjectedAtStep int64  `json:"injected_at_step"`
					Action         string `json:"action"`
				} `json:"faults"`
			}
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Restarts != 1 || len(rep.Faults) != 1 || rep.Faults[0].InjectedAtStep < 7 || rep.Faults[0].Action != "restarted" {
				t.Fatalf("report:\n%s", b)
			}
		})
	}
}

// parseSteps reads a world's step lines and its "resumed from step K"
// line (0 when absent).
func parseSteps(lines []string) (losses []float32, resumed int) {
	for _, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 6 && f[0] == "step" && f[2] == "loss":
			v, err := strconv.ParseFloat(f[3], 32)
			if err == nil {
				losses = append(losses, float32(v))
			}
		case len(f) >= 4 && f[0] == "resumed" && f[2] == "step":
			resumed, _ = strconv.Atoi(f[3])
		}
	}
	return losses, resumed
}

// TestRealPreemptionNotice: gorun's checkpoint signal ahead of a fault.
// gorun sends SIGUSR1 (GORUN_CHECKPOINT_SIGNAL) 500 ms before the kill it
// injects at 1 s (--checkpoint-signal-before); the trainer, which
// checkpoints only on the signal here, agrees on a step and writes its
// checkpoint there; after the kill the new world resumes from exactly that
// step, and the run ends with the losses and parameter hash of an
// uninterrupted run, bit for bit.
func TestRealPreemptionNotice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	o := smallOptions()
	// The kill is due at 1 s and must land mid-run: 800 steps took 2-3 s
	// on a loaded machine but 0.34 s on a quiet one; 5000 take about 2 s
	// quiet (0.4 ms a step, 2 ranks, small model).
	o.steps = 5000
	ckpt := t.TempDir()
	report := filepath.Join(t.TempDir(), "report.json")
	out, stderr := runWorlds(t, dir,
		[]string{"-np", "2", "--inject", "kill:rank=1:at=1s", "--checkpoint-signal-before", "500ms", "--max-restarts", "1", "--report", report},
		"--steps", strconv.Itoa(o.steps), "--model", "small", "--batch", "8", "--deterministic", "--checkpoint", ckpt)
	w := worldLines(string(out))
	first, _ := parseSteps(w["0"])
	second, resumed := parseSteps(w["1"])
	want := fmt.Sprintf("checkpoint after step %d (signal)", resumed)
	if resumed == 0 || !slices.Contains(w["0"], want) {
		t.Fatalf("the second world resumed from step %d; the first world's lines hold no %q\nstderr:\n%s", resumed, want, stderr)
	}
	if len(first) >= o.steps {
		t.Fatalf("the first world finished before the kill (%d steps); the test needs a longer run", len(first))
	}
	// The reference is an uninterrupted run of the same binaries (an
	// in-process reference of 800 steps costs a minute under -race).
	refCmd := exec.Command(filepath.Join(dir, "gorun"), "-np", "2", "--timeout", "90s", filepath.Join(dir, "trainer"),
		"--steps", strconv.Itoa(o.steps), "--model", "small", "--batch", "8", "--deterministic")
	refOut, err := refCmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the uninterrupted run: %v\n%s", err, refOut)
	}
	refLosses, refParams := parseOutput(t, string(refOut))
	losses := append(first[:resumed:resumed], second...)
	_, params := parseOutput(t, strings.Join(w["1"], "\n"))
	if !sameLosses(losses, refLosses) || params != refParams {
		t.Fatalf("the resumed run's %d losses and parameters %016x differ from the uninterrupted run's %d and %016x", len(losses), params, len(refLosses), refParams)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		CheckpointSignals []struct {
			At  float64 `json:"at_s"`
			Why string  `json:"why"`
		} `json:"checkpoint_signals"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.CheckpointSignals) != 1 || !strings.HasPrefix(rep.CheckpointSignals[0].Why, "before fault 0") || rep.CheckpointSignals[0].At < 0.45 {
		t.Fatalf("report:\n%s", b)
	}
}

// runWorlds runs `gorun --tag-output --timeout 90s GORUNARGS... sh -c MARK
// trainer TRAINERARGS...`, where MARK prints "world N" (the restart
// count) before each world's trainer starts, so that worldLines can tell
// the worlds apart. It fails the test unless gorun exits 0 and returns
// gorun's stdout and stderr.
func runWorlds(t *testing.T, dir string, gorunArgs []string, trainerArgs ...string) ([]byte, string) {
	t.Helper()
	args := append([]string{"--tag-output", "--timeout", "90s"}, gorunArgs...)
	args = append(args, "/bin/sh", "-c", `echo "world $GORUN_RESTART_COUNT"; exec "$0" "$@"`, filepath.Join(dir, "trainer"))
	cmd := exec.Command(filepath.Join(dir, "gorun"), append(args, trainerArgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gorun: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	return out, stderr.String()
}
