package output

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runJob opens a Job on cfg, feeds rank r the text texts[r] on stdout,
// and returns what Finish says.
func runJob(t *testing.T, cfg Config, texts ...string) error {
	t.Helper()
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for r, s := range texts {
		j.Add(r, "", 1, strings.NewReader(s))
	}
	j.Start()
	j.Wait()
	return j.Finish()
}

// A job with an output directory tags the terminal copy, writes one
// untagged log per rank, and a restarted world appends to the logs after
// a line naming the restart and the job.
func TestJobLogsAndRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	var term bytes.Buffer
	cfg := Config{Stdout: &term, Stderr: &term, Dir: dir, Ranks: 2, JobID: "j1"}
	if err := runJob(t, cfg, "a0\n", "a1\n"); err != nil {
		t.Fatal(err)
	}
	cfg.Restart, cfg.JobID = 1, "j2"
	if err := runJob(t, cfg, "b0\n", "b1\n"); err != nil {
		t.Fatal(err)
	}
	for r, want := range []string{"a0\n--- gorun: restart 1 (job j2) ---\nb0\n", "a1\n--- gorun: restart 1 (job j2) ---\nb1\n"} {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank.%d.log", r)))
		if err != nil || string(b) != want {
			t.Errorf("rank.%d.log = %q, %v; want %q", r, b, err, want)
		}
	}
	for _, l := range []string{"[0] a0\n", "[1] a1\n", "[0] b0\n", "[1] b1\n"} {
		if !strings.Contains(term.String(), l) {
			t.Errorf("terminal %q lacks %q", term.String(), l)
		}
	}
}

// Without a directory and without Tag, lines reach the terminal as the
// ranks wrote them.
func TestJobUntagged(t *testing.T) {
	var out, errOut bytes.Buffer
	j, err := Open(Config{Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	j.Add(0, "", 1, strings.NewReader("out\n"))
	j.Add(0, "", 2, strings.NewReader("err\n"))
	j.Start()
	j.Wait()
	j.Stderr().WriteLines([]byte("gorun: own line\n"))
	if err := j.Finish(); err != nil {
		t.Fatal(err)
	}
	if out.String() != "out\n" || errOut.String() != "err\ngorun: own line\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
	}
}

// A directory every user may write and that is not sticky is refused
// with a *DirError naming it; so is a symlink where OwnSubdir wants a
// directory.
func TestDirRefused(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Config{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Dir: open, Ranks: 1})
	var de *DirError
	if !errors.As(err, &de) || de.Path != open || !strings.Contains(err.Error(), "not sticky") {
		t.Errorf("Open(world-writable dir) = %v, want a *DirError naming it", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := OwnSubdir(link); !errors.As(err, &de) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("OwnSubdir(symlink) = %v, want a *DirError", err)
	}
}

// A log that cannot be written is said on stderr at once, and Finish
// returns a *LostError naming it.
func TestJobLostLog(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	dir := t.TempDir()
	if err := os.Symlink("/dev/full", filepath.Join(dir, "rank.0.log")); err != nil {
		t.Fatal(err)
	}
	var term bytes.Buffer
	err := runJob(t, Config{Stdout: &term, Stderr: &term, Dir: dir, Ranks: 1}, "x\n")
	var lost *LostError
	if !errors.As(err, &lost) || lost.Files != 1 || !strings.HasSuffix(lost.File, "rank.0.log") || lost.ExitCode() != 74 {
		t.Fatalf("Finish = %v, want a *LostError naming rank.0.log", err)
	}
	if !strings.Contains(term.String(), "rank.0.log: ") || !strings.Contains(term.String(), "the rest of that rank's log is lost") || !strings.Contains(term.String(), "[0] x\n") {
		t.Errorf("terminal %q: want the rank's line and the lost log said", term.String())
	}
}
