package stepgraph

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gorun-hpc/gorun/buckets"
)

// Sentinel errors; Validate wraps them in a *NodeError naming the node.
var (
	ErrInvalid          = errors.New("stepgraph: invalid node")
	ErrCycle            = errors.New("stepgraph: dependency cycle")
	ErrWaitWithoutStart = errors.New("stepgraph: wait without start")
	ErrStartWithoutWait = errors.New("stepgraph: start without wait")
	ErrReadBeforeWrite  = errors.New("stepgraph: tensor read before written")
	ErrUnknownRegion    = errors.New("stepgraph: unknown region")
	ErrOrder            = errors.New("stepgraph: scheduled before a dependency")
)

// NodeError is a validation failure of one node.
type NodeError struct {
	Node   string
	Err    error // one of the sentinels above
	Detail string
}

func (e *NodeError) Error() string { return fmt.Sprintf("%v: node %q: %s", e.Err, e.Node, e.Detail) }

// Unwrap lets errors.Is match the sentinel.
func (e *NodeError) Unwrap() error { return e.Err }

type edgeKind uint8

const (
	dataEdge edgeKind = iota // writer → reader of a tensor
	waitEdge                 // start → its wait
	hideEdge                 // start → hiding compute → wait
	fifoEdge                 // start → next start on the same group
)

type edge struct {
	from   int32
	kind   edgeKind
	tensor string // for data edges
}

// index is the derived structure of a valid graph that passes share.
type index struct {
	pos     map[string]int
	writer  map[string]int // tensor → writing node, -1 for an input
	waitOf  []int          // start → its wait, else -1
	startOf []int          // wait → its start, else -1
	preds   [][]edge
	byGroup map[string][]int // starts per group in issue order
}

// Validate checks the graph and returns the first problem found, as a
// *NodeError naming the node: malformed nodes, duplicate names, a wait
// without a start (or a start never waited), a tensor read that nothing
// writes, a directional collective in an undeclared region, a dependency
// cycle, and a plan order that runs a node before something it depends on.
func (g *Graph) Validate() error {
	_, err := g.index()
	return err
}

func nodeErr(n *Node, err error, format string, args ...any) error {
	return &NodeError{Node: n.Name, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// regionSet returns a membership test for declared blocks and paths below
// them ("layers.3.attn" is in "layers.3"): a set lookup per ancestor, so
// validating n nodes costs O(n·depth), not O(n·regions).
func (g *Graph) regionSet() func(string) bool {
	set := make(map[string]bool, len(g.Regions))
	for _, r := range g.Regions {
		set[r] = true
	}
	return func(region string) bool {
		for {
			if set[region] {
				return true
			}
			i := strings.LastIndexByte(region, '.')
			if i < 0 {
				return false
			}
			region = region[:i]
		}
	}
}

// index validates g and builds its index: the declarations, then each
// node's own fields and writes (pass 1), then the edges (pass 2), and
// last the checks over the whole graph, cycles before order.
func (g *Graph) index() (*index, error) {
	n := len(g.Nodes)
	ix := &index{
		pos:    make(map[string]int, n),
		waitOf: make([]int, n), startOf: make([]int, n),
		preds: make([][]edge, n), byGroup: map[string][]int{},
	}
	// Declarations first: nodes are checked against them.
	if err := g.indexDecls(ix); err != nil {
		return nil, err
	}
	regionKnown := g.regionSet()
	// Pass 1: names, per-kind fields, writers. Writers must all be known
	// before any read is resolved, because a read that precedes its writer
	// in plan order is an order error (reported with both names), not a
	// missing tensor.
	for i := range g.Nodes {
		if err := g.indexNode(ix, i, regionKnown); err != nil {
			return nil, err
		}
	}
	// Pass 2: edges. Every edge is stored on its head (preds), which is what
	// the order check, the simulator and the passes walk.
	for i := range g.Nodes {
		if err := g.indexEdges(ix, i); err != nil {
			return nil, err
		}
	}
	ix.chainGroups()
	// Cycles are reported before order errors: a cycle has no valid order,
	// and naming it tells the author what to break. A plan order in which
	// every edge points back is a topological order, so there is no cycle
	// to look for.
	if !ix.ordered() {
		if err := g.findCycle(ix); err != nil {
			return nil, err
		}
	}
	if err := g.checkOrder(ix); err != nil {
		return nil, err
	}
	return ix, nil
}

// indexDecls checks the declared groups and tensors and records the
// inputs as written by -1.
func (g *Graph) indexDecls(ix *index) error {
	for _, gr := range g.Groups {
		if gr.Name == "" || gr.Size < 1 {
			return fmt.Errorf("%w: group %q of size %d", ErrInvalid, gr.Name, gr.Size)
		}
	}
	// writer maps every tensor to its writer, or to -1 for an input: one
	// lookup answers "input, written, or unknown" (validation is a map
	// lookup per tensor mention, the planner's largest fixed cost).
	ix.writer = make(map[string]int, len(g.Tensors)+2*len(g.Nodes))
	for _, t := range g.Tensors {
		if t.Input {
			ix.writer[t.Name] = -1
		}
		switch t.Chunk {
		case "", Batch, Partial, Replicated:
		default:
			return fmt.Errorf("%w: tensor %q has chunk mode %q", ErrInvalid, t.Name, t.Chunk)
		}
	}
	return nil
}

// indexNode is pass 1 for node i: its name, its kind's own fields, and the
// tensors it writes.
func (g *Graph) indexNode(ix *index, i int, regionKnown func(string) bool) error {
	nd := &g.Nodes[i]
	ix.waitOf[i], ix.startOf[i] = -1, -1
	if nd.Name == "" {
		return fmt.Errorf("%w: node %d has no name", ErrInvalid, i)
	}
	// One map operation: a name seen before leaves the map's size as it
	// was.
	had := len(ix.pos)
	if ix.pos[nd.Name] = i; len(ix.pos) == had {
		return nodeErr(nd, ErrInvalid, "name used twice")
	}
	if !nd.Dir.Valid() {
		return nodeErr(nd, ErrInvalid, "unknown direction %q", nd.Dir)
	}
	var writes []string
	var err error
	switch nd.Kind {
	case Compute:
		err, writes = checkCompute(nd), nd.Writes
	case Start:
		err = g.checkStart(nd, regionKnown)
		ix.byGroup[nd.Group] = append(ix.byGroup[nd.Group], i)
	case Wait:
		writes, err = g.indexWait(ix, i, regionKnown)
	default:
		err = nodeErr(nd, ErrInvalid, "unknown kind %q", nd.Kind)
	}
	if err != nil {
		return err
	}
	for _, t := range writes {
		had := len(ix.writer)
		if ix.writer[t] = i; len(ix.writer) == had {
			return g.rewriteErr(i, t)
		}
	}
	return nil
}

// checkCompute checks a compute node's cost, built-in and chunk.
func checkCompute(nd *Node) error {
	if nd.Cost < 0 {
		return nodeErr(nd, ErrInvalid, "negative cost %v", nd.Cost)
	}
	// Built-ins are run by the executor from their reads and writes alone,
	// so their shape must be exact.
	switch nd.Builtin {
	case "":
	case Split:
		if len(nd.Reads) != 1 || len(nd.Writes) < 2 {
			return nodeErr(nd, ErrInvalid, "split reads one tensor and writes one per chunk")
		}
	case Concat, Sum:
		if len(nd.Reads) < 2 || len(nd.Writes) != 1 {
			return nodeErr(nd, ErrInvalid, "%s reads one tensor per chunk and writes one", nd.Builtin)
		}
	default:
		return nodeErr(nd, ErrInvalid, "unknown builtin %q", nd.Builtin)
	}
	if c := nd.Chunk; c != nil && (c.Of == "" || c.Count < 2 || c.Index < 0 || c.Index >= c.Count) {
		return nodeErr(nd, ErrInvalid, "chunk %d of %d of %q", c.Index, c.Count, c.Of)
	}
	return nil
}

// checkStart checks a collective's op, group, dtype, members and region.
func (g *Graph) checkStart(nd *Node, regionKnown func(string) bool) error {
	if !nd.Op.Valid() {
		return nodeErr(nd, ErrInvalid, "unknown op %q", nd.Op)
	}
	if g.groupSize(nd.Group) == 0 {
		return nodeErr(nd, ErrInvalid, "undeclared group %q", nd.Group)
	}
	es := buckets.DTypeSize(nd.DType)
	if es == 0 {
		return nodeErr(nd, ErrInvalid, "unknown dtype %q", nd.DType)
	}
	if len(nd.Members) == 0 {
		return nodeErr(nd, ErrInvalid, "collective without members")
	}
	for _, m := range nd.Members {
		if m.In == "" || m.Out == "" || m.In == m.Out {
			return nodeErr(nd, ErrInvalid, "member %q→%q: in and out must be named and differ (tensors are written once)", m.In, m.Out)
		}
		if m.Bytes <= 0 || m.Bytes%es != 0 {
			return nodeErr(nd, ErrInvalid, "member %q has %d bytes, not a positive multiple of %s", m.In, m.Bytes, nd.DType)
		}
	}
	if (nd.Dir == buckets.Forward || nd.Dir == buckets.Backward) && !regionKnown(nd.Region) {
		return nodeErr(nd, ErrUnknownRegion, "%s collective in region %q, which is not among the declared regions %v", nd.Dir, nd.Region, g.Regions)
	}
	return nil
}

// indexWait pairs wait i with its start and returns what it writes: the
// collective's outputs.
func (g *Graph) indexWait(ix *index, i int, regionKnown func(string) bool) ([]string, error) {
	nd := &g.Nodes[i]
	// pos only holds nodes seen so far, so a start scheduled after its
	// wait is told apart from a start that does not exist.
	s, ok := ix.pos[nd.Of]
	if !ok {
		if j := slices.IndexFunc(g.Nodes, func(o Node) bool { return o.Name == nd.Of }); j > i {
			return nil, nodeErr(nd, ErrOrder, "waits for %q, which is scheduled after it", nd.Of)
		}
		return nil, nodeErr(nd, ErrWaitWithoutStart, "waits for %q, which is not a node", nd.Of)
	}
	if g.Nodes[s].Kind != Start {
		return nil, nodeErr(nd, ErrWaitWithoutStart, "waits for %q, a %s node", nd.Of, g.Nodes[s].Kind)
	}
	if ix.waitOf[s] >= 0 {
		return nil, nodeErr(nd, ErrInvalid, "start %q already waited by %q", nd.Of, g.Nodes[ix.waitOf[s]].Name)
	}
	// One wait per start: a second wait would have nothing left to
	// complete, and the executor frees the handle at the first.
	ix.waitOf[s], ix.startOf[i] = i, s
	if (nd.Dir == buckets.Forward || nd.Dir == buckets.Backward) && !regionKnown(nd.Region) {
		return nil, nodeErr(nd, ErrUnknownRegion, "%s wait in region %q, which is not among the declared regions %v", nd.Dir, nd.Region, g.Regions)
	}
	// A collective's outputs are written by its wait: that is the moment
	// readers may use them.
	var writes []string
	for _, m := range g.Nodes[s].Members {
		writes = append(writes, m.Out)
	}
	return writes, nil
}

// indexEdges is pass 2 for node i: the edges into it from the writers of
// what it reads, and for a start the edges into its wait and its hiding
// compute.
func (g *Graph) indexEdges(ix *index, i int) error {
	nd := &g.Nodes[i]
	var reads []string
	switch nd.Kind {
	case Compute:
		reads = nd.Reads
	case Start:
		if ix.waitOf[i] < 0 {
			return nodeErr(nd, ErrStartWithoutWait, "no wait completes it")
		}
		for _, m := range nd.Members {
			reads = append(reads, m.In)
		}
		w := ix.waitOf[i]
		ix.preds[w] = append(ix.preds[w], edge{from: int32(i), kind: waitEdge})
		for _, h := range nd.HiddenBy {
			c, ok := ix.pos[h]
			if !ok || g.Nodes[c].Kind != Compute {
				return nodeErr(nd, ErrInvalid, "hidden by %q, which is not a compute node", h)
			}
			ix.preds[c] = append(ix.preds[c], edge{from: int32(i), kind: hideEdge})
			ix.preds[w] = append(ix.preds[w], edge{from: int32(c), kind: hideEdge})
		}
	}
	for _, t := range reads {
		w, ok := ix.writer[t]
		if !ok {
			return nodeErr(nd, ErrReadBeforeWrite, "reads tensor %q, which no node writes and is not an input", t)
		}
		if w < 0 {
			continue // an input
		}
		ix.preds[i] = append(ix.preds[i], edge{from: int32(w), kind: dataEdge, tensor: t})
	}
	return nil
}

// chainGroups adds the FIFO chain: a group runs its collectives in issue
// order, so each start depends on the previous start of its group.
func (ix *index) chainGroups() {
	for _, starts := range ix.byGroup {
		for k := 1; k < len(starts); k++ {
			ix.preds[starts[k]] = append(ix.preds[starts[k]], edge{from: int32(starts[k-1]), kind: fifoEdge})
		}
	}
}

// checkOrder: plan order must be a topological order of the edges. The
// executor runs nodes in plan order and never reorders them, so an edge
// pointing backwards would deadlock (a wait before its start) or read
// garbage.
func (g *Graph) checkOrder(ix *index) error {
	for i := range g.Nodes {
		for _, e := range ix.preds[i] {
			if int(e.from) < i {
				continue
			}
			nd, from := &g.Nodes[i], g.Nodes[e.from].Name
			switch e.kind {
			case dataEdge:
				return nodeErr(nd, ErrReadBeforeWrite, "reads tensor %q before node %q writes it", e.tensor, from)
			case hideEdge:
				return nodeErr(nd, ErrOrder, "must follow %q (a collective it hides, or compute hiding its collective)", from)
			default:
				return nodeErr(nd, ErrOrder, "scheduled before %q, which it depends on", from)
			}
		}
	}
	return nil
}

// ordered reports whether every edge runs from an earlier node to a later
// one in plan order.
func (ix *index) ordered() bool {
	for i, ps := range ix.preds {
		for _, e := range ps {
			if int(e.from) >= i {
				return false
			}
		}
	}
	return true
}

// rewriteErr is the error of node i writing tensor t a second time: t is an
// input, or an earlier node wrote it. Only the error path searches.
func (g *Graph) rewriteErr(i int, t string) error {
	nd := &g.Nodes[i]
	for _, d := range g.Tensors {
		if d.Input && d.Name == t {
			return nodeErr(nd, ErrInvalid, "writes input tensor %q (tensors are written once; write a new name)", t)
		}
	}
	for j := range g.Nodes[:i] {
		if slices.Contains(g.Nodes[j].writes(g), t) {
			return nodeErr(nd, ErrInvalid, "writes tensor %q, already written by %q", t, g.Nodes[j].Name)
		}
	}
	return nodeErr(nd, ErrInvalid, "writes tensor %q twice", t)
}

// findCycle runs Kahn's algorithm on the dependency edges, ignoring plan
// order, and reports one cycle by name if some nodes never become ready.
func (g *Graph) findCycle(ix *index) error {
	n := len(g.Nodes)
	indeg := make([]int, n)
	succ := make([][]int32, n)
	for i, ps := range ix.preds {
		for _, e := range ps {
			succ[e.from] = append(succ[e.from], int32(i))
			indeg[i]++
		}
	}
	queue := make([]int32, 0, n)
	for i := range indeg {
		if indeg[i] == 0 {
			queue = append(queue, int32(i))
		}
	}
	for h := 0; h < len(queue); h++ {
		for _, s := range succ[queue[h]] {
			if indeg[s]--; indeg[s] == 0 {
				queue = append(queue, s)
			}
		}
	}
	if len(queue) == n {
		return nil
	}
	// Every node left has a blocked predecessor, so walking blocked
	// predecessors from any of them must come back to a node already seen.
	// Walk predecessors that are still blocked until a node repeats.
	cur := slices.IndexFunc(indeg, func(d int) bool { return d > 0 })
	seen := map[int]int{}
	var path []int
	for {
		if at, ok := seen[cur]; ok {
			path = path[at:]
			break
		}
		seen[cur] = len(path)
		path = append(path, cur)
		for _, e := range ix.preds[cur] {
			if indeg[e.from] > 0 {
				cur = int(e.from)
				break
			}
		}
	}
	names := make([]string, 0, len(path)+1)
	for k := len(path) - 1; k >= 0; k-- {
		names = append(names, g.Nodes[path[k]].Name)
	}
	names = append(names, names[0])
	return nodeErr(&g.Nodes[path[len(path)-1]], ErrCycle, "%s", strings.Join(names, " → "))
}

// writes lists the tensors node n writes: a compute's Writes, a wait's
// start's outputs (nil for a wait whose start is not a node).
func (n *Node) writes(g *Graph) []string {
	switch n.Kind {
	case Compute:
		return n.Writes
	case Wait:
		for j := range g.Nodes {
			if s := &g.Nodes[j]; s.Name == n.Of && s.Kind == Start {
				out := make([]string, len(s.Members))
				for k, m := range s.Members {
					out[k] = m.Out
				}
				return out
			}
		}
	}
	return nil
}
