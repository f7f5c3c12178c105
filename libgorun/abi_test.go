//go:build cgo

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// abiBuild holds the artifacts every ABI test runs: the shared library, a C
// rank program linked against it, and the gorun launcher.
type abiBuild struct{ gorun, prog string }

// buildABI compiles libgorun.so, testdata/abi_test.c against gorun.h, and
// gorun itself, into a temporary directory.
func buildABI(t *testing.T) abiBuild {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the shared library and runs it under gorun")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to compile the C test")
	}
	dir := t.TempDir()
	run := func(name string, args ...string) {
		cmd := exec.Command(name, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run(goTool, "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libgorun.so"), ".")
	run(goTool, "build", "-o", filepath.Join(dir, "gorun"), "../cmd/gorun")
	prog := filepath.Join(dir, "abi_test")
	run(cc, "-O1", "-Wall", "-Werror", "-I.", "-o", prog, "testdata/abi_test.c",
		"-L"+dir, "-lgorun", "-Wl,-rpath,"+dir)
	return abiBuild{gorun: filepath.Join(dir, "gorun"), prog: prog}
}

// launch runs the C program under gorun on n ranks and returns its output
// and exit code.
func (b abiBuild) launch(t *testing.T, n int, mode string) (string, int) {
	t.Helper()
	cmd := exec.Command(b.gorun, "-np", strconv.Itoa(n), "--timeout", "60s", b.prog, mode)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gorun: %v", err)
	}
	return string(out), code
}

// TestABIFromC runs every collective, async requests, subgroups and bad
// arguments from C on 1 to 4 ranks (3 in deterministic mode).
func TestABIFromC(t *testing.T) {
	b := buildABI(t)
	for _, tc := range []struct {
		n    int
		mode string
	}{{1, "all"}, {2, "all"}, {3, "det"}, {4, "all"}} {
		t.Run(fmt.Sprintf("np%d-%s", tc.n, tc.mode), func(t *testing.T) {
			out, code := b.launch(t, tc.n, tc.mode)
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			for r := range tc.n {
				if !strings.Contains(out, fmt.Sprintf("abi_test rank %d: ok", r)) {
					t.Errorf("rank %d did not finish:\n%s", r, out)
				}
			}
		})
	}

	// A SIGKILLed rank: every survivor's next call fails within seconds
	// with GORUN_ERR_PEER_LOST naming the dead rank, as text and number.
	t.Run("killed-rank", func(t *testing.T) {
		out, code := b.launch(t, 3, "kill")
		if code != 128+9 {
			t.Errorf("gorun exit %d, want %d (the killed rank's)", code, 128+9)
		}
		re := regexp.MustCompile(`abi_test rank (\d): error after ([0-9.]+)s: GORUN_ERR_PEER_LOST \(rank 2\): .*rank 2\b`)
		got := re.FindAllStringSubmatch(out, -1)
		if len(got) != 2 {
			t.Fatalf("want both survivors to report rank 2 lost, got %d:\n%s", len(got), out)
		}
		for _, m := range got {
			if s, _ := strconv.ParseFloat(m[2], 64); s > 5 {
				t.Errorf("rank %s noticed after %.1fs, want ≤ 5s", m[1], s)
			}
		}
	})

	// Step reports from C: gorun kills rank 1 once it has reported step
	// 3 (--inject kill:rank=1:after-steps=3), not before and not much
	// later.
	t.Run("report-step", func(t *testing.T) {
		cmd := exec.Command(b.gorun, "-np", "2", "--timeout", "60s", "--inject", "kill:rank=1:after-steps=3", b.prog, "steps")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+9 {
			t.Fatalf("gorun: %v, want rank 1's SIGKILL\n%s", err, out)
		}
		last := 0
		for _, m := range regexp.MustCompile(`(?m)^abi_test rank 1: step (\d+)$`).FindAllStringSubmatch(string(out), -1) {
			last, _ = strconv.Atoi(m[1])
		}
		if last < 3 || last > 8 {
			t.Fatalf("rank 1 printed up to step %d, want it killed right after step 3:\n%s", last, out)
		}
	})

	// A desync: every rank gets GORUN_ERR_DESYNC naming both calls.
	t.Run("desync", func(t *testing.T) {
		out, code := b.launch(t, 3, "desync")
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		for r := range 3 {
			re := regexp.MustCompile(fmt.Sprintf(`abi_test rank %d: GORUN_ERR_DESYNC \(rank \d\): .*Broadcast.*AllReduce|abi_test rank %d: GORUN_ERR_DESYNC \(rank \d\): .*AllReduce.*Broadcast`, r, r))
			if !re.MatchString(out) {
				t.Errorf("rank %d: no desync error naming both calls:\n%s", r, out)
			}
		}
	})
}
