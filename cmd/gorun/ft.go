package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/gorun-hpc/gorun/internal/plural"
	"github.com/gorun-hpc/gorun/launcher"
)

// writeFTSummary prints, after a --fault-tolerant job, one line for the
// job's quorum and one per failure: when, what gorun did, how long the
// replacement took to heal.
func writeFTSummary(w io.Writer, r *launcher.FTReport) {
	q := r.Quorum
	// A lost host is one failure of the budget, whatever its ranks.
	spent := len(r.LostHosts)
	for _, f := range r.Failures {
		if f.Host == "" {
			spent++
		}
	}
	fmt.Fprintf(w, "gorun: fault-tolerant: %d %s of a budget of %d; %d committed steps (up to step %d), %d uncommitted, %d %s, %d %s\n",
		spent, plural.Noun(spent, "failure", "failures"), r.MaxFailures, q.Commits, q.MaxStep,
		r.UncommittedSteps, len(q.Quorums), plural.Noun(len(q.Quorums), "quorum id", "quorum ids"),
		len(q.Heals), plural.Noun(len(q.Heals), "heal", "heals"))
	for _, f := range r.Failures {
		var b strings.Builder
		fmt.Fprintf(&b, "gorun:   rank %d (incarnation %d, pid %d) ", f.Rank, f.Incarnation, f.PID)
		if f.Host != "" {
			fmt.Fprintf(&b, "lost with host %s", f.Host)
		} else if f.Signal != "" {
			fmt.Fprintf(&b, "killed by %s", f.Signal)
		} else {
			fmt.Fprintf(&b, "exited with code %d", f.Code)
		}
		fmt.Fprintf(&b, " at %.3fs: %s", f.At, f.Action)
		if f.ReplacedAt != nil {
			fmt.Fprintf(&b, ", replacement started %.3fs later", *f.ReplacedAt-f.At)
		}
		if f.TimeToHeal != nil {
			fmt.Fprintf(&b, ", healed %.3fs after the failure", *f.TimeToHeal)
			if f.JoinedAfterStart != nil {
				fmt.Fprintf(&b, " (%.3fs after its start)", *f.JoinedAfterStart)
			}
		} else if f.FoundFinished {
			b.WriteString(", which found the job finished (the others had left: nothing to heal into) and exited")
		} else if strings.HasPrefix(f.Action, "replaced") {
			b.WriteString(", never healed")
		}
		fmt.Fprintln(w, b.String())
	}
	for _, h := range r.LostHosts {
		fmt.Fprintf(w, "gorun:   host %s lost at %.3fs (%s) at step %d, %d uncommitted: %s", h.Host, h.At, h.Why, h.Step, h.Uncommitted, h.Action)
		if len(h.Retired) > 0 {
			fmt.Fprintf(w, "; retired ranks %v", h.Retired)
		}
		if len(h.Participants) > 0 {
			fmt.Fprintf(w, "; the next quorum's participants %v", h.Participants)
		}
		fmt.Fprintln(w)
	}
	for _, s := range r.LostSpares {
		fmt.Fprintf(w, "gorun:   spare host %s lost while idle at %.3fs (%s): no longer offered", s.Host, s.At, s.Why)
		if len(s.SparesLeft) == 0 {
			fmt.Fprintln(w, "; no spare host was left after it")
		} else {
			fmt.Fprintf(w, "; spare hosts left %v\n", s.SparesLeft)
		}
	}
	if r.Exhausted != "" {
		fmt.Fprintf(w, "gorun:   the job was stopped: %s\n", r.Exhausted)
	}
}
