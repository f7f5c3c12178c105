package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gorun-hpc/gorun/internal/plural"
	"github.com/gorun-hpc/gorun/launcher"
	"github.com/gorun-hpc/gorun/launcher/fault"
)

// readFaults parses --inject and --inject-file; a malformed spec is
// refused here, before anything starts.
func readFaults(o options) ([]fault.Fault, error) {
	var out []fault.Fault
	for _, s := range o.injects {
		f, err := fault.Parse(s)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	if o.injectFile != "" {
		fh, err := os.Open(o.injectFile)
		if err != nil {
			return nil, fmt.Errorf("--inject-file: %w", err)
		}
		defer fh.Close()
		fs, err := fault.ParseFile(fh, o.injectFile)
		if err != nil {
			return nil, err
		}
		out = append(out, fs...)
	}
	return out, nil
}

// writeFaultSummary prints, after the job, one line per injected fault and
// one per world: what was injected, when, what the job did.
func writeFaultSummary(w io.Writer, rep *launcher.Report) {
	restarts := fmt.Sprintf(", %d of %d restarts used", rep.Restarts, rep.MaxRestarts)
	if rep.FaultTolerance != nil {
		restarts = "" // the job was not restarted: its fault-tolerant line says what was replaced
	}
	fmt.Fprintf(w, "gorun: fault summary: %d %s injected%s\n", len(rep.Faults), plural.Noun(len(rep.Faults), "fault", "faults"), restarts)
	for _, f := range rep.Faults {
		var b strings.Builder
		fmt.Fprintf(&b, "gorun:   #%d %s (%s to ranks %v", f.ID, f.Spec, f.Signal, f.Ranks)
		if f.Host != "" {
			fmt.Fprintf(&b, " on %s", f.Host)
		}
		if f.AfterSteps > 0 {
			fmt.Fprintf(&b, ", due after step %d)", f.AfterSteps)
		} else {
			fmt.Fprintf(&b, ", due %.3fs)", f.PlannedAt)
		}
		switch {
		case f.InjectedAt != nil:
			fmt.Fprintf(&b, ": injected at %.3fs in world %d", *f.InjectedAt, *f.Restart)
			if f.InjectedAtStep > 0 {
				fmt.Fprintf(&b, " (at step %d)", f.InjectedAtStep)
			}
		case f.Missed != "":
			fmt.Fprintf(&b, ": not injected: %s", f.Missed)
		default:
			b.WriteString(": not injected: the job ended first")
		}
		if f.ContinuedAt != nil {
			fmt.Fprintf(&b, ", continued at %.3fs", *f.ContinuedAt)
		}
		if f.DetectedAt != nil {
			fmt.Fprintf(&b, "; detected %.3fs later (%s)", *f.TimeToDetect, f.DetectedBy)
		}
		if n := len(f.Noticed); n > 0 {
			fmt.Fprintf(&b, "; %d %s noticed, the first %.3fs after the injection", n, plural.Noun(n, "rank", "ranks"), f.Noticed[0].After)
		}
		if f.Action != "" {
			fmt.Fprintf(&b, "; %s", f.Action)
			if f.WorldEndedAt != nil && f.InjectedAt != nil {
				fmt.Fprintf(&b, " (world gone %.3fs after the injection", *f.WorldEndedAt-*f.InjectedAt)
				if f.RecoveredAt != nil {
					fmt.Fprintf(&b, ", every rank of the next world started %.3fs after that", *f.RecoveredAt-*f.WorldEndedAt)
				}
				if f.TimeToRecover != nil {
					fmt.Fprintf(&b, ", its first step %.3fs after the injection", *f.TimeToRecover)
				}
				b.WriteString(")")
			}
		}
		fmt.Fprintln(w, b.String())
	}
	for _, wr := range rep.Worlds {
		fmt.Fprintf(w, "gorun:   world %d (job %s, %d ranks): %.3fs-%.3fs: %s\n", wr.Restart, wr.JobID, wr.NP, wr.StartedAt, wr.EndedAt, wr.Result)
	}
	for _, r := range rep.Readmitted {
		fmt.Fprintf(w, "gorun:   host %s, lost before, answered again and was taken back into world %d at %.3fs\n", r.Host, r.Restart, r.At)
	}
}

// writeReport writes rep as indented JSON to path.
func writeReport(path string, rep *launcher.Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
