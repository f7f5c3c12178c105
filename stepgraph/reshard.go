package stepgraph

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// ReshardReport says what Reshard did.
type ReshardReport struct {
	// PeakBefore and PeakAfter are PeakBytes of the input and the output.
	PeakBefore, PeakAfter int64
	// Regathered lists the forward all-gathers gathered again in backward;
	// Kept those whose re-gather would have exposed a hidden collective.
	Regathered, Kept []string
}

func (r *ReshardReport) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "peak bytes %d -> %d\n", r.PeakBefore, r.PeakAfter)
	if len(r.Regathered) > 0 {
		fmt.Fprintf(&sb, "regathered %s\n", strings.Join(r.Regathered, ","))
	}
	if len(r.Kept) > 0 {
		fmt.Fprintf(&sb, "kept %s\n", strings.Join(r.Kept, ","))
	}
	return sb.String()
}

// regatherSuffix marks the re-gathered copies of tensors and nodes. A
// suffix rather than a fresh name keeps the relation visible in plans and
// traces: W3@bwd is W3 gathered again.
const regatherSuffix = "@bwd"

// Reshard is reshard-after-forward (FSDP's reshard_after_forward): a forward
// all-gather whose output is read again in backward is gathered again for
// backward, so the forward copy dies with its last forward reader. For each
// such start, the members read in backward get one new all-gather (same
// group, dtype and shards; outputs named OUT@bwd), its wait right before the
// first backward reader and its start one block earlier — at the first node
// of the backward block that runs before the reader's, as FSDP's backward
// prefetch does — and every backward reader is rewired to the new output. A
// block whose backward runs first keeps its forward copy: nothing would hide
// its re-gather, and the copy would be freed for no time at all (FSDP keeps
// the last block's parameters for the same reason).
//
// The new collectives are communication that did not exist, so they may be
// exposed; what Reshard promises is that no collective the input hid becomes
// exposed. A re-gather that queues in front of a collective that became
// exposed is started right before its wait instead, and if that still
// exposes it, dropped (its forward copy is kept). All re-gathers are placed
// in one rewrite per round and there are at most three rounds, so the pass
// costs a few simulations of the step.
func Reshard(g *Graph, m buckets.Model) (*Graph, *ReshardReport, error) {
	return ReshardWith(g, ReshardConfig{Model: m, Prefetch: 1})
}

// ReshardConfig configures ReshardWith.
type ReshardConfig struct {
	// Model prices the plan for the exposure guard.
	Model buckets.Model
	// Prefetch is how many backward blocks before its first reader's block
	// a re-gather starts (FSDP's backward prefetch; Reshard uses 1). Fewer
	// are used where fewer exist; 0 starts it at the beginning of the
	// reader's own block, where little hides it but no gathered copy is
	// held early. Negative is an error.
	Prefetch int
}

// ReshardWith is Reshard with the prefetch depth of cfg.
func ReshardWith(g *Graph, cfg ReshardConfig) (*Graph, *ReshardReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, nil, err
	}
	ix, err := g.index()
	if err != nil {
		return nil, nil, err
	}
	out, _, rep, err := g.reshard(ix, cfg)
	return out, rep, err
}

func (cfg ReshardConfig) validate() error {
	if cfg.Prefetch < 0 {
		return fmt.Errorf("stepgraph: reshard prefetch %d is negative", cfg.Prefetch)
	}
	return cfg.Model.Validate()
}

// reshard is ReshardWith of a graph already indexed (ix) under a valid
// config; it also returns its result's index.
func (g *Graph) reshard(ix *index, cfg ReshardConfig) (*Graph, *index, *ReshardReport, error) {
	m := cfg.Model
	before := g.simulate(ix, m)
	rep := &ReshardReport{}
	rep.PeakBefore, _ = g.peakBytes() // g is valid: indexed above
	// First backward reader of every tensor, found once for all starts.
	bwdReader := map[string]int{}
	for j := len(g.Nodes) - 1; j >= 0; j-- {
		if g.Nodes[j].Dir != buckets.Backward {
			continue
		}
		for _, e := range ix.preds[j] {
			if e.kind == dataEdge {
				bwdReader[e.tensor] = j
			}
		}
	}
	var cands []*regatherPlan
	for i := range g.Nodes {
		s := &g.Nodes[i]
		if s.Kind != Start || s.Op != buckets.AllGather || s.Dir != buckets.Forward {
			continue
		}
		if rp := planRegather(g, ix, bwdReader, i, cfg.Prefetch); rp != nil {
			if rp.early < 0 {
				rep.Kept = append(rep.Kept, s.Name)
				continue
			}
			cands = append(cands, rp)
		}
	}
	// Round 0 places every re-gather early; rounds 1 and 2 move or drop the
	// ones blamed for exposing something. Three rounds bound the cost and
	// are enough: each round only moves blamed re-gathers one step further.
	var out *Graph
	var oix *index
	for round := 0; round < 3 && len(cands) > 0; round++ {
		next := g.applyRegathers(ix, cands)
		nix, err := next.index()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("stepgraph: reshard made an invalid plan: %w", err)
		}
		after := next.simulate(nix, m)
		bad := exposedNow(before, after, false)
		if len(bad) == 0 {
			out, oix = next, nix
			break
		}
		if round == 2 {
			for _, rp := range cands {
				rep.Kept = append(rep.Kept, rp.name)
			}
			cands = nil
			break
		}
		// Blame the re-gathers queued on the same group just before a
		// collective that became exposed: move them late, or drop them if
		// already late.
		blamed := blameRegathers(after, bad, cands)
		if len(blamed) == 0 { // nothing to blame directly: fall back on all
			for _, rp := range cands {
				blamed[rp] = true
			}
		}
		var keep []*regatherPlan
		for _, rp := range cands {
			switch {
			case !blamed[rp]:
				keep = append(keep, rp)
			case rp.at != rp.first:
				rp.at = rp.first
				keep = append(keep, rp)
			default:
				rep.Kept = append(rep.Kept, rp.name)
			}
		}
		cands = keep
	}
	for _, rp := range cands {
		rep.Regathered = append(rep.Regathered, rp.name)
	}
	slices.Sort(rep.Kept)
	if len(cands) == 0 || out == nil {
		out, oix = g.Clone(), ix // a clone has the same index
	}
	rep.PeakAfter, _ = out.peakBytes() // out is g or a re-indexed rewrite
	return out, oix, rep, nil
}

// blameRegathers returns the re-gathers issued on the group of a
// collective in bad no later than it and still running when it began: those
// that queued in front of it. Each group's re-gathers and exposed
// collectives are swept once in decreasing issue order, keeping the earliest
// begin among the exposed collectives issued at or after the sweep, so the
// cost is a sort, not a comparison of every pair.
func blameRegathers(after *Estimate, bad []*ExposedError, cands []*regatherPlan) map[*regatherPlan]bool {
	type point struct {
		issue, end time.Duration // the re-gather's; for an exposed collective, issue and begin
		rp         *regatherPlan // nil for an exposed collective
	}
	byStart := make(map[string]*Collective, len(after.Collectives))
	for k := range after.Collectives {
		byStart[after.Collectives[k].Start] = &after.Collectives[k]
	}
	groups := map[string][]point{}
	for _, rp := range cands {
		if r := byStart[rp.name+regatherSuffix]; r != nil {
			groups[r.Group] = append(groups[r.Group], point{issue: r.Issue, end: r.End, rp: rp})
		}
	}
	for _, e := range bad {
		if c := byStart[e.Bucket]; c != nil {
			groups[c.Group] = append(groups[c.Group], point{issue: c.Issue, end: c.Begin})
		}
	}
	blamed := map[*regatherPlan]bool{}
	for _, pts := range groups {
		// Decreasing issue; at equal issue the exposed collective first,
		// so that it counts for re-gathers issued at the same time.
		slices.SortStableFunc(pts, func(a, b point) int {
			if c := cmp.Compare(b.issue, a.issue); c != 0 {
				return c
			}
			return cmp.Compare(boolInt(a.rp != nil), boolInt(b.rp != nil))
		})
		seen, minBegin := false, time.Duration(0)
		for _, p := range pts {
			switch {
			case p.rp == nil:
				if !seen || p.end < minBegin {
					seen, minBegin = true, p.end
				}
			case seen && p.end >= minBegin:
				blamed[p.rp] = true
			}
		}
	}
	return blamed
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// regatherPlan is one re-gather: the forward start it repeats, the outputs
// read in backward, and where its start and wait go (plan positions of the
// input graph: the new node goes right before the node there).
type regatherPlan struct {
	name      string
	start     int
	outs      map[string]string // forward output → backward copy
	first     int               // first backward reader: the wait goes here
	early, at int               // prefetch position (-1: none); chosen position
}

// planRegather places the re-gather of start si from the first backward
// readers of its outputs, ahead blocks earlier; nil if there are none.
func planRegather(g *Graph, ix *index, bwdReader map[string]int, si, ahead int) *regatherPlan {
	s := &g.Nodes[si]
	rp := &regatherPlan{name: s.Name, start: si, outs: map[string]string{}, first: len(g.Nodes)}
	for _, mb := range s.Members {
		if j, ok := bwdReader[mb.Out]; ok {
			rp.outs[mb.Out] = mb.Out + regatherSuffix
			rp.first = min(rp.first, j)
		}
	}
	if len(rp.outs) == 0 {
		return nil
	}
	// ahead blocks earlier: skip back over the reader's block, then over
	// up to ahead blocks before it, which must also be backward. Nodes
	// outside every block (region "": a top-level loss's gradient, an
	// accumulation between blocks) are not a block: they are skipped with
	// the block they follow and never counted as one, so a re-gather is
	// not placed "one block ahead" at a loss gradient that runs first.
	bwd := func(k int) bool { return k >= 0 && g.Nodes[k].Dir == buckets.Backward }
	reader := g.Nodes[rp.first].Region
	k := rp.first - 1
	for bwd(k) && (g.Nodes[k].Region == reader || g.Nodes[k].Region == "") {
		k--
	}
	moved := 0
	for ; moved < ahead; moved++ {
		j := k
		for bwd(j) && g.Nodes[j].Region == "" {
			j--
		}
		if !bwd(j) {
			break
		}
		k = j
		prev := g.Nodes[k].Region
		for bwd(k) && g.Nodes[k].Region == prev {
			k--
		}
	}
	if ahead > 0 && moved == 0 {
		// The reader's block runs first in backward: nothing would hide
		// the re-gather, and the copy would be freed for no time at all.
		rp.early, rp.at = -1, -1
		return rp
	}
	rp.early = k + 1
	// Never before the shards exist.
	for _, mb := range s.Members {
		if w, ok := ix.writer[mb.In]; ok && w >= 0 {
			rp.early = max(rp.early, w+1)
		}
	}
	rp.at = rp.early
	return rp
}

// applyRegathers rewrites g with every planned re-gather in one pass. New
// nodes go right before the node at their position; at one position, starts
// (in the order of the forward starts they repeat) come before waits.
func (g *Graph) applyRegathers(ix *index, rps []*regatherPlan) *Graph {
	starts := map[int][]Node{}
	waits := map[int][]Node{}
	outs := map[string]string{}
	for _, rp := range rps {
		s := &g.Nodes[rp.start]
		st := Node{Name: s.Name + regatherSuffix, Kind: Start, Dir: buckets.Backward, Region: regionOr(g.Nodes[rp.at].Region, s.Region),
			Op: s.Op, Group: s.Group, DType: s.DType}
		for _, mb := range s.Members {
			if c, ok := rp.outs[mb.Out]; ok {
				st.Members = append(st.Members, Member{In: mb.In, Out: c, Bytes: mb.Bytes})
				outs[mb.Out] = c
			}
		}
		reader := regionOr(g.Nodes[rp.first].Region, s.Region)
		wt := Node{Name: g.Nodes[ix.waitOf[rp.start]].Name + regatherSuffix, Kind: Wait, Dir: buckets.Backward, Region: reader, Of: st.Name}
		starts[rp.at] = append(starts[rp.at], st)
		waits[rp.first] = append(waits[rp.first], wt)
	}
	out := &Graph{Groups: slices.Clone(g.Groups), Regions: slices.Clone(g.Regions), Tensors: slices.Clone(g.Tensors)}
	out.Nodes = make([]Node, 0, len(g.Nodes)+2*len(rps))
	for j := range g.Nodes {
		out.Nodes = append(out.Nodes, starts[j]...)
		out.Nodes = append(out.Nodes, waits[j]...)
		nd := g.Nodes[j].clone()
		if nd.Dir == buckets.Backward {
			for k, r := range nd.Reads {
				if c, ok := outs[r]; ok {
					nd.Reads[k] = c
				}
			}
			for k, mb := range nd.Members {
				if c, ok := outs[mb.In]; ok {
					nd.Members[k].In = c
				}
			}
		}
		out.Nodes = append(out.Nodes, nd)
	}
	return out
}

// regionOr is region, or, for a node outside every block, fallback: the
// block of the forward gather a re-gather repeats (the block whose
// parameters it brings back), so its start and wait are accounted to a
// declared region.
func regionOr(region, fallback string) string {
	if region == "" {
		return fallback
	}
	return region
}
