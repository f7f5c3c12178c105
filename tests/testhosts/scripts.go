package testhosts

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// exitUnsupported is the scripts' exit code for "this machine cannot"
// (see lib.sh).
const exitUnsupported = 3

// UnsupportedError reports that this machine cannot provide the requested
// hosts: not root, or a tool is missing and cannot be installed. Require*
// turn it into a skip.
type UnsupportedError struct {
	// What is "netns" or "slurm".
	What string
	// Reason is the scripts' explanation.
	Reason string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("testhosts: %s not available here: %s", e.What, e.Reason)
}

// ScriptError reports a script that failed for another reason; Output
// holds what it wrote to stderr, which names the step.
type ScriptError struct {
	Script string
	Args   []string
	Err    error
	Output string
}

func (e *ScriptError) Error() string {
	return fmt.Sprintf("testhosts: %s %s: %v\n%s", e.Script, strings.Join(e.Args, " "), e.Err, e.Output)
}

func (e *ScriptError) Unwrap() error { return e.Err }

// Dir is the directory holding the scripts. They are found next to this
// source file, which is where `go test` runs from in this module.
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "tests/testhosts"
	}
	return filepath.Dir(file)
}

// runScript runs one of the scripts and returns its KEY=VALUE output.
func runScript(ctx context.Context, what, script string, args ...string) (map[string]string, error) {
	if os.Geteuid() != 0 {
		reason := "needs root to create network namespaces and run sshd in them"
		if what == "slurm" {
			reason = "needs root to run munged, slurmctld and slurmd"
		}
		return nil, &UnsupportedError{What: what, Reason: reason}
	}
	if _, err := exec.LookPath("bash"); err != nil {
		return nil, &UnsupportedError{What: what, Reason: "bash not found"}
	}
	path := filepath.Join(Dir(), script)
	cmd := exec.CommandContext(ctx, "bash", append([]string{path}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == exitUnsupported {
			return nil, &UnsupportedError{What: what, Reason: strings.TrimSpace(stderr.String())}
		}
		return nil, &ScriptError{Script: script, Args: args, Err: err, Output: stderr.String()}
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	return kv, nil
}

// skipOrFatal skips t for an *UnsupportedError and fails it otherwise.
func skipOrFatal(t testing.TB, err error) {
	t.Helper()
	var ue *UnsupportedError
	if errors.As(err, &ue) {
		t.Skipf("skipping: %v", err)
	}
	t.Fatal(err)
}
