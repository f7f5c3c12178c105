package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/stepgraph"
)

func init() { subcommands["plan"] = planMain }

const planUsage = `usage: gorun plan [flags] GRAPH.json

Runs stepgraph's passes on a step graph (stepgraph/SCHEMA.md; e.g. written by
the trainer's --dump-graph or an exporter) and prints the buckets (members,
bytes, group, direction), the simulated exposed communication before and
after, the peak-memory estimate and the schedule.

flags:
`

// planMain is `gorun plan`: the offline planner. The planning itself is
// stepgraph.RunPlanner; this maps flags to its config and its summary to
// text or JSON.
func planMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gorun plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, planUsage)
		fs.PrintDefaults()
	}
	passes := fs.String("passes", strings.Join(stepgraph.DefaultPasses, ","),
		"comma-separated `PASSES` in order: reshard, chunk, blocks, overlap (\"\" runs none)")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	capBytes := fs.Int64("cap", 0, "bucket cap in `BYTES` (0: the cost model's)")
	regions := fs.String("chunk-regions", "*", "regions the chunk pass splits (a path.Match `PATTERN` over dotted names)")
	accumulate := fs.Bool("chunk-accumulate", true, "chunk pass: sum the chunks' partial gradients before one collective")
	reshardAhead := fs.Int("reshard-prefetch", 1, "reshard pass: start each re-gather `N` backward blocks before its reader's block")
	budget := fs.Int64("peak-budget", 0, "refuse any pass that would raise the peak-memory estimate above `BYTES` (0: no budget)")
	out := fs.String("o", "", "also write the planned graph as JSON to `FILE`")
	var files []string
	// Flags may come before or after the file.
	for rest := args; ; {
		if code, done := parseFlags(fs, rest, "gorun plan", stderr); done {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(files) != 1 {
		fmt.Fprintf(stderr, "gorun plan: need exactly one graph file, got %d (gorun plan --help)\n", len(files))
		return exitUsage
	}
	cfg := stepgraph.PlannerConfig{Passes: []string{}, Buckets: buckets.DefaultConfig()}
	cfg.Buckets.CapBytes = *capBytes
	cfg.Chunk = stepgraph.ChunkConfig{Pattern: *regions, Accumulate: *accumulate}
	cfg.ReshardPrefetch = *reshardAhead
	cfg.PeakBudget = *budget
	for _, p := range strings.Split(*passes, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.Passes = append(cfg.Passes, p)
		}
	}
	g, err := loadGraph(files[0])
	if err != nil {
		fmt.Fprintf(stderr, "gorun plan: %v\n", err)
		return exitFailure
	}
	s, err := stepgraph.RunPlanner(g, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "gorun plan: %s: %v\n", files[0], err)
		if errors.Is(err, stepgraph.ErrPass) {
			return exitUsage
		}
		return exitFailure
	}
	if *out != "" {
		if err := saveGraph(*out, s.Graph()); err != nil {
			fmt.Fprintf(stderr, "gorun plan: %v\n", err)
			return exitFailure
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(s)
	} else {
		err = s.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun plan: %v\n", err)
		return exitFailure
	}
	return 0
}

func loadGraph(name string) (*stepgraph.Graph, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g, err := stepgraph.Load(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return g, nil
}

func saveGraph(name string, g *stepgraph.Graph) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := stepgraph.Save(f, g); err != nil {
		_ = f.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	return f.Close()
}
