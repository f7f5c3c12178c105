package launcher

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// The fault kinds beyond signals (kept apart from inject.go, which parses
// and schedules the signal kinds):
//
//	slow:rank=1:at=1s:for=5s[:duty=0.5][:period=200ms]  (or after-steps=N)
//	    the owning supervisor stops the rank (SIGSTOP) for duty of every
//	    period and lets it run (SIGCONT) for the rest, from at for for= (for
//	    ever without for=), and leaves it running at the end. This host has
//	    cgroup v1 only, so a CPU quota is not available; stopping a rank in
//	    short slices slows it the same way as seen from its peers.
//	drop:rank=1[:peer=2]:at=1s
//	delay:rank=1[:peer=2]:ms=50:at=1s[:for=2s]
//	corrupt:rank=1[:peer=2]:at=1s
//	partition:ranks=0-1:at=1s[:for=3s][:lease=4s]
//	partition:hosts=h2,h3:at=1s[:for=3s][:lease=4s]
//	    (each also with after-steps=N instead of at=: the fault starts in
//	    each rank it acts in once that rank reported step N)
//	    data-plane faults: they act inside gorun's transport in the ranks
//	    (internal/netfault, comm/netfault.go), armed through the environment
//	    (GORUN_NETFAULT, GORUN_NETFAULT_EPOCH = the job's start), so they
//	    work for any launch, local or across hosts. The supervisors still
//	    answer an injection at the fault's time (signal 0: nothing is sent),
//	    so the report says when it was due and whether the ranks were there.

// FaultSlow slows a rank by periodic SIGSTOP/SIGCONT.
const FaultSlow FaultKind = "slow"

// Slow's defaults: half the time stopped, in slices short enough that no
// lease (4 s gossip, the data plane's waits) mistakes a slice for a death.
const (
	defaultSlowDuty   = 0.5
	defaultSlowPeriod = 200 * time.Millisecond
	// minSlowPeriod: the supervisor toggles on its 20 ms tick.
	minSlowPeriod = 100 * time.Millisecond
)

func init() {
	faultKeys[FaultSlow] = struct{ required, optional []string }{[]string{"rank", "when"}, []string{"for", "duty", "period"}}
}

// parseNetFault parses a data-plane kind through internal/netfault,
// turning its error into the launcher's.
func parseNetFault(spec string) (Fault, error) {
	s, err := netfault.Parse(spec)
	if err != nil {
		var se *netfault.SpecError
		if errors.As(err, &se) {
			return Fault{}, &FaultSpecError{Spec: spec, Why: se.Why}
		}
		return Fault{}, &FaultSpecError{Spec: spec, Why: err.Error()}
	}
	return Fault{Spec: spec, Kind: FaultKind(s.Kind), Rank: max(s.Rank, 0), At: s.At, AfterSteps: s.AfterSteps, For: s.For, Net: &s}, nil
}

// parseChaosKey parses the keys only slow takes.
func parseChaosKey(f *Fault, k, v string) error {
	switch k {
	case "duty":
		d, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return errors.New("not a number")
		}
		if !(d > 0 && d < 1) {
			return errors.New("must be between 0 and 1, exclusive (the fraction of each period the rank is stopped)")
		}
		f.Duty = d
	case "period":
		d, err := parseFaultDuration(v)
		if err != nil {
			return err
		}
		if d < minSlowPeriod {
			return fmt.Errorf("must be at least %s (the supervisor toggles on a 20ms tick)", minSlowPeriod)
		}
		f.Period = d
	default:
		return fmt.Errorf("key %q is not handled", k)
	}
	return nil
}

// scheduleChaos turns a slow or data-plane fault into its injection.
func scheduleChaos(i int, f Fault, plan *Plan) (injection, error) {
	bad := func(format string, a ...any) (injection, error) {
		return injection{}, &FaultSpecError{Spec: f.Spec, Why: fmt.Sprintf(format, a...)}
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
	return injection{fault: i, kind: FaultSlow, at: f.At, ranks: []int{f.Rank}, host: plan.Ranks[f.Rank].Host,
		sig: syscall.SIGSTOP, cont: f.For, duty: duty, period: period, afterSteps: f.AfterSteps}, nil
}

// injectionAction is what the report says an injection does.
func injectionAction(in injection) string {
	switch {
	case in.kind == FaultSlow:
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
func netFaultEnv(faults []Fault, start time.Time, elapsed time.Duration, restart int) []string {
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

// slowing is a rank the supervisor slows: stopped for stop of every
// period until end (zero: until the rank exits).
type slowing struct {
	rank, pid, fault int
	stop, period     time.Duration
	end              time.Time
	stopped          bool
	next             time.Time // the next toggle
}

// startSlow takes over a slow injection for rank r (already sent SIGSTOP).
func (a *supervisor) startSlow(c supervisorCmd, rank, pid int, now time.Time) {
	s := slowing{rank: rank, pid: pid, fault: c.Fault, period: c.Period, stop: time.Duration(c.Duty * float64(c.Period)), stopped: true}
	s.next = now.Add(s.stop)
	if c.For > 0 {
		s.end = now.Add(c.For)
	}
	a.slows = append(a.slows, s)
}

// tickSlows toggles the slowed ranks that are due, and ends the slowings
// that are over (the rank is left running, answered by "fault-cont").
func (a *supervisor) tickSlows(now time.Time) {
	kept := a.slows[:0]
	for _, s := range a.slows {
		i, ok := a.byPID[s.pid]
		if !ok || !a.ranks[i].running {
			continue // exited: nothing to continue
		}
		if !s.end.IsZero() && !now.Before(s.end) {
			_ = syscall.Kill(-s.pid, syscall.SIGCONT)
			a.emit(supervisorEvent{Ev: "fault-cont", Rank: s.rank, PID: s.pid, Fault: s.fault})
			continue
		}
		if !now.Before(s.next) {
			if s.stopped {
				_ = syscall.Kill(-s.pid, syscall.SIGCONT)
				s.next = now.Add(s.period - s.stop)
			} else {
				_ = syscall.Kill(-s.pid, syscall.SIGSTOP)
				s.next = now.Add(s.stop)
			}
			s.stopped = !s.stopped
		}
		kept = append(kept, s)
	}
	a.slows = kept
}

// endSlows lets every slowed rank run: the job is being stopped, and a
// stopped rank would hold its SIGTERM until the grace period ran out.
func (a *supervisor) endSlows() {
	for _, s := range a.slows {
		if i, ok := a.byPID[s.pid]; ok && a.ranks[i].running {
			_ = syscall.Kill(-s.pid, syscall.SIGCONT)
		}
	}
	a.slows = nil
}

// isNetKind reports whether a spec's kind (its text up to the first
// colon) is a data-plane kind.
func isNetKind(spec string) bool {
	k, _, _ := strings.Cut(spec, ":")
	return netfault.IsKind(strings.TrimSpace(k))
}
