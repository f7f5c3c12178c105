package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gorun-hpc/gorun/overlap"
)

// traceMain is `gorun trace merge -o OUT FILE...`: it merges the per-rank
// Chrome/Perfetto traces that a step runtime wrote (e.g. the trainer's
// --trace F writes F.rankK.json on every rank) into one file with one
// process per rank. The output is written to a temporary file beside OUT
// and renamed into place only when every input parsed, so a bad input
// leaves an existing OUT untouched.
func traceMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "merge" {
		fmt.Fprintln(stderr, "usage: gorun trace merge -o OUT.json RANK0.json RANK1.json ...")
		return exitUsage
	}
	fs := flag.NewFlagSet("gorun trace merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "write the merged trace to `FILE` (required)")
	if code, done := parseFlags(fs, args[1:], "gorun trace merge", stderr); done {
		return code
	}
	if *out == "" || fs.NArg() == 0 {
		fmt.Fprintln(stderr, "gorun trace merge: need -o OUT and at least one input trace")
		return exitUsage
	}
	traces := make([]overlap.Trace, 0, fs.NArg())
	for _, name := range fs.Args() {
		t, err := readTraceFile(name)
		if err != nil {
			fmt.Fprintf(stderr, "gorun trace merge: %v\n", err)
			return exitFailure
		}
		traces = append(traces, t)
	}
	if err := writeMerged(*out, traces); err != nil {
		fmt.Fprintf(stderr, "gorun trace merge: %v\n", err)
		return exitFailure
	}
	n := 0
	for _, t := range traces {
		n += len(t.TraceEvents)
	}
	fmt.Fprintf(stdout, "merged %d traces (%d events) into %s\n", len(traces), n, *out)
	return 0
}

func readTraceFile(name string) (overlap.Trace, error) {
	f, err := os.Open(name)
	if err != nil {
		return overlap.Trace{}, err
	}
	defer f.Close()
	t, err := overlap.ReadTrace(f)
	if err != nil {
		return t, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}

// writeMerged writes through a temporary file in OUT's directory so that a
// failure never leaves a truncated OUT behind.
func writeMerged(out string, traces []overlap.Trace) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := overlap.MergeTraces(tmp, traces...); err != nil {
		tmp.Close()
		return fmt.Errorf("%s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("%s: %w", out, err)
	}
	return os.Rename(tmp.Name(), out)
}
