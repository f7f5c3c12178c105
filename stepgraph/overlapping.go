package stepgraph

import (
	"cmp"
	"slices"

	"github.com/gorun-hpc/gorun/buckets"
)

// BucketOverlap is overlap-preserving bucketing across regions. It first
// simulates the plan to learn, for each collective, when it is on the wire
// and which nodes keep the compute stream busy meanwhile (the compute that
// hides it, and waits of other collectives that block meanwhile), plus the
// compute the author named in HiddenBy. Those give the implicit edges
// start → hiding node → wait; with the FIFO chain of each group they decide
// which merges are legal (see fits): a merged start and wait act as one node
// carrying the union of the members' edges, so a merge is refused if it
// would close a cycle, start a member after a node that hid it, or wait for a
// member before a node it was hidden behind.
//
// Only neighbours in a group's issue order with the same op, dtype and
// direction merge, and only hidden with hidden or exposed with exposed (a
// hidden collective in an exposed bucket would be exposed). Collectives are
// visited largest exposure first, since merging exposed collectives is what
// saves time (one latency each); an exposed bucket grows up to cfg.Cap(), a
// hidden one only up to cfg.Min() (past that, merging hidden work gains
// nothing visible). Each collective gets at most cfg.Limit() merge attempts,
// so the pass costs one simulation, one sort and O(n·limit) checks. A
// collective whose copies cost more than the merge saves
// (buckets.Model.MergePays) joins no bucket.
//
// The result is checked against the input (see guard): no hidden collective
// becomes exposed and the total exposed time does not grow.
func BucketOverlap(g *Graph, cfg buckets.Config) (*Graph, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ix, err := g.index()
	if err != nil {
		return nil, err
	}
	out, _, err := g.bucketOverlap(ix, cfg)
	return out, err
}

// bucketOverlap is BucketOverlap of a graph already indexed (ix) under a
// valid config; it also returns its result's index.
func (g *Graph) bucketOverlap(ix *index, cfg buckets.Config) (*Graph, *index, error) {
	// One simulation of the input decides everything below: hiding sets
	// and exposure are properties of the plan the author wrote, and merges
	// are judged against it, not against a moving target.
	est := g.simulate(ix, cfg.Model)
	hlo, hhi := g.hiding(ix, est)
	capBytes, minBytes, limit := cfg.Cap(), cfg.Min(), cfg.Limit()

	// Every start is an element of its group's list; runs are intervals of
	// that list, and rs[k] is the run holding element k (runs share the
	// pointer, so growing one updates every member's view).
	type elem struct {
		group string
		k     int // index in the group's start list
		pos   int
	}
	var order []elem
	runs := map[string][]*run{} // per group, per element: its run
	for _, gr := range sortedGroups(ix) {
		starts := ix.byGroup[gr]
		rs := make([]*run, len(starts))
		for k, s := range starts {
			c := &est.Collectives[est.coll[s]]
			rs[k] = &run{lo: k, hi: k, bytes: g.Nodes[s].Bytes(), maxStart: s, minWait: ix.waitOf[s],
				minHide: hlo[s], maxHide: hhi[s], exposed: int64(c.Exposed), hidden: c.Hidden(),
				solo: !g.pays(&g.Nodes[s], cfg.Model)}
			order = append(order, elem{gr, k, s})
		}
		runs[gr] = rs
	}
	// Largest exposure first; ties in plan order, so every rank agrees.
	slices.SortStableFunc(order, func(a, b elem) int {
		ea, eb := runs[a.group][a.k].exposed, runs[b.group][b.k].exposed
		if ea != eb {
			return cmp.Compare(eb, ea)
		}
		return cmp.Compare(a.pos, b.pos)
	})
	for _, e := range order {
		rs, starts := runs[e.group], ix.byGroup[e.group]
		for try := 0; try < limit; try++ {
			r := rs[e.k]
			target := minBytes
			if !r.hidden {
				target = capBytes
			}
			if r.bytes >= target || r.solo {
				break
			}
			// A neighbour run may join if it is the same kind of bucket,
			// fits the cap and keeps every member's hiding (see fits).
			ok := func(k int) *run {
				if k < 0 || k >= len(rs) {
					return nil
				}
				o := rs[k]
				if o.hidden != r.hidden || r.bytes+o.bytes > capBytes ||
					!sameKind(&g.Nodes[starts[r.lo]], &g.Nodes[starts[o.lo]]) || !fits(r, o) {
					return nil
				}
				return o
			}
			// Prefer the neighbour that blocks longer: that is where the
			// saved latency shows; ties go left, deterministically.
			left, right := ok(r.lo-1), ok(r.hi+1)
			pick := left
			if pick == nil || (right != nil && right.exposed > left.exposed) {
				pick = right
			}
			if pick == nil {
				break
			}
			r.absorb(pick)
			for k := pick.lo; k <= pick.hi; k++ {
				rs[k] = r
			}
		}
	}
	// Read the runs back in issue order: the buckets of the plan.
	var bkts [][]int
	for _, gr := range sortedGroups(ix) {
		rs, starts := runs[gr], ix.byGroup[gr]
		for k := 0; k < len(rs); k = rs[k].hi + 1 {
			bkts = append(bkts, slices.Clone(starts[rs[k].lo:rs[k].hi+1]))
		}
	}
	return g.guard(ix, cfg.Model, est, bkts)
}
