package stepgraph

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/buckets"
)

// ErrChunk is wrapped by Chunk's errors about a region it cannot split.
var ErrChunk = errors.New("stepgraph: cannot chunk")

// ChunkReport says what Chunk did.
type ChunkReport struct {
	// Chunked and Kept describe the segments (first..last node) that were
	// split, and those left whole because splitting them would expose a
	// hidden collective or grow the total exposed time.
	Chunked, Kept []string
}

func (r *ChunkReport) String() string {
	var sb strings.Builder
	if len(r.Chunked) > 0 {
		fmt.Fprintf(&sb, "chunked %s\n", strings.Join(r.Chunked, " "))
	}
	if len(r.Kept) > 0 {
		fmt.Fprintf(&sb, "kept %s\n", strings.Join(r.Kept, " "))
	}
	return sb.String()
}

// chunkCount is fixed at two: the point is that one chunk's communication
// overlaps the other's compute, which two chunks already give; more chunks
// add a latency each.
const chunkCount = 2

// matchRegion reports whether pattern (a path.Match pattern over dotted
// segments, e.g. "layers.*.moe") matches region or one of its ancestors, so
// "layers.3" chunks "layers.3.attn" too.
func matchRegion(pattern, region string) bool {
	if region == "" {
		return false
	}
	p := strings.ReplaceAll(pattern, ".", "/")
	segs := strings.Split(region, ".")
	for k := 1; k <= len(segs); k++ {
		if ok, _ := path.Match(p, strings.Join(segs[:k], "/")); ok {
			return true
		}
	}
	return false
}

// Chunk splits the regions matching pattern, in the given directions (all
// when none are given), into two chunks along the batch dimension, so that
// one chunk's communication overlaps the other chunk's compute (as in MoE
// layers whose all-to-all dispatch of chunk 1 overlaps chunk 0's experts).
//
// A segment is a maximal run of consecutive nodes of one direction in
// matching regions. Inside it:
//   - a tensor entering from outside is split (a Split node before the
//     segment) if its chunk mode is Batch — by default, tensors written by
//     compute; inputs and collective outputs are Replicated by default and
//     read whole by both chunks;
//   - compute reading a split tensor runs once per chunk (Node.Chunk says
//     which; each copy costs half) and its outputs are per chunk, named
//     T#0 and T#1;
//   - a collective whose inputs are per chunk runs once per chunk with half
//     the bytes (Partial tensors keep their size); a collective over
//     replicated inputs (a parameter all-gather) runs once; a per-chunk
//     collective waited after the segment (a gradient reduce-scatter) gets
//     both chunks' waits where its wait was, its outputs recombined there;
//   - a per-chunk tensor read after the segment (or by nobody: a result of
//     the step) is recombined under its original name by a Concat node, or
//     a Sum node for Partial tensors (e.g. weight gradients, which must be
//     declared Partial).
//
// Nodes are ordered phase by phase, a phase ending before each wait of a
// per-chunk collective: chunk 0's part of a phase, then chunk 1's, so chunk
// 0's collective is on the wire while chunk 1 computes and the other way
// round. Running the result equals running the region once per chunk on each
// half of the batch. Segments whose split would expose a hidden collective
// or grow the total exposed time are left whole and listed in the report.
func Chunk(g *Graph, pattern string, dirs []Direction, m buckets.Model) (*Graph, *ChunkReport, error) {
	return ChunkWith(g, ChunkConfig{Pattern: pattern, Dirs: dirs, Model: m})
}

// ChunkConfig says what ChunkWith splits and how.
type ChunkConfig struct {
	// Pattern selects the regions (see Chunk); Dirs the directions (all
	// when empty).
	Pattern string
	Dirs    []Direction
	// Model prices the plan for the exposure guard.
	Model buckets.Model
	// Accumulate is early gradient accumulation: a collective inside the
	// segment whose members are all Partial per-chunk tensors (weight
	// gradients, a loss sum) is not split. Instead its inputs are summed
	// (a Sum node, chunk 0 + chunk 1) right after the last chunk has
	// written them, and the one collective starts there: half the
	// collectives of per-chunk reduction, at the price of starting after
	// both chunks. Both give the same sum when the chunks are the two
	// halves of the rank's samples; per-chunk reduction is the order an
	// eager program that reduces each chunk on its own would use.
	Accumulate bool
	// Always splits every matching segment, even where the estimate says it
	// exposes a hidden collective or more communication in total: for
	// programs whose numerics depend on the split being made (per-chunk
	// reduction over chunk-major samples) and users who trust their own
	// measurements over the cost model.
	Always bool
}

// ChunkWith is Chunk with the options of ChunkConfig.
func ChunkWith(g *Graph, cfg ChunkConfig) (*Graph, *ChunkReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, nil, err
	}
	ix, err := g.index()
	if err != nil {
		return nil, nil, err
	}
	out, _, rep, err := g.chunk(ix, cfg)
	return out, rep, err
}

func (cfg ChunkConfig) validate() error {
	if _, err := path.Match(cfg.Pattern, ""); err != nil || cfg.Pattern == "" {
		return fmt.Errorf("%w: bad region pattern %q", ErrChunk, cfg.Pattern)
	}
	return cfg.Model.Validate()
}

// chunk is ChunkWith of a graph already indexed (ix) under a valid config;
// it also returns its result's index.
func (g *Graph) chunk(ix *index, cfg ChunkConfig) (*Graph, *index, *ChunkReport, error) {
	pattern, dirs, m := cfg.Pattern, cfg.Dirs, cfg.Model
	before := g.simulate(ix, m)
	in := func(n *Node) bool {
		return matchRegion(pattern, n.Region) && (len(dirs) == 0 || slices.Contains(dirs, n.Dir))
	}
	type seg struct{ first, last string }
	var segs []seg
	for i := 0; i < len(g.Nodes); {
		if !in(&g.Nodes[i]) {
			i++
			continue
		}
		j := i + 1
		for j < len(g.Nodes) && in(&g.Nodes[j]) && g.Nodes[j].Dir == g.Nodes[i].Dir {
			j++
		}
		segs = append(segs, seg{g.Nodes[i].Name, g.Nodes[j-1].Name})
		i = j
	}
	// Each segment is judged against the plan as it stands, so a segment
	// kept whole does not make a later one look better or worse than it is.
	rep := &ChunkReport{}
	cur, curEst, cix := g, before, ix
	// Last segment first: rewriting one leaves the nodes before it in place.
	for k := len(segs) - 1; k >= 0; k-- {
		label := segs[k].first + ".." + segs[k].last
		next, changed, err := cur.chunkSegment(cix, cix.pos[segs[k].first], cix.pos[segs[k].last]+1, cfg.Accumulate)
		if err != nil {
			return nil, nil, nil, err
		}
		if !changed {
			continue
		}
		nix, err := next.index()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("stepgraph: chunking %s made an invalid plan: %w", label, err)
		}
		est := next.simulate(nix, m)
		if !cfg.Always && (firstExposed(before, est) != nil || est.Exposed > curEst.Exposed) {
			rep.Kept = append([]string{label}, rep.Kept...)
			continue
		}
		cur, curEst, cix = next, est, nix
		rep.Chunked = append([]string{label}, rep.Chunked...)
	}
	if cur == g {
		cur = g.Clone() // a clone has the same index
	}
	return cur, cix, rep, nil
}

func chunkName(name string, c int) string { return name + "#" + strconv.Itoa(c) }

// chunkSegment splits nodes [lo, hi) of g; see Chunk.
func (g *Graph) chunkSegment(ix *index, lo, hi int, accumulate bool) (*Graph, bool, error) {
	decl := map[string]Tensor{}
	for _, t := range g.Tensors {
		decl[t.Name] = t
	}
	// The default modes follow what tensors usually are: compute writes
	// activations (batch-major), inputs are parameters or the batch itself
	// (declare the batch as Batch), and collectives mostly deliver
	// parameters. Weight gradients are the case defaults cannot guess: they
	// must be declared Partial.
	mode := func(t string) ChunkMode {
		if d, ok := decl[t]; ok && d.Chunk != "" {
			return d.Chunk
		}
		if w, ok := ix.writer[t]; ok && w >= 0 && g.Nodes[w].Kind == Compute { // -1: an input
			return Batch
		}
		return Replicated
	}
	inSeg := func(p int) bool { return p >= lo && p < hi }
	per := map[string]ChunkMode{} // per-chunk tensors → how they recombine
	var splits, written []string
	// perChunk decides, at a node's read, whether the tensor exists per
	// chunk; a batch tensor from outside is split once, at its first read.
	perChunk := func(t string) bool {
		if _, ok := per[t]; ok {
			return true
		}
		if w, ok := ix.writer[t]; ok && inSeg(w) {
			return false // written in the segment by a node that runs once
		}
		if mode(t) == Batch {
			per[t] = Batch
			splits = append(splits, t)
			return true
		}
		return false
	}
	// chunked[i]: node i runs once per chunk. Decided in plan order, since
	// whether a node is per chunk depends on what earlier nodes wrote.
	chunked := make([]bool, len(g.Nodes))
	// late[i]: node i runs once, after the last chunk's part of its phase:
	// an accumulated collective's start (after the Sum of its inputs) and
	// its wait when that is in the segment.
	late := make([]bool, len(g.Nodes))
	for i := lo; i < hi; i++ {
		nd := &g.Nodes[i]
		if nd.Chunk != nil || nd.Builtin != "" {
			return nil, false, nodeErr(nd, ErrChunk, "already chunked")
		}
		switch nd.Kind {
		case Compute:
			for _, r := range nd.Reads {
				if perChunk(r) {
					chunked[i] = true
				}
			}
			if !chunked[i] {
				continue
			}
			for _, w := range nd.Writes {
				md := mode(w)
				if md == Replicated {
					return nil, false, nodeErr(nd, ErrChunk, "runs per chunk but writes %q, declared replicated", w)
				}
				per[w] = md
				written = append(written, w)
			}
		case Start:
			n := 0
			for _, mb := range nd.Members {
				if perChunk(mb.In) {
					n++
				}
			}
			if n == 0 {
				continue
			}
			if n != len(nd.Members) {
				return nil, false, nodeErr(nd, ErrChunk, "mixes per-chunk and replicated members")
			}
			if accumulate && allPartial(nd, per) {
				// Early accumulation: the members' inputs are summed in
				// front of the start (see placement below), which then
				// reads them whole, once.
				late[i] = true
				if w := ix.waitOf[i]; inSeg(w) {
					late[w] = true
				}
				continue
			}
			es := buckets.DTypeSize(nd.DType)
			later := !inSeg(ix.waitOf[i]) // waited after the segment
			for _, mb := range nd.Members {
				if per[mb.In] == Batch && (mb.Bytes/chunkCount)%es != 0 {
					return nil, false, nodeErr(nd, ErrChunk, "member %q of %d bytes does not split into two whole halves of %s", mb.In, mb.Bytes, nd.DType)
				}
				per[mb.Out] = per[mb.In]
				if !later {
					written = append(written, mb.Out)
				}
			}
			chunked[i] = true
			if later {
				// Both chunks' waits stay where the wait was, and the
				// outputs are recombined right after them.
				chunked[ix.waitOf[i]] = true
			}
		case Wait:
			chunked[i] = chunked[ix.startOf[i]]
		}
	}
	// A node placed with chunk 0 that reads an accumulated collective's
	// output would run before that collective starts.
	for i := lo; i < hi; i++ {
		if g.Nodes[i].Kind != Wait || !late[i] {
			continue
		}
		for _, mb := range g.Nodes[ix.startOf[i]].Members {
			for j := i + 1; j < hi; j++ {
				if !late[j] && slices.Contains(g.Nodes[j].Reads, mb.Out) {
					return nil, false, nodeErr(&g.Nodes[j], ErrChunk, "reads %q, the output of accumulated collective %q, inside the chunked segment", mb.Out, g.Nodes[ix.startOf[i]].Name)
				}
			}
		}
	}
	if !slices.Contains(chunked, true) {
		return g, false, nil // nothing here reads a per-chunk tensor
	}
	// Tensor names per chunk: T#0 and T#1, primed when an earlier segment
	// already split T under those names.
	names := map[string][chunkCount]string{}
	taken := func(n string) bool {
		_, w := ix.writer[n]
		_, d := decl[n]
		return w || d
	}
	name := func(t string, c int) string {
		if _, ok := per[t]; !ok {
			return t
		}
		ns, ok := names[t]
		if !ok {
			suffix := ""
			for taken(chunkName(t, 0)+suffix) || taken(chunkName(t, 1)+suffix) {
				suffix += "'"
			}
			for k := range ns {
				ns[k] = chunkName(t, k) + suffix
			}
			names[t] = ns
		}
		return ns[c]
	}
	copyNode := func(nd *Node, c int) Node {
		n := nd.clone()
		n.Name = chunkName(nd.Name, c)
		for k, r := range n.Reads {
			n.Reads[k] = name(r, c)
		}
		for k, w := range n.Writes {
			n.Writes[k] = name(w, c)
		}
		switch nd.Kind {
		case Compute:
			n.Chunk = &ChunkRef{Of: nd.Name, Index: c, Count: chunkCount}
			// Halves that add up to the whole, so totals stay exact.
			n.Cost = nd.Cost / chunkCount
			if c == chunkCount-1 {
				n.Cost = nd.Cost - nd.Cost/chunkCount*(chunkCount-1)
			}
		case Start:
			for k, mb := range n.Members {
				n.Members[k].In, n.Members[k].Out = name(mb.In, c), name(mb.Out, c)
				if per[mb.In] == Batch {
					n.Members[k].Bytes = mb.Bytes / chunkCount
				}
				if mb.From == "" {
					n.Members[k].From = nd.Name
				}
			}
			// Per-chunk hiding compute hides the same chunk's copy; compute
			// that runs once is placed with chunk 0, before chunk 1's copy
			// is started, so it can only hide chunk 0's.
			n.HiddenBy = n.HiddenBy[:0]
			for _, h := range nd.HiddenBy {
				switch p := ix.pos[h]; {
				case inSeg(p) && chunked[p]:
					n.HiddenBy = append(n.HiddenBy, chunkName(h, c))
				case c == 0 || !inSeg(p):
					n.HiddenBy = append(n.HiddenBy, h)
				}
			}
		case Wait:
			n.Of = chunkName(nd.Of, c)
		}
		return n
	}

	out := &Graph{Groups: slices.Clone(g.Groups), Regions: slices.Clone(g.Regions), Tensors: slices.Clone(g.Tensors)}
	// Room for every segment node twice plus the splits and joins: one
	// allocation instead of a doubling copy of a large step.
	out.Nodes = make([]Node, 0, len(g.Nodes)+(hi-lo)+2*len(per)+8)
	for t, md := range per {
		if d, ok := decl[t]; ok && d.Bytes > 0 {
			b := d.Bytes
			if md == Batch {
				b /= chunkCount
			}
			for c := 0; c < chunkCount; c++ {
				out.Tensors = append(out.Tensors, Tensor{Name: name(t, c), Bytes: b})
			}
		}
	}
	// Keep declarations in a deterministic order (map iteration is not).
	slices.SortStableFunc(out.Tensors[len(g.Tensors):], func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })

	// A start that runs once but is hidden by per-chunk compute is hidden by
	// both copies, unless its wait runs inside the segment: that wait is
	// placed in chunk 0's part of its phase, so only chunk 0's copy is sure
	// to come before it.
	fixHidden := func(n *Node) {
		var hs []string
		copies := chunkCount
		if n.Kind == Start && inSeg(ix.waitOf[ix.pos[n.Name]]) {
			copies = 1
		}
		for _, h := range n.HiddenBy {
			if p, ok := ix.pos[h]; ok && inSeg(p) && chunked[p] {
				for c := 0; c < copies; c++ {
					hs = append(hs, chunkName(h, c))
				}
			} else {
				hs = append(hs, h)
			}
		}
		n.HiddenBy = hs
	}
	for i := 0; i < lo; i++ {
		n := g.Nodes[i].clone()
		fixHidden(&n)
		out.Nodes = append(out.Nodes, n)
	}
	first, last := &g.Nodes[lo], &g.Nodes[hi-1]
	for _, t := range splits {
		sp := Node{Name: "split(" + t + ")@" + first.Name, Kind: Compute, Dir: first.Dir, Region: first.Region, Builtin: Split, Reads: []string{t}}
		for c := 0; c < chunkCount; c++ {
			sp.Writes = append(sp.Writes, name(t, c))
		}
		out.Nodes = append(out.Nodes, sp)
	}
	// Phases end before each wait of a per-chunk collective. The order is
	// valid because inside a phase each chunk keeps the plan's own order,
	// chunk 1 only reads chunk 1 tensors or tensors written once (placed
	// with chunk 0, earlier), and a phase's waits come after both chunks'
	// starts of the previous phases. It overlaps because chunk 1's compute
	// of a phase sits between chunk 0's start and chunk 0's wait.
	for p := lo; p < hi; {
		q := p + 1
		for q < hi && !(g.Nodes[q].Kind == Wait && chunked[q]) {
			q++
		}
		for c := 0; c < chunkCount; c++ {
			for i := p; i < q; i++ {
				switch {
				case chunked[i]:
					out.Nodes = append(out.Nodes, copyNode(&g.Nodes[i], c))
				case late[i] && c == chunkCount-1:
					nd := &g.Nodes[i]
					if nd.Kind == Start {
						for _, mb := range nd.Members {
							sum := Node{Name: "sum(" + mb.In + ")", Kind: Compute, Dir: nd.Dir, Region: nd.Region, Builtin: Sum, Writes: []string{mb.In}}
							for k := 0; k < chunkCount; k++ {
								sum.Reads = append(sum.Reads, name(mb.In, k))
							}
							out.Nodes = append(out.Nodes, sum)
						}
					}
					n := nd.clone()
					fixHidden(&n)
					out.Nodes = append(out.Nodes, n)
				case late[i]:
				case c == 0:
					n := g.Nodes[i].clone()
					fixHidden(&n)
					out.Nodes = append(out.Nodes, n)
				}
			}
		}
		p = q
	}
	recombine := func(out *Graph, t string, at *Node) {
		op, b := Concat, "concat("
		if per[t] == Partial {
			op, b = Sum, "sum("
		}
		rc := Node{Name: b + t + ")", Kind: Compute, Dir: at.Dir, Region: at.Region, Builtin: op, Writes: []string{t}}
		for c := 0; c < chunkCount; c++ {
			rc.Reads = append(rc.Reads, name(t, c))
		}
		out.Nodes = append(out.Nodes, rc)
	}
	// Recombine what is read after the segment, or by nobody (a result of
	// the step must exist under its own name for whoever consumes it).
	// Tensors only read inside the segment never exist whole.
	read := map[string]bool{}
	for i := range g.Nodes {
		if inSeg(i) {
			continue
		}
		for _, e := range ix.preds[i] {
			if e.kind == dataEdge {
				read[e.tensor] = true
			}
		}
	}
	readAny := map[string]bool{}
	for i := range g.Nodes {
		for _, e := range ix.preds[i] {
			if e.kind == dataEdge {
				readAny[e.tensor] = true
			}
		}
	}
	for _, t := range written {
		if !read[t] && readAny[t] {
			continue
		}
		recombine(out, t, last)
	}
	for i := hi; i < len(g.Nodes); i++ {
		if chunked[i] { // the wait of a per-chunk collective started inside
			for c := 0; c < chunkCount; c++ {
				out.Nodes = append(out.Nodes, copyNode(&g.Nodes[i], c))
			}
			for _, mb := range g.Nodes[ix.startOf[i]].Members {
				recombine(out, mb.Out, &g.Nodes[i])
			}
			continue
		}
		n := g.Nodes[i].clone()
		fixHidden(&n)
		out.Nodes = append(out.Nodes, n)
	}
	return out, true, nil
}

// allPartial reports whether every member of start nd reads a per-chunk
// Partial tensor: the collectives that early accumulation may run once.
func allPartial(nd *Node, per map[string]ChunkMode) bool {
	for _, mb := range nd.Members {
		if per[mb.In] != Partial {
			return false
		}
	}
	return len(nd.Members) > 0
}
