package stepgraph

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// Collective is the estimated life of one start/wait pair.
type Collective struct {
	Start, Wait string
	Group       string
	// Region is the wait's region: exposed time is spent there.
	Region string
	// Issue is when the plan reaches the start; Begin when the group's comm
	// stream takes it (after everything issued earlier on the group); End
	// when it completes.
	Issue, Begin, End time.Duration
	// Exposed is how long the wait blocked the compute stream.
	Exposed time.Duration
	// From lists the author's starts whose members travel here.
	From []string
}

// Hidden reports whether the collective moved data without blocking compute.
func (c *Collective) Hidden() bool { return c.Exposed == 0 }

// RegionCost sums a region's estimated times.
type RegionCost struct {
	Region string
	// Compute is the region's compute; Comm the duration of collectives
	// started in it; Exposed the time its waits blocked.
	Compute, Comm, Exposed time.Duration
}

// Estimate is the simulated timeline of a plan.
type Estimate struct {
	Step, Compute, Comm, Exposed time.Duration
	Collectives                  []Collective // in plan order of their starts
	Regions                      []RegionCost // in order of first appearance in the plan

	// busy[i] is when node i occupies the compute stream: a compute's run,
	// a wait's blocking (empty for starts and for waits that do not block).
	busy []span
	// coll[i] indexes Collectives for start node i, else -1.
	coll []int
}

type span struct{ b, e time.Duration }

// Simulate estimates a plan the way an executor that follows plan order runs
// it (an executor that issues starts earlier than the plan, as overlap may,
// can only hide more; the estimate is the plan's promise, not a forecast): one compute stream runs compute in order, each group has one comm
// stream that runs its collectives in issue order, a start is issued when
// the plan reaches it, and a wait blocks until its collective completes.
// Times come from m; everything is integer nanoseconds, so every rank gets
// the same numbers.
func Simulate(g *Graph, m buckets.Model) (*Estimate, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	ix, err := g.index()
	if err != nil {
		return nil, err
	}
	return g.simulate(ix, m), nil
}

func (g *Graph) simulate(ix *index, m buckets.Model) *Estimate {
	est := &Estimate{busy: make([]span, len(g.Nodes)), coll: make([]int, len(g.Nodes))}
	starts := 0
	for _, ss := range ix.byGroup {
		starts += len(ss)
	}
	est.Collectives = make([]Collective, 0, starts)
	regions := map[string]*RegionCost{}
	region := func(r string) *RegionCost {
		rc, ok := regions[r]
		if !ok {
			rc = &RegionCost{Region: r}
			regions[r] = rc
		}
		return rc
	}
	// free[g] is when group g's comm stream finishes what it was given;
	// now is the compute stream's clock.
	free := map[string]time.Duration{}
	var now time.Duration
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		est.coll[i] = -1
		switch nd.Kind {
		case Compute:
			est.busy[i] = span{now, now + nd.Cost}
			now += nd.Cost
			est.Compute += nd.Cost
			region(nd.Region).Compute += nd.Cost
		case Start:
			// A bucket is one collective: one latency for all members.
			d := m.Time(nd.Op, nd.Bytes(), g.groupSize(nd.Group))
			c := Collective{Start: nd.Name, Wait: g.Nodes[ix.waitOf[i]].Name, Group: nd.Group, Issue: now}
			c.Begin = max(now, free[nd.Group])
			c.End = c.Begin + d
			free[nd.Group] = c.End
			for _, mb := range nd.Members {
				f := mb.From
				if f == "" {
					f = nd.Name
				}
				if !slices.Contains(c.From, f) {
					c.From = append(c.From, f)
				}
			}
			est.coll[i] = len(est.Collectives)
			est.Collectives = append(est.Collectives, c)
			est.Comm += d
			region(nd.Region).Comm += d
		case Wait:
			// Validation guarantees the start came earlier, so its
			// collective is already in the table.
			c := &est.Collectives[est.coll[ix.startOf[i]]]
			c.Region = nd.Region
			// Completion is monotone in issue order on a group, so End
			// already covers everything issued before on it.
			if c.End > now {
				c.Exposed = c.End - now
				est.busy[i] = span{now, c.End}
				now = c.End
			}
			est.Exposed += c.Exposed
			region(nd.Region).Exposed += c.Exposed
		}
	}
	est.Step = now
	// Regions in order of first appearance in the plan: forward blocks in
	// order, then backward ones as they run.
	seen := map[string]bool{}
	for i := range g.Nodes {
		if r := g.Nodes[i].Region; !seen[r] {
			seen[r] = true
			est.Regions = append(est.Regions, *regions[r])
		}
	}
	return est
}

// String renders the estimate per region, the form golden files use.
func (e *Estimate) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "step %v compute %v comm %v exposed %v\n", e.Step, e.Compute, e.Comm, e.Exposed)
	for _, r := range e.Regions {
		fmt.Fprintf(&sb, "  %-16s compute %-8v comm %-8v exposed %v\n", dash(r.Region), r.Compute, r.Comm, r.Exposed)
	}
	return sb.String()
}

// ErrExposed is wrapped by *ExposedError.
var ErrExposed = errors.New("stepgraph: hidden collective exposed")

// ExposedError says a collective that a plan hid is exposed in a rewritten
// plan.
type ExposedError struct {
	// Collective is the author's start; Bucket the start carrying it now.
	Collective, Bucket, Region string
	Exposed                    time.Duration
}

func (e *ExposedError) Error() string {
	return fmt.Sprintf("%v: %q was hidden, now travels in %q whose wait in region %q blocks %v", ErrExposed, e.Collective, e.Bucket, dash(e.Region), e.Exposed)
}

// Unwrap lets errors.Is match ErrExposed.
func (e *ExposedError) Unwrap() error { return ErrExposed }

// Report compares the estimates of a plan and of its rewrite.
type Report struct {
	Before, After *Estimate
}

// String renders both estimates region by region.
func (r *Report) String() string {
	return "before " + r.Before.String() + "after " + r.After.String()
}

// Check estimates before and after and fails with an *ExposedError if a
// collective hidden in before (matched through Member.From) travels in a
// collective of after whose wait blocks. New collectives (a pass's re-gather)
// are reported in the estimate but are not errors. The report is returned
// with the error so the caller can show it.
func Check(before, after *Graph, m buckets.Model) (*Report, error) {
	eb, err := Simulate(before, m)
	if err != nil {
		return nil, err
	}
	ea, err := Simulate(after, m)
	if err != nil {
		return nil, err
	}
	rep := &Report{Before: eb, After: ea}
	return rep, firstExposed(eb, ea)
}

func firstExposed(before, after *Estimate) error {
	if bad := exposedNow(before, after, true); len(bad) > 0 {
		return bad[0]
	}
	return nil
}

// exposedNow lists the collectives of after that block while carrying an
// author's collective that before hid (only the first when first is set).
func exposedNow(before, after *Estimate, first bool) []*ExposedError {
	// An author's collective may travel in several collectives (chunks):
	// it was hidden if all of them were, and is exposed if any of them is.
	exposedBefore := map[string]bool{}
	for _, c := range before.Collectives {
		for _, f := range c.From {
			exposedBefore[f] = exposedBefore[f] || !c.Hidden()
		}
	}
	var out []*ExposedError
	for _, c := range after.Collectives {
		if c.Hidden() {
			continue
		}
		for _, f := range c.From {
			if was, ok := exposedBefore[f]; ok && !was {
				out = append(out, &ExposedError{Collective: f, Bucket: c.Start, Region: c.Region, Exposed: c.Exposed})
				if first {
					return out
				}
				break
			}
		}
	}
	return out
}
