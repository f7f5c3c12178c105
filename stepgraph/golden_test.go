package stepgraph

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// TestScenarios runs testdata/*.txt. Commands:
//
//	model latency=DUR bw=BYTES/S [cap=B] [min=B]  set the cost model (default 10µs, 1 GB/s)
//	graph                     parse the input as the current graph; print ok or the error
//	estimate                  simulate the current graph, per region
//	blocks | overlap          run a bucketing pass on the current graph
//	reshard [prefetch=N]      run ReshardWith (prefetch 1: Reshard); chunk pattern=P [dirs=fwd,bwd] [accumulate=1] [always=1] [count=N]: run ChunkWith
//	plan                      print the bucket plan of the current graph
//	load                      read the input as a JSON document; json: round-trip the current graph
//	peak                      print PeakBytes of the current graph and where it is first reached
//	planner passes=P,... [budget=B] [pattern=P] [prefetch=N]
//	                          run RunPlanner; print each pass's line, the peak before and after, and the
//	                          planned graph (which becomes the current graph) when it changed
//
// A pass replaces the current graph with its result and prints the result,
// then the estimates before and after.
func TestScenarios(t *testing.T) {
	runScenarios(t, "testdata/*.txt", func(t *testing.T, sc scenario) string {
		return scenarioState(t).run(t, sc)
	})
}

type state struct {
	file string
	cfg  buckets.Config
	g    *Graph
}

var states = map[*testing.T]*state{}

func scenarioState(t *testing.T) *state {
	s, ok := states[t]
	if !ok {
		s = &state{cfg: buckets.Config{Model: buckets.Model{Latency: 10 * time.Microsecond, BusBandwidth: 1e9}}}
		states[t] = s
		t.Cleanup(func() { delete(states, t) })
	}
	return s
}

// run executes one scenario command and returns its output.
//
// long: one switch over the golden scripts' commands, each case the
// parsing of its own arguments; the switch is the scripts' grammar.
func (s *state) run(t *testing.T, sc scenario) string {
	need := func() {
		if s.g == nil {
			t.Fatalf("%s: no graph", sc.Pos)
		}
	}
	switch sc.Cmd {
	case "model":
		for k, v := range sc.Args {
			switch k {
			case "latency":
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Fatal(err)
				}
				s.cfg.Model.Latency = d
			case "bw":
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatal(err)
				}
				s.cfg.Model.BusBandwidth = f
			case "cap", "min":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				if k == "cap" {
					s.cfg.CapBytes = n
				} else {
					s.cfg.MinBytes = n
				}
			}
		}
		return fmt.Sprintf("latency %v bw %g cap %d min %d", s.cfg.Model.Latency, s.cfg.Model.BusBandwidth, s.cfg.Cap(), s.cfg.Min())
	case "graph":
		g, err := Parse(sc.Input)
		if err == nil {
			err = g.Validate()
		}
		if err != nil {
			return "error: " + err.Error()
		}
		s.g = g
		return "ok"
	case "estimate":
		need()
		e, err := Simulate(s.g, s.cfg.Model)
		if err != nil {
			return "error: " + err.Error()
		}
		return e.String()
	case "plan":
		need()
		p, err := Plan(s.g)
		if err != nil {
			return "error: " + err.Error()
		}
		return p.String()
	case "load":
		g, err := Load(strings.NewReader(sc.Input))
		if err != nil {
			return "error: " + err.Error()
		}
		s.g = g
		return Format(g)
	case "peak":
		need()
		p, at, err := PeakBytes(s.g)
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("peak %d bytes, first at %s", p, at)
	case "planner":
		need()
		return s.planner(t, sc)
	case "json":
		need()
		var buf bytes.Buffer
		if err := Save(&buf, s.g); err != nil {
			t.Fatal(err)
		}
		g, err := Load(&buf)
		if err != nil {
			return "error: " + err.Error()
		}
		if Format(g) != Format(s.g) {
			t.Errorf("%s: JSON round trip changed the graph:\n%s", sc.Pos, Format(g))
		}
		return "round trip ok"
	}
	need()
	before := s.g
	var out *Graph
	var extra string
	var err error
	switch sc.Cmd {
	case "blocks":
		out, err = BucketBlocks(before, s.cfg)
	case "overlap":
		out, err = BucketOverlap(before, s.cfg)
	case "reshard":
		var rep *ReshardReport
		pf := 1
		if v, ok := sc.Args["prefetch"]; ok {
			if pf, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
		}
		out, rep, err = ReshardWith(before, ReshardConfig{Model: s.cfg.Model, Prefetch: pf})
		if rep != nil {
			extra = rep.String()
		}
	case "chunk":
		var dirs []Direction
		for _, d := range strings.Split(sc.Args["dirs"], ",") {
			if d == "" {
				continue
			}
			dd, err := parseDir(d)
			if err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, dd)
		}
		count := 0
		if v, ok := sc.Args["count"]; ok {
			if count, err = strconv.Atoi(v); err != nil {
				t.Fatalf("%s: count=%q: %v", sc.Pos, v, err)
			}
		}
		var crep *ChunkReport
		out, crep, err = ChunkWith(before, ChunkConfig{Pattern: sc.Args["pattern"], Dirs: dirs, Model: s.cfg.Model,
			Accumulate: sc.Args["accumulate"] == "1", Always: sc.Args["always"] == "1", Count: count})
		if crep != nil {
			extra = crep.String()
		}
	default:
		t.Fatalf("%s: unknown command %q", sc.Pos, sc.Cmd)
	}
	if err != nil {
		return "error: " + err.Error()
	}
	s.g = out
	rep, cerr := Check(before, out, s.cfg.Model)
	if rep == nil {
		return "error: " + cerr.Error()
	}
	res := Format(out) + extra + rep.String()
	if cerr != nil {
		res += "check: " + cerr.Error() + "\n"
	}
	return res
}

// planner runs the offline planner, peak-memory budget included, on the
// current graph.
func (s *state) planner(t *testing.T, sc scenario) string {
	cfg := PlannerConfig{Passes: []string{}, Buckets: s.cfg, Chunk: ChunkConfig{Pattern: "*", Accumulate: true}, ReshardPrefetch: 1}
	for _, p := range strings.Split(sc.Args["passes"], ",") {
		if p != "" {
			cfg.Passes = append(cfg.Passes, p)
		}
	}
	if v, ok := sc.Args["pattern"]; ok {
		cfg.Chunk.Pattern = v
	}
	for k, dst := range map[string]*int64{"budget": &cfg.PeakBudget} {
		if v, ok := sc.Args[k]; ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %s=%q: %v", sc.Pos, k, v, err)
			}
			*dst = n
		}
	}
	if v, ok := sc.Args["prefetch"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s: prefetch=%q: %v", sc.Pos, v, err)
		}
		cfg.ReshardPrefetch = n
	}
	sum, err := RunPlanner(s.g, cfg)
	if err != nil {
		return "error: " + err.Error()
	}
	var sb strings.Builder
	for _, p := range sum.Passes {
		fmt.Fprintf(&sb, "%s → %d nodes, peak %d", p.Pass, p.Nodes, p.PeakBytes)
		if p.Refused != "" {
			fmt.Fprintf(&sb, "; %s", p.Refused)
		}
		sb.WriteByte('\n')
	}
	fmt.Fprintf(&sb, "peak %d before, %d after (at %s)\n", sum.PeakBefore, sum.PeakAfter, sum.PeakAt)
	if out := Format(sum.Graph()); out == Format(s.g) {
		sb.WriteString("graph unchanged\n")
	} else {
		sb.WriteString(out)
		s.g = sum.Graph()
	}
	return sb.String()
}
