package launcher

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
	"github.com/gorun-hpc/gorun/launcher/fault"
)

// The fault kinds beyond signals (their spellings are package
// launcher/fault's, chaos.go): slow, scheduled here and acted out by the
// supervisor that owns the rank (SIGSTOP for duty of every period, SIGCONT
// for the rest, the rank left running at the end), and the data-plane
// kinds (drop, delay, corrupt, partition), which act inside gorun's
// transport in the ranks (internal/netfault, comm/netfault.go), armed
// through the environment (netFaultEnv), so they work for any launch,
// local or across hosts. The supervisors still answer a data-plane
// injection at the fault's time (signal 0: nothing is sent), so the report
// says when it was due and whether the ranks were there.

// Slow's defaults: half the time stopped, in slices short enough that no
// lease (4 s gossip, the data plane's waits) mistakes a slice for a death.
const (
	defaultSlowDuty   = 0.5
	defaultSlowPeriod = 200 * time.Millisecond
)

// scheduleChaos turns a slow or data-plane fault into its injection.
func scheduleChaos(i int, f fault.Fault, plan *Plan) (injection, error) {
	bad := func(format string, a ...any) (injection, error) {
		return injection{}, &fault.SpecError{Spec: f.Spec, Why: fmt.Sprintf(format, a...)}
	}
	if f.Net != nil {
		if err := f.Net.Check(plan.WorldSize); err != nil {
			var se *netfault.SpecError
			if errors.As(err, &se) {
				return bad("%s", se.Why)
			}
			return bad("%v", err)
		}
		hosts := make([]string, len(plan.Ranks))
		for r, pr := range plan.Ranks {
			hosts[r] = pr.Host
		}
		if err := f.Net.CheckHosts(hosts); err != nil {
			var se *netfault.SpecError
			if errors.As(err, &se) {
				return bad("%s", se.Why)
			}
			return bad("%v", err)
		}
		ranks := f.Net.Ranks
		switch {
		case f.Net.Kind == netfault.Partition && len(f.Net.Hosts) > 0:
			// The ranks of those hosts in this world (the report's
			// targets; the ranks themselves match by host).
			ranks = nil
			for r, h := range hosts {
				if slices.Contains(f.Net.Hosts, h) {
					ranks = append(ranks, r)
				}
			}
		case f.Net.Kind != netfault.Partition:
			ranks = []int{f.Net.Rank}
		}
		// The supervisors answer at the fault's time, or once one of its
		// ranks reports the step (signal 0: nothing is sent), so the
		// report says when it began.
		return injection{fault: i, kind: f.Kind, at: f.At, ranks: ranks, host: plan.Ranks[ranks[0]].Host, afterSteps: f.AfterSteps}, nil
	}
	if f.Rank >= plan.WorldSize {
		return bad("rank %d does not exist (the job has ranks 0-%d)", f.Rank, plan.WorldSize-1)
	}
	duty, period := f.Duty, f.Period
	if duty == 0 {
		duty = defaultSlowDuty
	}
	if period == 0 {
		period = defaultSlowPeriod
	}
	return injection{fault: i, kind: fault.Slow, at: f.At, ranks: []int{f.Rank}, host: plan.Ranks[f.Rank].Host,
		sig: syscall.SIGSTOP, cont: f.For, duty: duty, period: period, afterSteps: f.AfterSteps}, nil
}

// injectionAction is what the report says an injection does.
func injectionAction(in injection) string {
	switch {
	case in.kind == fault.Slow:
		return fmt.Sprintf("SIGSTOP %.0f%% of every %s", in.duty*100, in.period)
	case netfault.IsKind(string(in.kind)):
		return "in the transport"
	}
	return unixSignalName(in.sig)
}

// netFaultEnv is the environment that arms the job's data-plane faults in
// world number restart, which starts elapsed after the job did: the faults
// not yet due (a fault fires once per job, so a restarted world does not
// meet it again), their times counted from the job's start. An
// after-steps fault is armed in the first world only: a restarted world
// counts its steps anew (or from a checkpoint) and would meet it again.
func netFaultEnv(faults []fault.Fault, start time.Time, elapsed time.Duration, restart int) []string {
	var specs []netfault.Spec
	for _, f := range faults {
		if f.Net == nil {
			continue
		}
		if (f.AfterSteps > 0 && restart == 0) || (f.AfterSteps == 0 && f.At >= elapsed) {
			specs = append(specs, *f.Net)
		}
	}
	if len(specs) == 0 {
		return nil
	}
	return []string{netfault.Env + "=" + netfault.Encode(specs), netfault.EpochEnv + "=" + strconv.FormatInt(start.UnixNano(), 10)}
}
