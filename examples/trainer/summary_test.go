package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The summary's means leave out the run's first step; the summary says so
// and names the steps it measured.
func TestMeasuredSteps(t *testing.T) {
	for _, c := range []struct {
		first, steps int
		want         string
	}{
		{0, 1, "step 1"},
		{0, 2, "step 2; step 1 warms up"},
		{0, 20, "steps 2-20; step 1 warms up"},
		{10, 20, "steps 12-20; step 11 warms up"},
		{19, 20, "no step measured: step 20 warms up"},
	} {
		if got := measuredSteps(c.first, c.steps); got != c.want {
			t.Errorf("measuredSteps(%d, %d) = %q, want %q", c.first, c.steps, got, c.want)
		}
	}
}

// One injected kill under gorun prints one merged table of the survivors'
// flight records, and each survivor's log does not repeat its own records
// (three ranks times sixteen records before the table).
func TestKillPrintsOneFlightTable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	cmd := exec.Command(filepath.Join(dir, "gorun"), "-np", "4", "--timeout", "90s",
		"--inject", "kill:rank=2:after-steps=3", filepath.Join(dir, "trainer"), "--steps", "200", "--model", "small", "--batch", "8")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 137 {
		t.Fatalf("gorun: %v, want exit 137 (rank 2 SIGKILLed)\n%s", err, out)
	}
	if n := strings.Count(string(out), "gorun: flight records"); n != 1 {
		t.Errorf("%d merged flight tables, want 1:\n%s", n, out)
	}
	if n := strings.Count(string(out), "flight recorder (latest last)"); n != 0 {
		t.Errorf("the ranks logged their own flight records %d times besides gorun's table:\n%s", n, out)
	}
	// gorun's log lines and the ranks' carry one clock: 00:20:22.568.
	logLine := regexp.MustCompile(`^(\S+) (WRN|ERR) `)
	clock := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3}$`)
	logged := 0
	for _, l := range strings.Split(string(out), "\n") {
		if m := logLine.FindStringSubmatch(l); m != nil {
			logged++
			if !clock.MatchString(m[1]) {
				t.Errorf("log line without the shared clock format: %q", l)
			}
		}
	}
	if logged < 2 {
		t.Errorf("%d log lines, want gorun's and the ranks' warnings:\n%s", logged, out)
	}
}
