package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// `gorun ... | head -1`: the reader of gorun's stdout exits after one
// line. gorun must not die of SIGPIPE (exit 141, no word, the ranks killed
// with it): it says once on stderr that stdout closed, discards the rest
// of the ranks' stdout, and the job runs to its own end and exit status.
func TestStdoutReaderGone(t *testing.T) {
	token := launchertest.NewToken(t.Name())
	cmd := gorunCmd(t, token, "flood:200000", nil, "-np", "2", "RANK")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = pw, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	// head -1: read one line, then go away.
	if _, err := bufio.NewReader(pr).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("gorun still runs 60 s after its stdout reader left\nstderr:\n%s", &stderr)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 0 {
		t.Errorf("gorun exited %d (%v), want the ranks' 0\nstderr:\n%s", code, err, &stderr)
	}
	if n := strings.Count(stderr.String(), "gorun: writing stdout"); n != 1 || !strings.Contains(stderr.String(), "discard") {
		t.Errorf("stderr has %d lines about stdout, want one line saying it is discarded:\n%s", n, &stderr)
	}
	if s := launchertest.Survivors(token); len(s) > 0 {
		t.Errorf("processes survive gorun: %v", s)
	}
}
