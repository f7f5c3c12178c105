package supervisor

import (
	"fmt"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// A rank stopped before the world formed (SIGSTOP right after it started,
// a debugger's stop) has no attach stream yet, or a leader that counts a
// silent member as one that will come back: nothing in the runtime can
// tell its peers it froze, and without the supervisor the job waited for
// the formation timeout (120 s). The supervisor owns the rank process and
// can read its state: a rank that stays in state T (stopped by a signal)
// for longer than its lease is reported "frozen" and the job fails (or
// restarts) naming it.
//
// Why the lease, and a quarter more:
//   - The lease (GORUN_RDZV_LEASE, default 4 s) is how long gorun's
//     runtime tolerates a silent rank after formation; a stop longer than
//     it is a failure there too, so the rule is the same before and after
//     formation, and `stop:...:for=` shorter than the lease, or a slowed
//     rank's slices, stay harmless.
//   - A quarter more (freezeMargin): after formation the runtime's lease
//     finds the rank first and the survivors name it themselves, which
//     says more ("lost to its peers: rank 0 reported ..."); the
//     supervisor's verdict is the backstop for the cases the runtime
//     cannot see, and for programs that do not use gorun's runtime at all
//     (torch, MPI), which get the same bound.
//   - Only 'T': a traced process ('t', a debugger's breakpoint) is being
//     looked at on purpose.
//
// The check reads /proc/PID/stat of each running rank every
// freezeCheckEvery: one small read per rank, four times a second.

const (
	freezeCheckEvery = 250 * time.Millisecond
	// defaultLease is rendezvous.DefaultConfig().AttachLease (a test
	// holds the two equal; the launcher does not import the rendezvous).
	defaultLease = 4 * time.Second
)

// freezeMargin is how much longer than its lease a rank must stay stopped.
func freezeMargin(lease time.Duration) time.Duration { return lease + lease/4 }

// freezeAfter returns how long a rank with environment env may stay
// stopped: its lease (rankenv.RdzvLease, else the default) and the
// margin. A lease that does not parse is the rendezvous's error to
// report (the rank refuses to start with it); the default applies here.
func freezeAfter(env []string) time.Duration {
	lease := defaultLease
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, rankenv.RdzvLease+"="); ok {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				lease = d
			}
		}
	}
	return freezeMargin(lease)
}

// watchFrozen reports each running rank that has been in state T for its
// freezeAfter. It does nothing once the teardown began: gorun stops
// ranks itself then, and a stopped rank is no news.
func (a *supervisor) watchFrozen(now time.Time) {
	if a.killing || a.tearing || now.Sub(a.lastFreezeCheck) < freezeCheckEvery {
		return
	}
	a.lastFreezeCheck = now
	for i := range a.ranks {
		r := &a.ranks[i]
		if !r.running || r.frozenTold || r.freezeAfter <= 0 {
			continue
		}
		if procState(r.pid) != 'T' {
			r.stoppedSince = time.Time{}
			continue
		}
		if r.stoppedSince.IsZero() {
			r.stoppedSince = now
			continue
		}
		if d := now.Sub(r.stoppedSince); d >= r.freezeAfter {
			r.frozenTold, r.frozen = true, 'T'
			a.log.Warn().Int("rank", r.rank).Int("pid", r.pid).Dur("stopped", d).Msg("rank stopped past its lease: reported frozen")
			a.emit(wire.Event{Ev: "frozen", Rank: r.rank, PID: r.pid, Frozen: "T",
				Err: fmt.Sprintf("stopped (process state T) for %s, past its lease", d.Round(10*time.Millisecond))})
		}
	}
}
