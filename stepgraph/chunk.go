package stepgraph

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

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

// defaultChunkCount is two: the point is that one chunk's communication
// overlaps the other's compute, which two chunks already give; more chunks
// (ChunkConfig.Count) add a latency each, for a finer pipeline.
const defaultChunkCount = 2

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
	// Count is the number of chunks (0: two). Chunk c's communication
	// overlaps chunk c+1's compute.
	Count int
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
	if cfg.Count < 0 || cfg.Count == 1 {
		return fmt.Errorf("%w: a chunk count of %d (want 2 or more, 0 for the default %d)", ErrChunk, cfg.Count, defaultChunkCount)
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
		next, changed, err := cur.chunkSegment(cix, cix.pos[segs[k].first], cix.pos[segs[k].last]+1, cfg.Accumulate, cfg.count())
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

// count is the number of chunks the config asks for.
func (cfg ChunkConfig) count() int {
	if cfg.Count == 0 {
		return defaultChunkCount
	}
	return cfg.Count
}

func chunkName(name string, c int) string { return name + "#" + strconv.Itoa(c) }

// chunkSegment splits nodes [lo, hi) of g; see Chunk. It decides which
// nodes run per chunk, and then writes the new plan in order: the nodes
// before the segment, the splits of batch inputs, the segment phase by
// phase, the recombined results, and the nodes after it.
func (g *Graph) chunkSegment(ix *index, lo, hi int, accumulate bool, count int) (*Graph, bool, error) {
	s := newSegment(g, ix, lo, hi, count)
	if err := s.decide(accumulate); err != nil {
		return nil, false, err
	}
	if err := s.checkAccumulatedReads(); err != nil {
		return nil, false, err
	}
	if !slices.Contains(s.chunked, true) {
		return g, false, nil // nothing here reads a per-chunk tensor
	}
	out := s.newGraph()
	s.emitBefore(out)
	s.emitSplits(out)
	s.emitPhases(out)
	s.emitRecombined(out)
	s.emitAfter(out)
	return out, true, nil
}

// segment is the state of one chunkSegment call: the plan, the segment's
// bounds, and what has been decided about its tensors and nodes.
type segment struct {
	g      *Graph
	ix     *index
	lo, hi int
	decl   map[string]Tensor

	per     map[string]ChunkMode // per-chunk tensors → how they recombine
	splits  []string             // batch tensors from outside, split at their first read
	written []string             // per-chunk tensors written in the segment
	// chunked[i]: node i runs once per chunk. Decided in plan order, since
	// whether a node is per chunk depends on what earlier nodes wrote.
	chunked []bool
	// late[i]: node i runs once, after the last chunk's part of its phase:
	// an accumulated collective's start (after the Sum of its inputs) and
	// its wait when that is in the segment.
	late  []bool
	names map[string][]string // see name
	count int                 // chunks
}

func newSegment(g *Graph, ix *index, lo, hi, count int) *segment {
	s := &segment{
		g: g, ix: ix, lo: lo, hi: hi,
		decl:    map[string]Tensor{},
		per:     map[string]ChunkMode{},
		chunked: make([]bool, len(g.Nodes)),
		late:    make([]bool, len(g.Nodes)),
		names:   map[string][]string{},
		count:   count,
	}
	for _, t := range g.Tensors {
		s.decl[t.Name] = t
	}
	return s
}

func (s *segment) inSeg(p int) bool { return p >= s.lo && p < s.hi }

// mode is how tensor t splits. The default modes follow what tensors
// usually are: compute writes activations (batch-major), inputs are
// parameters or the batch itself (declare the batch as Batch), and
// collectives mostly deliver parameters. Weight gradients are the case
// defaults cannot guess: they must be declared Partial.
func (s *segment) mode(t string) ChunkMode {
	if d, ok := s.decl[t]; ok && d.Chunk != "" {
		return d.Chunk
	}
	if w, ok := s.ix.writer[t]; ok && w >= 0 && s.g.Nodes[w].Kind == Compute { // -1: an input
		return Batch
	}
	return Replicated
}

// perChunk decides, at a node's read, whether the tensor exists per
// chunk; a batch tensor from outside is split once, at its first read.
func (s *segment) perChunk(t string) bool {
	if _, ok := s.per[t]; ok {
		return true
	}
	if w, ok := s.ix.writer[t]; ok && s.inSeg(w) {
		return false // written in the segment by a node that runs once
	}
	if s.mode(t) == Batch {
		s.per[t] = Batch
		s.splits = append(s.splits, t)
		return true
	}
	return false
}

// decide walks the segment in plan order and marks which nodes run per
// chunk, which run late, and which tensors exist per chunk.
func (s *segment) decide(accumulate bool) error {
	for i := s.lo; i < s.hi; i++ {
		nd := &s.g.Nodes[i]
		if nd.Chunk != nil || nd.Builtin != "" {
			return nodeErr(nd, ErrChunk, "already chunked")
		}
		var err error
		switch nd.Kind {
		case Compute:
			err = s.decideCompute(i)
		case Start:
			err = s.decideStart(i, accumulate)
		case Wait:
			s.chunked[i] = s.chunked[s.ix.startOf[i]]
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decideCompute: compute runs per chunk when it reads a per-chunk tensor,
// and then everything it writes is per chunk too.
func (s *segment) decideCompute(i int) error {
	nd := &s.g.Nodes[i]
	for _, r := range nd.Reads {
		if s.perChunk(r) {
			s.chunked[i] = true
		}
	}
	if !s.chunked[i] {
		return nil
	}
	for _, w := range nd.Writes {
		md := s.mode(w)
		if md == Replicated {
			return nodeErr(nd, ErrChunk, "runs per chunk but writes %q, declared replicated", w)
		}
		s.per[w] = md
		s.written = append(s.written, w)
	}
	return nil
}

// decideStart: a collective runs per chunk when all its members read
// per-chunk tensors, or once, late, when accumulating Partial inputs.
func (s *segment) decideStart(i int, accumulate bool) error {
	nd := &s.g.Nodes[i]
	n := 0
	for _, mb := range nd.Members {
		if s.perChunk(mb.In) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if n != len(nd.Members) {
		return nodeErr(nd, ErrChunk, "mixes per-chunk and replicated members")
	}
	if accumulate && allPartial(nd, s.per) {
		// Early accumulation: the members' inputs are summed in front of
		// the start (see emitPhases), which then reads them whole, once.
		s.late[i] = true
		if w := s.ix.waitOf[i]; s.inSeg(w) {
			s.late[w] = true
		}
		return nil
	}
	es := buckets.DTypeSize(nd.DType)
	later := !s.inSeg(s.ix.waitOf[i]) // waited after the segment
	for _, mb := range nd.Members {
		if s.per[mb.In] == Batch && (mb.Bytes%int64(s.count) != 0 || (mb.Bytes/int64(s.count))%es != 0) {
			return nodeErr(nd, ErrChunk, "member %q of %d bytes does not split into %d whole chunks of %s", mb.In, mb.Bytes, s.count, nd.DType)
		}
		s.per[mb.Out] = s.per[mb.In]
		if !later {
			s.written = append(s.written, mb.Out)
		}
	}
	s.chunked[i] = true
	if later {
		// Both chunks' waits stay where the wait was, and the outputs are
		// recombined right after them.
		s.chunked[s.ix.waitOf[i]] = true
	}
	return nil
}

// checkAccumulatedReads refuses a segment where a node placed with chunk 0
// reads an accumulated collective's output: it would run before that
// collective starts.
func (s *segment) checkAccumulatedReads() error {
	for i := s.lo; i < s.hi; i++ {
		if s.g.Nodes[i].Kind != Wait || !s.late[i] {
			continue
		}
		start := &s.g.Nodes[s.ix.startOf[i]]
		for _, mb := range start.Members {
			for j := i + 1; j < s.hi; j++ {
				if !s.late[j] && slices.Contains(s.g.Nodes[j].Reads, mb.Out) {
					return nodeErr(&s.g.Nodes[j], ErrChunk, "reads %q, the output of accumulated collective %q, inside the chunked segment", mb.Out, start.Name)
				}
			}
		}
	}
	return nil
}

// taken reports whether n already names a tensor of the plan.
func (s *segment) taken(n string) bool {
	_, w := s.ix.writer[n]
	_, d := s.decl[n]
	return w || d
}

// name is tensor t's name in chunk c: T#0 and T#1, primed when an earlier
// segment already split T under those names; t itself when t is not per
// chunk.
func (s *segment) name(t string, c int) string {
	if _, ok := s.per[t]; !ok {
		return t
	}
	ns, ok := s.names[t]
	if !ok {
		suffix := ""
		for s.anyTaken(t, suffix) {
			suffix += "'"
		}
		ns = make([]string, s.count)
		for k := range ns {
			ns[k] = chunkName(t, k) + suffix
		}
		s.names[t] = ns
	}
	return ns[c]
}

// anyTaken reports whether a chunk name of t with suffix is taken.
func (s *segment) anyTaken(t, suffix string) bool {
	for c := 0; c < s.count; c++ {
		if s.taken(chunkName(t, c) + suffix) {
			return true
		}
	}
	return false
}

// copyNode is chunk c's copy of a per-chunk node.
func (s *segment) copyNode(nd *Node, c int) Node {
	n := nd.clone()
	n.Name = chunkName(nd.Name, c)
	for k, r := range n.Reads {
		n.Reads[k] = s.name(r, c)
	}
	for k, w := range n.Writes {
		n.Writes[k] = s.name(w, c)
	}
	switch nd.Kind {
	case Compute:
		n.Chunk = &ChunkRef{Of: nd.Name, Index: c, Count: s.count}
		// Parts that add up to the whole, so totals stay exact.
		k := time.Duration(s.count)
		n.Cost = nd.Cost / k
		if c == s.count-1 {
			n.Cost = nd.Cost - nd.Cost/k*(k-1)
		}
	case Start:
		for k, mb := range n.Members {
			n.Members[k].In, n.Members[k].Out = s.name(mb.In, c), s.name(mb.Out, c)
			if s.per[mb.In] == Batch {
				n.Members[k].Bytes = mb.Bytes / int64(s.count)
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
			switch p := s.ix.pos[h]; {
			case s.inSeg(p) && s.chunked[p]:
				n.HiddenBy = append(n.HiddenBy, chunkName(h, c))
			case c == 0 || !s.inSeg(p):
				n.HiddenBy = append(n.HiddenBy, h)
			}
		}
	case Wait:
		n.Of = chunkName(nd.Of, c)
	}
	return n
}

// onceNode is a clone of a node that runs once, hidden by the copies of
// the per-chunk compute that hid it. A start that runs once but is hidden
// by per-chunk compute is hidden by both copies, unless its wait runs
// inside the segment: that wait is placed in chunk 0's part of its phase,
// so only chunk 0's copy is sure to come before it.
func (s *segment) onceNode(nd *Node) Node {
	n := nd.clone()
	var hs []string
	copies := s.count
	if n.Kind == Start && s.inSeg(s.ix.waitOf[s.ix.pos[n.Name]]) {
		copies = 1
	}
	for _, h := range n.HiddenBy {
		if p, ok := s.ix.pos[h]; ok && s.inSeg(p) && s.chunked[p] {
			for c := 0; c < copies; c++ {
				hs = append(hs, chunkName(h, c))
			}
		} else {
			hs = append(hs, h)
		}
	}
	n.HiddenBy = hs
	return n
}

// newGraph is the new plan without nodes: g's groups, regions and tensors,
// plus the per-chunk declarations of declared tensors.
func (s *segment) newGraph() *Graph {
	g := s.g
	out := &Graph{Groups: slices.Clone(g.Groups), Regions: slices.Clone(g.Regions), Tensors: slices.Clone(g.Tensors)}
	// Room for every segment node twice plus the splits and joins: one
	// allocation instead of a doubling copy of a large step.
	out.Nodes = make([]Node, 0, len(g.Nodes)+(s.hi-s.lo)+2*len(s.per)+8)
	for t, md := range s.per {
		if d, ok := s.decl[t]; ok && d.Bytes > 0 {
			b := d.Bytes
			if md == Batch {
				b /= int64(s.count)
			}
			for c := 0; c < s.count; c++ {
				out.Tensors = append(out.Tensors, Tensor{Name: s.name(t, c), Bytes: b})
			}
		}
	}
	// Keep declarations in a deterministic order (map iteration is not).
	slices.SortStableFunc(out.Tensors[len(g.Tensors):], func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// emitBefore writes the nodes before the segment.
func (s *segment) emitBefore(out *Graph) {
	for i := 0; i < s.lo; i++ {
		out.Nodes = append(out.Nodes, s.onceNode(&s.g.Nodes[i]))
	}
}

// emitSplits writes a Split of each batch tensor from outside the
// segment, in front of it.
func (s *segment) emitSplits(out *Graph) {
	first := &s.g.Nodes[s.lo]
	for _, t := range s.splits {
		sp := Node{Name: "split(" + t + ")@" + first.Name, Kind: Compute, Dir: first.Dir, Region: first.Region, Builtin: Split, Reads: []string{t}}
		for c := 0; c < s.count; c++ {
			sp.Writes = append(sp.Writes, s.name(t, c))
		}
		out.Nodes = append(out.Nodes, sp)
	}
}

// emitPhases writes the segment phase by phase. Phases end before each
// wait of a per-chunk collective. The order is valid because inside a
// phase each chunk keeps the plan's own order, chunk 1 only reads chunk 1
// tensors or tensors written once (placed with chunk 0, earlier), and a
// phase's waits come after both chunks' starts of the previous phases. It
// overlaps because chunk 1's compute of a phase sits between chunk 0's
// start and chunk 0's wait.
func (s *segment) emitPhases(out *Graph) {
	for p := s.lo; p < s.hi; {
		q := p + 1
		for q < s.hi && !(s.g.Nodes[q].Kind == Wait && s.chunked[q]) {
			q++
		}
		for c := 0; c < s.count; c++ {
			for i := p; i < q; i++ {
				nd := &s.g.Nodes[i]
				switch {
				case s.chunked[i]:
					out.Nodes = append(out.Nodes, s.copyNode(nd, c))
				case s.late[i] && c == s.count-1:
					if nd.Kind == Start {
						s.emitAccumulate(out, nd)
					}
					out.Nodes = append(out.Nodes, s.onceNode(nd))
				case s.late[i]:
				case c == 0:
					out.Nodes = append(out.Nodes, s.onceNode(nd))
				}
			}
		}
		p = q
	}
}

// emitAccumulate writes the Sum of each member's per-chunk inputs, in
// front of accumulated start nd.
func (s *segment) emitAccumulate(out *Graph, nd *Node) {
	for _, mb := range nd.Members {
		sum := Node{Name: "sum(" + mb.In + ")", Kind: Compute, Dir: nd.Dir, Region: nd.Region, Builtin: Sum, Writes: []string{mb.In}}
		for k := 0; k < s.count; k++ {
			sum.Reads = append(sum.Reads, s.name(mb.In, k))
		}
		out.Nodes = append(out.Nodes, sum)
	}
}

// recombine writes the Concat (or, for a Partial tensor, the Sum) that
// makes t whole again, placed with node at.
func (s *segment) recombine(out *Graph, t string, at *Node) {
	op, b := Concat, "concat("
	if s.per[t] == Partial {
		op, b = Sum, "sum("
	}
	rc := Node{Name: b + t + ")", Kind: Compute, Dir: at.Dir, Region: at.Region, Builtin: op, Writes: []string{t}}
	for c := 0; c < s.count; c++ {
		rc.Reads = append(rc.Reads, s.name(t, c))
	}
	out.Nodes = append(out.Nodes, rc)
}

// emitRecombined recombines, at the end of the segment, what is read after
// it or by nobody (a result of the step must exist under its own name for
// whoever consumes it). Tensors only read inside the segment never exist
// whole.
func (s *segment) emitRecombined(out *Graph) {
	read, readAny := map[string]bool{}, map[string]bool{}
	for i := range s.g.Nodes {
		for _, e := range s.ix.preds[i] {
			if e.kind != dataEdge {
				continue
			}
			readAny[e.tensor] = true
			if !s.inSeg(i) {
				read[e.tensor] = true
			}
		}
	}
	last := &s.g.Nodes[s.hi-1]
	for _, t := range s.written {
		if !read[t] && readAny[t] {
			continue
		}
		s.recombine(out, t, last)
	}
}

// emitAfter writes the nodes after the segment: the waits of per-chunk
// collectives started inside it (both copies, then the recombined outputs)
// and the rest once.
func (s *segment) emitAfter(out *Graph) {
	for i := s.hi; i < len(s.g.Nodes); i++ {
		nd := &s.g.Nodes[i]
		if !s.chunked[i] {
			out.Nodes = append(out.Nodes, s.onceNode(nd))
			continue
		}
		for c := 0; c < s.count; c++ {
			out.Nodes = append(out.Nodes, s.copyNode(nd, c))
		}
		for _, mb := range s.g.Nodes[s.ix.startOf[i]].Members {
			s.recombine(out, mb.Out, nd)
		}
	}
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
