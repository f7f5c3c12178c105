package launcher

import (
	"errors"
	"slices"
	"time"

	"github.com/gorun-hpc/gorun/launcher/outcome"
)

// CauseReport is the causal record of how one world ended, as `--report`
// writes it (WorldReport.Cause): the culprit gorun's final line names, and
// the ranks that failed because of it counted apart from it. It is built
// from the world's error (the verdict) and the failures gorun saw with the
// time each reached it.
type CauseReport struct {
	// Kind is what happened to the culprit: "killed" (by a signal),
	// "exited" (nonzero code), "frozen" (stopped while its peers lost
	// it), "lost to peers" (its peers' runtimes lost it; it did not fail
	// in a way gorun saw: an unresponsive process), "link lost" (a rank
	// on another host lost it while it ran on: the network between
	// Host and ReporterHost failed), "host lost", "could not start", "mpi
	// abort", "mpi no finalize", "desync" (the ranks issued different
	// calls; Rank is the smaller side's, -1 when none can be named).
	Kind string `json:"kind"`
	// Rank, Host and PID locate the culprit; Rank is the first rank of a
	// lost host. Ranks is how many ranks it took down with it (a host's).
	Rank  int    `json:"rank"`
	Host  string `json:"host"`
	PID   int    `json:"pid,omitempty"`
	Ranks int    `json:"ranks,omitempty"`
	// Signal names the signal that ended it ("SIGKILL"); State is the
	// /proc state letter of a frozen rank ("T"). ExitCode is what gorun
	// exits with for it (128+signal, 255 for a lost host).
	Signal   string `json:"signal,omitempty"`
	State    string `json:"state,omitempty"`
	ExitCode int    `json:"exit_code"`
	// Why is the evidence in words: the lost host's error, the report of
	// the rank whose runtime named a frozen or lost culprit.
	Why          string `json:"why,omitempty"`
	ReportedBy   *int   `json:"reported_by,omitempty"`
	ReporterHost string `json:"reporter_host,omitempty"`
	// At is when gorun saw the culprit fail (its exit, its host's loss),
	// in seconds from the job's start; nil for a frozen or lost rank, which
	// never failed visibly: DetectedAt is then when its peers' first report
	// arrived.
	At         *float64 `json:"at_s,omitempty"`
	DetectedAt *float64 `json:"detected_at_s,omitempty"`
	// CollateralRanks are the ranks whose runtime reported failing because
	// of a lost peer, ascending; FirstCollateralAt is when the first of
	// their exits reached gorun. Stopped counts the ranks
	// gorun had to stop; AlsoFailed the other ranks that failed on their
	// own.
	CollateralRanks   []int    `json:"collateral_ranks"`
	FirstCollateralAt *float64 `json:"first_collateral_at_s,omitempty"`
	Stopped           int      `json:"stopped"`
	AlsoFailed        int      `json:"also_failed,omitempty"`
}

// seenFailure is one failure with the time it reached gorun.
type seenFailure struct {
	failure
	at time.Time
}

// saw records failures as they reach the job loop, for the cause record.
func (w *worldRun) saw(fs []failure, t time.Time) {
	if w == nil {
		return
	}
	for _, f := range fs {
		w.seen = append(w.seen, seenFailure{f, t})
	}
}

// cause builds the world's causal record from the verdict err; nil when
// err names no culprit (success, a timeout, a signal, a launch error).
func (w *worldRun) cause(err error) *CauseReport {
	if w == nil || err == nil {
		return nil
	}
	c := &CauseReport{CollateralRanks: []int{}}
	var (
		re *outcome.RankExitError
		ce *outcome.CollateralError
		he *outcome.HostLostError
		se *outcome.StartError
		me *outcome.MPIError
		fe *outcome.FrozenError
	)
	switch {
	case errors.As(err, &re):
		c.Kind, c.Rank, c.Host, c.PID, c.ExitCode = "exited", re.Rank, re.Host, re.PID, re.ExitCode()
		if re.Signal != 0 {
			c.Kind, c.Signal = "killed", unixSignalName(re.Signal)
		}
		c.Stopped, c.AlsoFailed = re.Stopped, re.AlsoFailed
	case errors.As(err, &ce) && ce.Desync:
		// Rank is the smaller side's, -1 when no rank can be named alone.
		c.Kind, c.Rank, c.Host, c.PID, c.ExitCode = "desync", ce.Blame, ce.BlameHost, ce.BlamePID, ce.ExitCode()
		c.Why, c.ReportedBy, c.ReporterHost, c.Stopped = ce.Why, ptr(ce.ReportedBy), ce.ReporterHost, ce.Stopped
	case errors.As(err, &ce):
		if ce.Blame < 0 {
			return nil // the runtimes could not say whom they lost
		}
		c.Kind, c.Rank, c.Host, c.PID, c.ExitCode = "lost to peers", ce.Blame, ce.BlameHost, ce.BlamePID, ce.ExitCode()
		switch {
		case ce.Frozen != "":
			c.Kind, c.State = "frozen", ce.Frozen
		case ce.Link:
			c.Kind = "link lost"
		}
		c.Why, c.ReportedBy, c.ReporterHost, c.Stopped = ce.Why, ptr(ce.ReportedBy), ce.ReporterHost, ce.Stopped
	case errors.As(err, &fe):
		c.Kind, c.Rank, c.Host, c.PID, c.State, c.ExitCode = "frozen", fe.Rank, fe.Host, fe.PID, fe.State, fe.ExitCode()
		c.Why, c.Stopped, c.AlsoFailed = fe.Why, fe.Stopped, fe.AlsoFailed
	case errors.As(err, &he):
		c.Kind, c.Rank, c.Host, c.Ranks, c.ExitCode = "host lost", he.FirstRank, he.Host, he.Ranks, he.ExitCode()
		c.Why, c.Stopped = he.Err.Error(), he.Stopped
	case errors.As(err, &se):
		c.Kind, c.Rank, c.Host, c.ExitCode, c.Why, c.Stopped = "could not start", se.Rank, se.Host, se.ExitCode(), se.Err.Error(), se.Stopped
	case errors.As(err, &me):
		c.Kind, c.Rank, c.Host, c.PID, c.ExitCode, c.Stopped = "mpi no finalize", me.Rank, me.Host, me.PID, me.ExitCode(), me.Stopped
		if me.Aborted {
			c.Kind, c.Why = "mpi abort", me.Message
		}
	default:
		return nil
	}
	for _, f := range w.seen {
		at := w.rep.since(f.at)
		if f.collateral {
			c.CollateralRanks = append(c.CollateralRanks, f.rank)
			if c.FirstCollateralAt == nil {
				c.FirstCollateralAt = ptr(at)
			}
			continue
		}
		if f.rank == c.Rank && c.At == nil {
			c.At = ptr(at)
		}
	}
	if c.At == nil {
		c.DetectedAt = c.FirstCollateralAt
	} else {
		c.DetectedAt = c.At
	}
	slices.Sort(c.CollateralRanks)
	return c
}
