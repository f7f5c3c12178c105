package stepgraph

import "github.com/gorun-hpc/gorun/buckets"

// outBytes is the size of a collective member's output on one rank. The
// graph stores input sizes only (the fused buffer is made of inputs); the
// output follows from the op and the group size.
func outBytes(op Op, in int64, ranks int) int64 {
	switch op {
	case buckets.AllGather:
		return in * int64(ranks)
	case buckets.ReduceScatter:
		return in / int64(max(ranks, 1))
	}
	return in
}

// PeakBytes estimates the most bytes the step holds at once beyond its
// inputs, walking the plan in order. A compute's outputs live from the
// compute to their last reader; a collective's outputs from its start (the
// executor allocates the result buffer when it issues the collective) to
// their last reader. Tensors nobody reads are the step's results and live to
// the end. Sizes are the declared ones; collective outputs are derived from
// the members (an all-gather's output is the group size times the shard).
// It also names the node at which the peak is first reached.
func PeakBytes(g *Graph) (int64, string, error) {
	if err := g.Validate(); err != nil {
		return 0, "", err
	}
	peak, at := g.peakBytes()
	return peak, at, nil
}

// peakBytes is PeakBytes of a graph known to be valid (a pass's checked
// result). One map gives every tensor a number; births, last readers and
// sizes live in a slice, so each mention of a tensor costs one lookup.
// The last readers are the data edges validation builds: a compute reads
// its Reads, a start its members' inputs, a wait nothing; a tensor with no
// writer (an input) is not counted.
func (g *Graph) peakBytes() (int64, string) {
	type life struct {
		born, last int
		size       int64
		declared   bool
	}
	id := make(map[string]int, len(g.Tensors)+2*len(g.Nodes))
	lives := make([]life, 0, len(g.Tensors)+2*len(g.Nodes))
	for _, t := range g.Tensors {
		if _, ok := id[t.Name]; !ok {
			id[t.Name] = len(lives)
			lives = append(lives, life{born: -1, last: -1, size: t.Bytes, declared: true})
		}
	}
	birth := func(t string, at int) *life {
		k, ok := id[t]
		if !ok {
			k = len(lives)
			id[t] = k
			lives = append(lives, life{born: -1, last: -1})
		}
		l := &lives[k]
		l.born = at
		return l
	}
	read := func(t string, at int) {
		if k, ok := id[t]; ok && lives[k].born >= 0 {
			lives[k].last = at
		}
	}
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		switch nd.Kind {
		case Compute:
			for _, t := range nd.Reads {
				read(t, i)
			}
			for _, t := range nd.Writes {
				birth(t, i)
			}
		case Start:
			for _, m := range nd.Members {
				read(m.In, i)
			}
			ranks := g.groupSize(nd.Group)
			for _, m := range nd.Members {
				if l := birth(m.Out, i); !l.declared {
					l.size = outBytes(nd.Op, m.Bytes, ranks)
				}
			}
		}
	}
	n := len(g.Nodes)
	delta := make([]int64, n+1)
	for _, l := range lives {
		if l.born < 0 {
			continue
		}
		end := n
		if l.last >= 0 {
			end = l.last + 1
		}
		delta[l.born] += l.size
		delta[end] -= l.size
	}
	return sweep(g, delta)
}

// PeakCollectiveBytes estimates the most bytes of collective outputs (a
// gathered parameter, a reduced gradient) held at once, walking the plan in
// order: an output is held from its start (where the executor needs its
// buffer) until its last reader has run — for a reader that is itself a
// collective (hybrid sharding), until that collective's wait, since the
// collective reads the buffer while it runs. Outputs nobody reads are held
// to the end of the step. This is the quantity overlap's GraphRunner
// measures at run time (StepMetrics.PeakBytes) when it issues starts at
// their plan positions, so the two can be compared; it is where
// reshard-after-forward saves memory. Sizes come from the members (an
// all-gather's output is the group size times the shard). It also names
// the node at which the peak is first reached.
func PeakCollectiveBytes(g *Graph) (int64, string, error) {
	ix, err := g.index()
	if err != nil {
		return 0, "", err
	}
	born := map[string]int{}
	size := map[string]int64{}
	for i := range g.Nodes {
		if nd := &g.Nodes[i]; nd.Kind == Start {
			for _, m := range nd.Members {
				born[m.Out] = i
				size[m.Out] = outBytes(nd.Op, m.Bytes, g.groupSize(nd.Group))
			}
		}
	}
	last := map[string]int{}
	for i := range g.Nodes {
		at := i
		if g.Nodes[i].Kind == Start {
			at = ix.waitOf[i]
		}
		for _, e := range ix.preds[i] {
			if _, ok := born[e.tensor]; ok && e.kind == dataEdge {
				last[e.tensor] = max(last[e.tensor], at)
			}
		}
	}
	return g.sweepPeak(born, last, size)
}

// sweepPeak is the sweep over births and deaths shared by the two
// estimates: +bytes at the node where a tensor appears, −bytes after its
// last reader (at the end of the step when nobody reads it); the running
// sum is what is held. It returns the peak and the node where it is first
// reached.
func (g *Graph) sweepPeak(born, last map[string]int, size map[string]int64) (int64, string, error) {
	n := len(g.Nodes)
	delta := make([]int64, n+1)
	for t, b := range born {
		end := n
		if l, ok := last[t]; ok {
			end = l + 1
		}
		delta[b] += size[t]
		delta[end] -= size[t]
	}
	peak, at := sweep(g, delta)
	return peak, at, nil
}

// sweep runs the prefix sum of delta over the plan and returns its maximum
// and the node where it is first reached.
func sweep(g *Graph, delta []int64) (int64, string) {
	var cur, peak int64
	at := ""
	for i := range g.Nodes {
		cur += delta[i]
		if cur > peak {
			peak, at = cur, g.Nodes[i].Name
		}
	}
	return peak, at
}
