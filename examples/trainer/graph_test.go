package main

import (
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// planOnly is a trainer of o over n ranks with only what buildGraph and
// passes read (newTrainer's layout and group sizes), and no communicator:
// the plan is a pure function of these.
func planOnly(t *testing.T, o options, n int) *trainer {
	t.Helper()
	m, err := model.New(o.modelConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr := &trainer{o: o, m: m, lay: m.Layout(), N: n, S: 1, n: o.batch / n, shardGroup: world,
		sharded: o.mode != "dp", hsdp: o.mode == "hsdp"}
	switch {
	case tr.hsdp:
		tr.S, tr.shardGroup = 2, "shard"
	case tr.sharded:
		tr.S = n
	}
	return tr
}

// TestOptimizerWaitsAfterBackward: the waits the optimizer blocks on (each
// block's gradient reductions, and the loss's) belong to the optimizer,
// though Builder.Wait labels a wait with its start's direction (backward,
// forward for the loss). Two things follow, in every mode, chunked or not:
//
//   - the plan says so: every wait after backward's last block is an
//     optimizer wait (what --dump-graph and the plan's text show);
//   - the chunk pass, whose segments are runs of one direction, ends
//     backward's last segment at backward's own work: the segment's
//     recombined results (Concat, Sum) come before the optimizer's first
//     wait, as compute that can hide the reductions in flight, instead
//     of behind that wait.
func TestOptimizerWaitsAfterBackward(t *testing.T) {
	type flags struct {
		name                      string
		chunk, accumulate, always bool
	}
	for _, mode := range []string{"dp", "sharded", "hsdp"} {
		for _, f := range []flags{
			{"whole", false, true, false},
			{"chunked", true, true, true},
			{"per-chunk reduction", true, false, false},
		} {
			if mode == "hsdp" && !f.accumulate {
				continue // refused by options.validate
			}
			o := smallOptions()
			o.mode, o.chunk, o.chunkAccumulate, o.chunkForce = mode, f.chunk, f.accumulate, f.always
			tr := planOnly(t, o, 4)
			g, err := tr.buildGraph()
			if err != nil {
				t.Fatalf("%s %s: %v", mode, f.name, err)
			}
			if g, _, err = tr.passes(g); err != nil {
				t.Fatalf("%s %s: %v", mode, f.name, err)
			}
			if err := checkOptimizerWaits(g); err != "" {
				t.Errorf("%s %s: %s\n%s", mode, f.name, err, stepgraph.Format(g))
			}
		}
	}
}

// checkOptimizerWaits returns what in g breaks TestOptimizerWaitsAfterBackward's
// rules ("" if nothing). Backward's last block is found by the trainer's
// names ("bwd.R", "bwd.R#c"), not by direction labels.
func checkOptimizerWaits(g *stepgraph.Graph) string {
	last := -1
	for i, n := range g.Nodes {
		if n.Kind == stepgraph.Compute && strings.HasPrefix(n.Name, "bwd.") {
			last = i
		}
	}
	if last < 0 {
		return "no backward compute in the plan"
	}
	firstWait := -1
	for i := last + 1; i < len(g.Nodes); i++ {
		n := &g.Nodes[i]
		switch {
		case n.Kind == stepgraph.Wait && n.Dir != buckets.Optimizer:
			return "wait " + n.Name + " after backward is labeled " + string(n.Dir) + ", not optimizer"
		case n.Kind == stepgraph.Wait && firstWait < 0:
			firstWait = i
		case n.Kind == stepgraph.Compute && n.Dir == buckets.Backward && firstWait >= 0:
			return "backward's " + n.Name + " runs after the optimizer's wait " + g.Nodes[firstWait].Name
		}
	}
	if firstWait < 0 {
		return "no wait after backward"
	}
	return ""
}
