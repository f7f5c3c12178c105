package stepgraph

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// The planner's fast paths against the straightforward forms they replace,
// on random graphs and on the passes' outputs.

// peakBytesRef is PeakBytes as first written: maps keyed by tensor name and
// the data edges of the index.
func peakBytesRef(g *Graph) (int64, string, error) {
	ix, err := g.index()
	if err != nil {
		return 0, "", err
	}
	size := map[string]int64{}
	for _, t := range g.Tensors {
		size[t.Name] = t.Bytes
	}
	born := map[string]int{}
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		switch nd.Kind {
		case Compute:
			for _, t := range nd.Writes {
				born[t] = i
			}
		case Start:
			for _, m := range nd.Members {
				born[m.Out] = i
				if _, ok := size[m.Out]; !ok {
					size[m.Out] = outBytes(nd.Op, m.Bytes, g.groupSize(nd.Group))
				}
			}
		}
	}
	last := map[string]int{}
	for i := range g.Nodes {
		for _, e := range ix.preds[i] {
			if e.kind == dataEdge {
				last[e.tensor] = max(last[e.tensor], i)
			}
		}
	}
	return g.sweepPeak(born, last, size)
}

func TestPeakBytesMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	cfg := buckets.DefaultConfig()
	for trial := range 200 {
		g := randomGraph(r, 20+r.IntN(200))
		graphs := []*Graph{g}
		if out, _, err := Reshard(g, cfg.Model); err == nil {
			graphs = append(graphs, out)
		}
		if out, _, err := ChunkWith(g, ChunkConfig{Pattern: "*", Accumulate: true, Model: cfg.Model}); err == nil {
			graphs = append(graphs, out)
		}
		for _, h := range graphs {
			p, at, err := PeakBytes(h)
			rp, rat, rerr := peakBytesRef(h)
			if err != nil || rerr != nil || p != rp || at != rat {
				t.Fatalf("trial %d: PeakBytes = %d at %q (%v), reference %d at %q (%v)\n%s", trial, p, at, err, rp, rat, rerr, Format(h))
			}
		}
	}
}

// blameRef is the re-gather blame of Reshard as first written: every
// re-gather against every collective that became exposed.
func blameRef(after *Estimate, bad []*ExposedError, cands []*regatherPlan) map[*regatherPlan]bool {
	byStart := map[string]*Collective{}
	for k := range after.Collectives {
		byStart[after.Collectives[k].Start] = &after.Collectives[k]
	}
	blamed := map[*regatherPlan]bool{}
	for _, e := range bad {
		c := byStart[e.Bucket]
		for _, rp := range cands {
			r := byStart[rp.name+regatherSuffix]
			if r != nil && r.Group == c.Group && r.Issue <= c.Issue && r.End >= c.Begin {
				blamed[rp] = true
			}
		}
	}
	return blamed
}

func TestBlameRegathersMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	groups := []string{"dp", "tp", "pp"}
	us := func(n int) time.Duration { return time.Duration(r.IntN(n)) * time.Microsecond }
	for trial := range 2000 {
		est := &Estimate{}
		var cands []*regatherPlan
		var bad []*ExposedError
		for k := range 1 + r.IntN(30) {
			issue := us(50)
			begin := issue + us(10)
			c := Collective{Start: string(rune('a'+k%26)) + string(rune('0'+k/26)), Group: groups[r.IntN(len(groups))],
				Issue: issue, Begin: begin, End: begin + us(20)}
			switch r.IntN(3) {
			case 0:
				rp := &regatherPlan{name: c.Start}
				c.Start += regatherSuffix
				cands = append(cands, rp)
			case 1:
				bad = append(bad, &ExposedError{Bucket: c.Start})
			}
			est.Collectives = append(est.Collectives, c)
		}
		got, want := blameRegathers(est, bad, cands), blameRef(est, bad, cands)
		if len(got) != len(want) {
			t.Fatalf("trial %d: blamed %d re-gathers, reference %d", trial, len(got), len(want))
		}
		for rp := range want {
			if !got[rp] {
				t.Fatalf("trial %d: %s not blamed; the reference blames it", trial, rp.name)
			}
		}
	}
}

// The planner hands each pass the index of its input instead of validating
// it again; its plan must be what the exported passes give one after the
// other, each validating its own input.
func TestPlannerMatchesExportedPasses(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	cfg := buckets.DefaultConfig()
	compared := 0
	for trial := range 100 {
		g := randomGraph(r, 20+r.IntN(200))
		passes := []string{PassReshard, PassChunk, PassBlocks, PassOverlap}
		r.Shuffle(len(passes), func(i, j int) { passes[i], passes[j] = passes[j], passes[i] })
		pc := PlannerConfig{Passes: passes, Buckets: cfg, Chunk: ChunkConfig{Pattern: "*", Accumulate: true}, ReshardPrefetch: r.IntN(2)}
		s, perr := RunPlanner(g, pc)
		cur, err := g, error(nil)
		for _, p := range passes {
			switch p {
			case PassReshard:
				cur, _, err = ReshardWith(cur, ReshardConfig{Model: cfg.Model, Prefetch: pc.ReshardPrefetch})
			case PassChunk:
				cur, _, err = ChunkWith(cur, ChunkConfig{Pattern: "*", Accumulate: true, Model: cfg.Model})
			case PassBlocks:
				cur, err = BucketBlocks(cur, cfg)
			case PassOverlap:
				cur, err = BucketOverlap(cur, cfg)
			}
			if err != nil {
				err = fmt.Errorf("pass %s: %w", p, err)
				break
			}
		}
		if perr != nil || err != nil {
			if fmt.Sprint(perr) != fmt.Sprint(err) {
				t.Fatalf("trial %d: planner's error %v, exported passes' %v", trial, perr, err)
			}
			continue
		}
		if got, want := Format(s.Graph()), Format(cur); got != want {
			t.Fatalf("trial %d (%v): planner's graph\n%s\nexported passes' graph\n%s", trial, passes, got, want)
		}
		est, err := Simulate(cur, cfg.Model)
		if err != nil {
			t.Fatal(err)
		}
		if s.After.String() != est.String() {
			t.Fatalf("trial %d: planner's estimate\n%s\nfresh estimate\n%s", trial, s.After, est)
		}
		peak, at, _ := PeakBytes(cur)
		if s.PeakAfter != peak || s.PeakAt != at {
			t.Fatalf("trial %d: planner's peak %d at %s, fresh %d at %s", trial, s.PeakAfter, s.PeakAt, peak, at)
		}
		compared++
	}
	if compared < 30 {
		t.Errorf("only %d of 100 random steps planned without an error: the comparison says little", compared)
	}
}
