package supervisor

import (
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// The supervisor's part of an injected slow (package launcher's
// inject_chaos.go schedules it): the rank is stopped for the duty of
// every period and continued for the rest, and left running at the end.

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
func (a *supervisor) startSlow(c wire.Cmd, rank, pid int, now time.Time) {
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
			a.emit(wire.Event{Ev: "fault-cont", Rank: s.rank, PID: s.pid, Fault: s.fault})
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
