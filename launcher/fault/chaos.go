package fault

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// The fault kinds beyond signals (kept apart from fault.go, which parses
// the signal kinds):
//
//	slow:rank=1:at=1s:for=5s[:duty=0.5][:period=200ms]  (or after-steps=N)
//	    the owning supervisor stops the rank (SIGSTOP) for duty of every
//	    period and lets it run (SIGCONT) for the rest, from at for for= (for
//	    ever without for=), and leaves it running at the end. This host has
//	    cgroup v1 only, so a CPU quota is not available; stopping a rank in
//	    short slices slows it the same way as seen from its peers. Duty and
//	    Period are 0 when not given; the launcher fills in its defaults.
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
//	    work for any launch, local or across hosts. Fault.Net carries
//	    internal/netfault's parse of the spec.

// minSlowPeriod is the shortest period= slow accepts: the supervisor
// toggles a slowed rank on its 20 ms tick.
const minSlowPeriod = 100 * time.Millisecond

// parseNetFault parses a data-plane kind through internal/netfault,
// turning its error into a *SpecError.
func parseNetFault(spec string) (Fault, error) {
	s, err := netfault.Parse(spec)
	if err != nil {
		var se *netfault.SpecError
		if errors.As(err, &se) {
			return Fault{}, &SpecError{Spec: spec, Why: se.Why}
		}
		return Fault{}, &SpecError{Spec: spec, Why: err.Error()}
	}
	return Fault{Spec: spec, Kind: Kind(s.Kind), Rank: max(s.Rank, 0), At: s.At, AfterSteps: s.AfterSteps, For: s.For, Net: &s}, nil
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
		d, err := parseDuration(v)
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

// isNetKind reports whether a spec's kind (its text up to the first
// colon) is a data-plane kind.
func isNetKind(spec string) bool {
	k, _, _ := strings.Cut(spec, ":")
	return netfault.IsKind(strings.TrimSpace(k))
}
