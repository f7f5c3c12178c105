package stepgraph

import (
	"github.com/gorun-hpc/gorun/buckets"
)

// BucketBlocks is direction-aware block bucketing: on each group, runs of
// consecutive collectives with the same op, dtype, direction and region (one
// block of one direction) merge into buckets of at most cfg.Cap() bytes, in
// the order they become ready. Directions are planned independently — a
// bucket never mixes forward and backward members — and buckets keep the
// order of the plan, so a step written as autograd runs it yields forward
// buckets in block order and backward buckets in reverse block order, the
// order buckets.Assign gives eager programs.
//
// A collective whose copies into and out of a fused buffer would cost more
// than the latency merging saves (buckets.Model.MergePays, with a measured
// copy bandwidth) is not merged at all: a bucket that cannot pay is not
// formed. A run is also cut where its next start would come after the first wait of
// the run (the bucket could not be started before it is waited). The result
// is checked like every pass's: a bucket that would expose a collective the
// input hid, or grow total exposed time, is dissolved.
func BucketBlocks(g *Graph, cfg buckets.Config) (*Graph, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ix, err := g.index()
	if err != nil {
		return nil, err
	}
	out, _, err := g.bucketBlocks(ix, cfg)
	return out, err
}

// bucketBlocks is BucketBlocks of a graph already indexed (ix) under a
// valid config; it also returns its result's index.
func (g *Graph) bucketBlocks(ix *index, cfg buckets.Config) (*Graph, *index, error) {
	// The estimate of the input is what the guard holds the result to.
	est := g.simulate(ix, cfg.Model)
	capBytes := cfg.Cap()
	var bkts [][]int
	for _, gr := range sortedGroups(ix) {
		starts := ix.byGroup[gr]
		for k := 0; k < len(starts); {
			// The run of one block: same kind and region, consecutive.
			e := k + 1
			for e < len(starts) && sameKind(&g.Nodes[starts[k]], &g.Nodes[starts[e]]) &&
				g.Nodes[starts[k]].Region == g.Nodes[starts[e]].Region {
				e++
			}
			sizes := make([]int64, e-k)
			for j := k; j < e; j++ {
				sizes[j-k] = g.Nodes[starts[j]].Bytes()
			}
			for _, r := range buckets.Pack(sizes, capBytes) {
				// Cut where the next start cannot join: it would come after
				// the bucket's first wait, or move a start past compute its
				// author said hides it (an edge, not an estimate).
				var cur *run
				for _, s := range starts[k+r[0] : k+r[1]] {
					one := &run{bytes: g.Nodes[s].Bytes(), maxStart: s, minWait: ix.waitOf[s], minHide: len(g.Nodes), maxHide: -1,
						solo: !g.pays(&g.Nodes[s], cfg.Model)}
					for _, h := range g.Nodes[s].HiddenBy {
						one.minHide, one.maxHide = min(one.minHide, ix.pos[h]), max(one.maxHide, ix.pos[h])
					}
					if cur != nil && fits(cur, one) {
						cur.absorb(one)
						bkts[len(bkts)-1] = append(bkts[len(bkts)-1], s)
						continue
					}
					cur = one
					bkts = append(bkts, []int{s})
				}
			}
			k = e
		}
	}
	return g.guard(ix, cfg.Model, est, bkts)
}

func sortedGroups(ix *index) []string {
	var gs []string
	for gr := range ix.byGroup {
		gs = append(gs, gr)
	}
	for i := 1; i < len(gs); i++ { // insertion sort: a handful of groups
		for j := i; j > 0 && gs[j] < gs[j-1]; j-- {
			gs[j], gs[j-1] = gs[j-1], gs[j]
		}
	}
	return gs
}
