package stepgraph

import (
	"cmp"
	"slices"
	"sort"
	"strings"

	"github.com/gorun-hpc/gorun/buckets"
)

// This file holds what the two bucketing passes share: runs of starts that
// are consecutive on one group become one bucket whose start takes the place
// of the run's last start and whose wait takes the place of its first wait.
//
// Why those places are always legal when the run's last start precedes its
// first wait: nothing between two starts of a run depends on the earlier one
// (its wait is later, and no other start of the group lies between them,
// since the run is consecutive in issue order), and nothing between the first
// and the last wait is needed by the later waits (a wait depends only on its
// start and on earlier starts of its group). Merging consecutive starts only
// also keeps the group's FIFO chain acyclic: merging around another start of
// the group would make the merged node both before and after it.

// run is a bucket being planned: an interval [lo, hi] of one group's starts
// in issue order, with the bounds that decide whether it may grow.
type run struct {
	lo, hi   int // indices into the group's start list
	bytes    int64
	maxStart int // plan position of the latest start
	minWait  int // plan position of the earliest wait
	// minHide and maxHide bound the nodes that hide any member: the merged
	// start must come before all of them and the merged wait after.
	minHide, maxHide int
	exposed          int64 // sum of members' exposed ns
	hidden           bool  // every member hidden
	// solo: a collective whose pack and scatter copies would cost more
	// than the latency a merge saves (buckets.Model.MergePays); it stays
	// a bucket of one, running on the program's own buffers.
	solo bool
}

func (r *run) absorb(o *run) {
	r.lo, r.hi = min(r.lo, o.lo), max(r.hi, o.hi)
	r.bytes += o.bytes
	r.maxStart = max(r.maxStart, o.maxStart)
	r.minWait = min(r.minWait, o.minWait)
	r.minHide = min(r.minHide, o.minHide)
	r.maxHide = max(r.maxHide, o.maxHide)
	r.exposed += o.exposed
	r.hidden = r.hidden && o.hidden
}

// fits reports whether r and o may form one bucket without closing a cycle,
// starting a member after compute that hid it, or waiting for a member before
// compute it was hidden behind.
func fits(r, o *run) bool {
	if r.solo || o.solo {
		return false
	}
	s, w := max(r.maxStart, o.maxStart), min(r.minWait, o.minWait)
	return s < w && s < min(r.minHide, o.minHide) && w > max(r.maxHide, o.maxHide)
}

// pays reports whether start node nd gains by joining a bucket under m.
func (g *Graph) pays(nd *Node, m buckets.Model) bool {
	return m.MergePays(nd.Op, nd.Bytes(), g.groupSize(nd.Group))
}

// sameKind reports whether two starts may share a fused buffer and a call.
// Op, group and dtype are what one call can carry; direction is required too
// so that forward and backward are planned independently (a bucket spanning
// the loss would tie the first backward collective to the last forward one).
func sameKind(a, b *Node) bool {
	return a.Op == b.Op && a.Group == b.Group && a.DType == b.DType && a.Dir == b.Dir
}

// mergeName joins the names of a bucket's first and last members, dropping
// what earlier merges put between them ("a..b" + "c..d" → "a..d").
func mergeName(first, last string) string {
	f, _, _ := strings.Cut(first, "..")
	l := last
	if i := strings.LastIndex(last, ".."); i >= 0 {
		l = last[i+2:]
	}
	return f + ".." + l
}

// materialize rewrites g so that each group of starts in buckets (plan
// positions, in issue order) becomes one start and one wait. Groups of one
// are left as they are.
func (g *Graph) materialize(ix *index, bkts [][]int) *Graph {
	out := &Graph{Groups: g.Groups, Regions: g.Regions, Tensors: g.Tensors}
	out.Groups, out.Regions, out.Tensors = slices.Clone(g.Groups), slices.Clone(g.Regions), slices.Clone(g.Tensors)
	drop := make([]bool, len(g.Nodes))
	repl := map[int]Node{}
	// Names in use: the input's (its index has them all) and those made
	// here.
	made := map[string]bool{}
	unique := func(n string) string {
		for {
			if _, old := ix.pos[n]; !old && !made[n] {
				break
			}
			n += "'"
		}
		made[n] = true
		return n
	}
	for _, b := range bkts {
		if len(b) < 2 {
			continue
		}
		// sp and wp are where the merged start and wait go; every member's
		// own start and wait is dropped.
		sp, wp := -1, len(g.Nodes)
		for _, s := range b {
			sp = max(sp, s)
			wp = min(wp, ix.waitOf[s])
			drop[s], drop[ix.waitOf[s]] = true, true
		}
		first, last := &g.Nodes[b[0]], &g.Nodes[b[len(b)-1]]
		st := first.clone()
		st.Name = unique(mergeName(first.Name, last.Name))
		st.Region = g.Nodes[sp].Region
		st.Members, st.HiddenBy = nil, nil
		for _, s := range b {
			for _, m := range g.Nodes[s].Members {
				if m.From == "" {
					m.From = g.Nodes[s].Name
				}
				st.Members = append(st.Members, m)
			}
			for _, h := range g.Nodes[s].HiddenBy {
				if !slices.Contains(st.HiddenBy, h) {
					st.HiddenBy = append(st.HiddenBy, h)
				}
			}
		}
		// The wait keeps the node at wp's direction and region: it blocks
		// there, and exposure is charged to the region where it blocks.
		wt := g.Nodes[wp].clone()
		wt.Name = unique(mergeName(g.Nodes[ix.waitOf[b[0]]].Name, g.Nodes[ix.waitOf[b[len(b)-1]]].Name))
		wt.Of = st.Name
		repl[sp], repl[wp] = st, wt
	}
	out.Nodes = make([]Node, 0, len(g.Nodes))
	for i := range g.Nodes {
		if n, ok := repl[i]; ok {
			out.Nodes = append(out.Nodes, n)
		} else if !drop[i] {
			out.Nodes = append(out.Nodes, g.Nodes[i].clone())
		}
	}
	return out
}

// hiding finds, for every start, the plan positions of the first and last
// node that hides it: nodes that keep the compute stream busy (compute
// running, or another wait blocking) while the collective is on the wire,
// plus the compute its author named in HiddenBy. A collective with no such
// node gets (n, -1): it may move freely.
func (g *Graph) hiding(ix *index, est *Estimate) (lo, hi []int) {
	n := len(g.Nodes)
	var busyPos []int
	for i, s := range est.busy {
		if s.e > s.b {
			busyPos = append(busyPos, i)
		}
	}
	lo, hi = make([]int, n), make([]int, n)
	for i := range g.Nodes {
		lo[i], hi[i] = n, -1
		if g.Nodes[i].Kind != Start {
			continue
		}
		c := &est.Collectives[est.coll[i]]
		// Busy spans are disjoint and increase with plan position.
		a := sort.Search(len(busyPos), func(k int) bool { return est.busy[busyPos[k]].e > c.Begin })
		if a < len(busyPos) && est.busy[busyPos[a]].b < c.End {
			z := sort.Search(len(busyPos), func(k int) bool { return est.busy[busyPos[k]].b >= c.End })
			// The collective's own wait blocking is its exposure, not
			// something hiding it; it is always the last span (it ends at End).
			if busyPos[z-1] == ix.waitOf[i] {
				z--
			}
			if z > a {
				lo[i], hi[i] = busyPos[a], busyPos[z-1]
			}
		}
		for _, h := range g.Nodes[i].HiddenBy {
			p := ix.pos[h]
			lo[i], hi[i] = min(lo[i], p), max(hi[i], p)
		}
	}
	return lo, hi
}

// guard makes sure a bucketing pass keeps its promise: it checks the
// rewrite against the input and, while a hidden collective became exposed or
// the total exposed time grew, dissolves the offending buckets and tries
// again. The rules of fits make this rare for BucketOverlap (it catches
// second-order effects of the simulation, e.g. a shifted FIFO queue); for
// BucketBlocks, which merges by block whatever the overlap, it is what keeps
// hidden collectives hidden. In the worst case it returns the input.
//
// It also returns the index of its result, so that the planner's next pass
// does not validate the same graph again.
func (g *Graph) guard(ix *index, m buckets.Model, before *Estimate, bkts [][]int) (*Graph, *index, error) {
	// What each author's start blocked before, to spot buckets that block
	// longer than their members did.
	was := map[string]int64{}
	for _, c := range before.Collectives {
		for _, f := range c.From {
			was[f] += int64(c.Exposed)
		}
	}
	for {
		out := g.materialize(ix, bkts)
		oix, err := out.index()
		if err != nil {
			return nil, nil, err // a bug: merges are legal by construction
		}
		after := out.simulate(oix, m)
		exposed := exposedNow(before, after, false)
		if len(exposed) == 0 && after.Exposed <= before.Exposed {
			return out, oix, nil
		}
		// Dissolve every offending bucket at once: one round per cascade,
		// not one per bucket, keeps the guard cheap.
		offending := map[string]bool{}
		for _, e := range exposed {
			offending[e.Bucket] = true
		}
		if len(exposed) == 0 {
			// The total grew: blame buckets that block longer than their
			// members did.
			for _, c := range after.Collectives {
				sum := int64(0)
				for _, f := range c.From {
					sum += was[f]
				}
				if len(c.From) > 1 && int64(c.Exposed) > sum {
					offending[c.Start] = true
				}
			}
		}
		bad := map[string]bool{} // author starts whose bucket must go
		for _, c := range after.Collectives {
			if offending[c.Start] {
				for _, f := range c.From {
					bad[f] = true
				}
			}
		}
		var keep [][]int
		dissolved := false
		for _, b := range bkts {
			hit := false
			if len(b) > 1 {
				for _, s := range b {
					for _, mb := range g.Nodes[s].Members {
						hit = hit || bad[cmp.Or(mb.From, g.Nodes[s].Name)]
					}
				}
			}
			if !hit {
				keep = append(keep, b)
				continue
			}
			dissolved = true
			for _, s := range b {
				keep = append(keep, []int{s})
			}
		}
		if !dissolved {
			return g.Clone(), ix, nil // a clone has the same index
		}
		bkts = keep
	}
}
