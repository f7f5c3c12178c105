package launcher

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
	"github.com/gorun-hpc/gorun/launcher/fault"
)

// Fault injection (gorun --inject SPEC). The specs are parsed by package
// launcher/fault; this file is pure: it turns them, with a plan, into a
// schedule of concrete injections (schedule). Executing them is split
// between the job loop, which owns the clock and sends an "inject" command
// when one is due (jobloop.go), and the supervisor that owns the target
// rank, which sends the signal to the rank's process group and, for a stop
// with a duration, the SIGCONT after it (package launcher/supervisor).
// Everything that happened is kept in a Report (elastic.go). A fault fires once
// per job, so a job that restarts does not meet the same fault again; an
// after-steps fault is handed to the supervisors as soon as the world starts,
// and one whose step the world never reaches is reported missed.

// injection is one scheduled fault against a set of ranks.
type injection struct {
	// id is the injection's index in the job's schedule (and report).
	id int
	// fault is the index of the Fault it comes from.
	fault int
	kind  fault.Kind
	at    time.Duration
	ranks []int
	host  string
	sig   syscall.Signal
	// cont is how long after the stop the supervisor sends SIGCONT; 0 never.
	// For slow, how long the slowing lasts.
	cont time.Duration
	// duty and period drive slow (inject_chaos.go; fault.Slow).
	duty   float64
	period time.Duration
	// afterSteps, when positive, makes the injection wait in the
	// supervisor until a target rank reports this step (at is then 0: the
	// job loop hands it over as soon as the world runs).
	afterSteps int64
}

// maxRandomInjections bounds how many kills a random spec expands to.
const maxRandomInjections = 10000

// schedule checks faults against the plan (a rank must exist, a host must
// run ranks) and returns the injections in time order (ties keep the order
// the faults were given in). A random fault expands into kills up to
// horizon (at most maxRandomInjections): inter-arrival times are
// exponential with mean MTBF and ranks uniform, both drawn from a PCG
// seeded with Seed, so the same seed and world size give the same
// schedule.
func schedule(faults []fault.Fault, plan *Plan, horizon time.Duration) ([]injection, error) {
	var out []injection
	for i, f := range faults {
		bad := func(format string, a ...any) ([]injection, error) {
			return nil, &fault.SpecError{Spec: f.Spec, Why: fmt.Sprintf(format, a...)}
		}
		switch f.Kind {
		case fault.Kill, fault.Stop, fault.Cont:
			if f.Rank >= plan.WorldSize {
				return bad("rank %d does not exist (the job has ranks 0-%d)", f.Rank, plan.WorldSize-1)
			}
			inj := injection{fault: i, kind: f.Kind, at: f.At, ranks: []int{f.Rank}, host: plan.Ranks[f.Rank].Host, afterSteps: f.AfterSteps}
			switch f.Kind {
			case fault.Kill:
				inj.sig = f.Signal
			case fault.Stop:
				inj.sig, inj.cont = syscall.SIGSTOP, f.For
			case fault.Cont:
				inj.sig = syscall.SIGCONT
			}
			out = append(out, inj)
		case fault.KillHost:
			var names []string
			found := false
			for _, n := range plan.Nodes {
				names = append(names, n.Name)
				if n.Name == f.Host && n.Ranks > 0 {
					found = true
					inj := injection{fault: i, kind: f.Kind, at: f.At, host: n.Name, sig: f.Signal, afterSteps: f.AfterSteps}
					for r := n.FirstRank; r < n.FirstRank+n.Ranks; r++ {
						inj.ranks = append(inj.ranks, r)
					}
					out = append(out, inj)
					break
				}
			}
			if !found {
				return bad("host %q runs no rank of this job (its hosts: %s)", f.Host, strings.Join(names, ", "))
			}
		case fault.Slow, fault.Kind(netfault.Drop), fault.Kind(netfault.Delay), fault.Kind(netfault.Corrupt), fault.Kind(netfault.Partition):
			inj, err := scheduleChaos(i, f, plan)
			if err != nil {
				return nil, err
			}
			out = append(out, inj)
		case fault.Random:
			rng := rand.New(rand.NewPCG(f.Seed, 0x9e3779b97f4a7c15))
			at := time.Duration(0)
			for range maxRandomInjections {
				// Exponential inter-arrival: a memoryless failure process
				// with the given mean, as a constant failure rate implies.
				gap := time.Duration(rng.ExpFloat64() * float64(f.MTBF))
				if gap > horizon || at > horizon-gap || at+gap > math.MaxInt64/2 {
					break
				}
				at += gap
				r := rng.IntN(plan.WorldSize)
				out = append(out, injection{fault: i, kind: fault.Kill, at: at, ranks: []int{r}, host: plan.Ranks[r].Host, sig: f.Signal})
			}
		default:
			return bad("unknown kind %q", f.Kind)
		}
	}
	slices.SortStableFunc(out, func(a, b injection) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	for i := range out {
		out[i].id = i
	}
	return out, nil
}

// randomHorizon is how far a random fault's kills are planned when the job
// has no --timeout: longer than any job a fault test runs.
const randomHorizon = 7 * 24 * time.Hour
