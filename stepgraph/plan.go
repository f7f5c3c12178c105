package stepgraph

import (
	"slices"

	"github.com/gorun-hpc/gorun/buckets"
)

// Plan extracts the bucket plan an executor needs from a validated graph:
// per group, every start in plan order (which is issue order) as one bucket,
// its members packed in order into the fused buffer.
func Plan(g *Graph) (*buckets.Plan, error) {
	ix, err := g.index()
	if err != nil {
		return nil, err
	}
	// Groups sorted by name so equal graphs give equal plans (and hashes)
	// whatever map order Go picks.
	groups := make([]string, 0, len(ix.byGroup))
	for gr := range ix.byGroup {
		groups = append(groups, gr)
	}
	slices.Sort(groups)
	// Sets: a compute or a wait between two starts ends a set; starts that
	// follow each other directly (on any group) share one.
	set := make([]int, len(g.Nodes))
	cur, open := 0, false
	for i := range g.Nodes {
		switch g.Nodes[i].Kind {
		case Start:
			set[i], open = cur, true
		default:
			if open {
				cur, open = cur+1, false
			}
		}
	}
	p := &buckets.Plan{}
	for _, gr := range groups {
		gp := buckets.GroupPlan{Group: gr}
		// byGroup is in plan order, which is the order ranks issue in.
		for _, i := range ix.byGroup[gr] {
			nd := &g.Nodes[i]
			b := buckets.Bucket{Name: nd.Name, Op: nd.Op, DType: nd.DType, Direction: nd.Dir, Region: nd.Region, Set: set[i]}
			// Offsets are derived, never stored in the graph: a pass that
			// reorders members cannot leave them stale.
			for _, m := range nd.Members {
				b.Members = append(b.Members, buckets.Member{Tensor: m.In, Out: m.Out, Offset: b.Bytes, Bytes: m.Bytes})
				b.Bytes += m.Bytes
			}
			gp.Buckets = append(gp.Buckets, b)
		}
		p.Groups = append(p.Groups, gp)
	}
	return p, p.Validate()
}
