package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/overlap"
)

func writeTrace(t *testing.T, path string, tr overlap.Trace) {
	t.Helper()
	var b bytes.Buffer
	if err := overlap.MergeTraces(&b, tr); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTraceMerge(t *testing.T) {
	dir := t.TempDir()
	r0, r1 := filepath.Join(dir, "t.rank0.json"), filepath.Join(dir, "t.rank1.json")
	writeTrace(t, r0, overlap.Trace{TraceEvents: []overlap.Event{
		{Name: "fwd", Ph: "X", TS: 30, PID: 0}, {Name: "bwd", Ph: "X", TS: 10, PID: 0}}})
	writeTrace(t, r1, overlap.Trace{TraceEvents: []overlap.Event{{Name: "fwd", Ph: "X", TS: 20, PID: 1}}})
	out := filepath.Join(dir, "merged.json")

	var stdout, stderr bytes.Buffer
	if code := run([]string{"trace", "merge", "-o", out, r0, r1}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := overlap.ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	var order []float64
	pids := map[int]bool{}
	for _, e := range got.TraceEvents {
		order = append(order, e.TS)
		pids[e.PID] = true
	}
	if len(order) != 3 || order[0] != 10 || order[1] != 20 || order[2] != 30 || !pids[0] || !pids[1] {
		t.Fatalf("merged events %+v, want 3 events of ranks 0 and 1 in time order", got.TraceEvents)
	}
	if !strings.Contains(stdout.String(), "merged 2 traces (3 events)") {
		t.Fatalf("stdout %q", stdout.String())
	}
}

// A broken input names the file and leaves an existing output untouched.
func TestTraceMergeBadInputLosesNothing(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "merged.json")
	if err := os.WriteFile(out, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"trace", "merge", "-o", out, bad}, nil, &stdout, &stderr); code != exitFailure {
		t.Fatalf("exit %d, want %d", code, exitFailure)
	}
	if !strings.Contains(stderr.String(), bad) {
		t.Fatalf("stderr %q does not name %s", stderr.String(), bad)
	}
	if b, _ := os.ReadFile(out); string(b) != "keep me" {
		t.Fatalf("output was changed to %q", b)
	}
	if code := run([]string{"trace", "merge", bad}, nil, &stdout, &stderr); code != exitUsage {
		t.Fatalf("missing -o: exit %d, want %d", code, exitUsage)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
}
