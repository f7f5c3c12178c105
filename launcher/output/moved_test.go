package output

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A rank that moves to another host while its streams are read (a
// fault-tolerant rank started again on a spare host): its terminal lines
// are tagged with the host each line came from, and its one log holds
// the lines from both hosts with the move's line between them.
func TestJobMoved(t *testing.T) {
	dir := t.TempDir()
	var term lockedBuffer
	j, err := Open(Config{Stdout: &term, Stderr: io.Discard, Dir: dir, Ranks: 2})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	j.Add(0, "a", 1, bytes.NewReader([]byte("zero\n")))
	j.Add(1, "b", 1, pr)
	j.Start()
	if _, err := pw.Write([]byte("before\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !bytes.Contains([]byte(term.String()), []byte("before")); {
		if time.Now().After(deadline) {
			t.Fatalf("the line before the move never reached the terminal: %q", term.String())
		}
		time.Sleep(time.Millisecond)
	}
	j.Moved(1, "d", "--- moved to d ---\n")
	if _, err := pw.Write([]byte("after\n")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	j.Wait()
	if err := j.Finish(); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"[0,a] zero\n", "[1,b] before\n", "[1,d] after\n"} {
		if !bytes.Contains([]byte(term.String()), []byte(l)) {
			t.Errorf("terminal %q lacks %q", term.String(), l)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "rank.1.log"))
	if want := "before\n--- moved to d ---\nafter\n"; err != nil || string(b) != want {
		t.Errorf("rank.1.log = %q, %v; want %q", b, err, want)
	}
}
