package stepgraph

import (
	"errors"
	"fmt"
	"slices"
	"strings"

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

// regatherSuffix marks the re-gathered copies of tensors and nodes.
const regatherSuffix = "@bwd"

// Reshard is reshard-after-forward (FSDP's reshard_after_forward): a forward
// all-gather whose output is read again in backward is gathered again for
// backward, so the forward copy dies with its last forward reader. For each
// such start, the members read in backward get one new all-gather (same
// group, dtype and shards; outputs named OUT@bwd), its wait right before the
// first backward reader and its start one block earlier — at the first node
// of the backward region that runs before the reader's, as FSDP's backward
// prefetch does — and every backward reader is rewired to the new output.
//
// The new collectives are communication that did not exist, so they may be
// exposed; what Reshard promises is that no collective the input hid becomes
// exposed: a re-gather whose prefetch would do that is started right before
// its wait instead, and if that still does, the forward copy is kept.
func Reshard(g *Graph, m buckets.Model) (*Graph, *ReshardReport, error) {
	if err := m.Validate(); err != nil {
		return nil, nil, err
	}
	ix, err := g.index()
	if err != nil {
		return nil, nil, err
	}
	before := g.simulate(ix, m)
	rep := &ReshardReport{}
	if rep.PeakBefore, _, err = PeakBytes(g); err != nil {
		return nil, nil, err
	}
	cur := g.Clone()
	for i := range g.Nodes {
		s := &g.Nodes[i]
		if s.Kind != Start || s.Op != buckets.AllGather || s.Dir != buckets.Forward {
			continue
		}
		applied := false
		for _, early := range []bool{true, false} {
			next, ok, err := regather(cur, s.Name, early)
			if err != nil {
				return nil, nil, err
			}
			if !ok {
				break // nothing read in backward
			}
			nix, err := next.index()
			if err != nil {
				return nil, nil, fmt.Errorf("stepgraph: reshard of %q made an invalid plan: %w", s.Name, err)
			}
			var ee *ExposedError
			if err := firstExposed(before, next.simulate(nix, m)); errors.As(err, &ee) {
				continue
			} else if err != nil {
				return nil, nil, err
			}
			cur, applied = next, true
			rep.Regathered = append(rep.Regathered, s.Name)
			break
		}
		if !applied && readInBackward(g, ix, s) {
			rep.Kept = append(rep.Kept, s.Name)
		}
	}
	if rep.PeakAfter, _, err = PeakBytes(cur); err != nil {
		return nil, nil, err
	}
	return cur, rep, nil
}

func readInBackward(g *Graph, ix *index, s *Node) bool {
	for j := range g.Nodes {
		if g.Nodes[j].Dir != buckets.Backward {
			continue
		}
		for _, e := range ix.preds[j] {
			if e.kind == dataEdge && slices.ContainsFunc(s.Members, func(m Member) bool { return m.Out == e.tensor }) {
				return true
			}
		}
	}
	return false
}

// regather adds the backward all-gather of start name to g (a copy). It
// returns ok=false when no member's output is read in backward.
func regather(g *Graph, name string, early bool) (*Graph, bool, error) {
	ix, err := g.index()
	if err != nil {
		return nil, false, err
	}
	si := ix.pos[name]
	s := &g.Nodes[si]
	outs := map[string]string{} // forward output → backward copy
	first := len(g.Nodes)
	for j := range g.Nodes {
		if g.Nodes[j].Dir != buckets.Backward {
			continue
		}
		for _, e := range ix.preds[j] {
			if e.kind != dataEdge {
				continue
			}
			for _, mb := range s.Members {
				if mb.Out == e.tensor {
					outs[mb.Out] = mb.Out + regatherSuffix
					first = min(first, j)
				}
			}
		}
	}
	if len(outs) == 0 {
		return nil, false, nil
	}
	reader := &g.Nodes[first]
	st := Node{Name: s.Name + regatherSuffix, Kind: Start, Dir: buckets.Backward, Region: reader.Region,
		Op: s.Op, Group: s.Group, DType: s.DType}
	for _, mb := range s.Members {
		if c, ok := outs[mb.Out]; ok {
			st.Members = append(st.Members, Member{In: mb.In, Out: c, Bytes: mb.Bytes})
		}
	}
	wt := Node{Name: g.Nodes[ix.waitOf[si]].Name + regatherSuffix, Kind: Wait, Dir: buckets.Backward, Region: reader.Region, Of: st.Name}
	// Where the start goes: right before the wait, or at the first node of
	// the backward block that runs before the reader's block. A block whose
	// backward runs first has no such block: nothing would hide its
	// re-gather, and its forward copy would be freed for no time at all, so
	// it keeps the copy (as FSDP keeps the last block's parameters).
	at := first
	if early {
		k := first - 1
		for k >= 0 && g.Nodes[k].Dir == buckets.Backward && g.Nodes[k].Region == reader.Region {
			k--
		}
		if k < 0 || g.Nodes[k].Dir != buckets.Backward {
			return nil, false, nil
		}
		prev := g.Nodes[k].Region
		for k >= 0 && g.Nodes[k].Dir == buckets.Backward && g.Nodes[k].Region == prev {
			k--
		}
		at = k + 1
		// Never before the shards exist.
		for _, mb := range st.Members {
			if w, ok := ix.writer[mb.In]; ok {
				at = max(at, w+1)
			}
		}
		// The start is issued in the block where it sits.
		st.Region = g.Nodes[at].Region
	}
	out := &Graph{Groups: slices.Clone(g.Groups), Regions: slices.Clone(g.Regions), Tensors: slices.Clone(g.Tensors)}
	for j := range g.Nodes {
		if j == at {
			out.Nodes = append(out.Nodes, st)
		}
		if j == first {
			out.Nodes = append(out.Nodes, wt)
		}
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
	return out, true, nil
}
