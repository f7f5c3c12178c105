package stepgraph

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
)

// The offline planner: what `gorun plan` runs on a graph file. It chains the
// passes by name and summarises the result (buckets, schedule, simulated
// exposure, peak memory) for people and, as JSON, for tools.

// Pass names accepted by PlannerConfig.Passes.
const (
	PassReshard = "reshard" // Reshard
	PassChunk   = "chunk"   // ChunkWith, with PlannerConfig.Chunk
	PassBlocks  = "blocks"  // BucketBlocks
	PassOverlap = "overlap" // BucketOverlap
)

// DefaultPasses are the bucketing passes every plan gets: block bucketing,
// then overlap-preserving bucketing across blocks.
var DefaultPasses = []string{PassBlocks, PassOverlap}

// ErrPass is wrapped by RunPlanner's errors about the pass list.
var ErrPass = errors.New("stepgraph: unknown pass")

// PlannerConfig says which passes run, in order, and with what.
type PlannerConfig struct {
	// Passes in the order they run; nil means DefaultPasses, empty (non-nil)
	// none.
	Passes []string
	// Buckets gives the cost model and the bucket cap.
	Buckets buckets.Config
	// Chunk configures the chunk pass (its Model is Buckets.Model); an
	// empty Pattern means "*", every region.
	Chunk ChunkConfig
	// ReshardPrefetch is ReshardConfig.Prefetch for the reshard pass.
	ReshardPrefetch int
	// PeakBudget, when positive, bounds the peak-memory estimate (PeakBytes)
	// of the plan in bytes: a pass whose result would raise the estimate
	// above it is refused, the graph before it kept, and its PassResult
	// says why. Zero: no budget.
	PeakBudget int64
}

// PassResult is one pass's line of the summary.
type PassResult struct {
	Pass   string `json:"pass"`
	Nodes  int    `json:"nodes"`
	Report string `json:"report,omitempty"`
	// PeakBytes is the peak-memory estimate after the pass (after the
	// refusal, if it was refused).
	PeakBytes int64 `json:"peak_bytes"`
	// Refused, when set, says why the pass's rewrite was thrown away (it
	// would have exceeded PlannerConfig.PeakBudget); Nodes and PeakBytes are
	// then those of the graph kept.
	Refused string `json:"refused,omitempty"`
}

// PlanBucket is one collective of the final plan.
type PlanBucket struct {
	Name      string    `json:"name"`
	Group     string    `json:"group"`
	Op        Op        `json:"op"`
	DType     string    `json:"dtype"`
	Direction Direction `json:"direction,omitempty"`
	Region    string    `json:"region,omitempty"`
	Bytes     int64     `json:"bytes"`
	Members   []string  `json:"members"`
	// Issue, Begin, End and Exposed are the simulated times (ns from the
	// step's start): when the plan reaches the start, when the group's comm
	// stream takes it, when it completes, and how long its wait blocks.
	Issue   time.Duration `json:"issue_ns"`
	Begin   time.Duration `json:"begin_ns"`
	End     time.Duration `json:"end_ns"`
	Exposed time.Duration `json:"exposed_ns"`
}

// PlanSummary is what the planner made of a graph.
type PlanSummary struct {
	Passes []PassResult `json:"passes"`
	// Buckets in plan (issue) order.
	Buckets []PlanBucket `json:"buckets"`
	// Schedule is the final graph's nodes in plan order, one line each in
	// the text form (see Format).
	Schedule []string `json:"schedule"`
	// Before and After are the simulated step of the input and the output.
	Before, After *Estimate `json:"-"`
	Estimate      struct {
		Before, After EstimateSummary
	} `json:"estimate"`
	// PeakBytes estimates (PeakBytes) before and after, and where the
	// output's peak is first reached.
	PeakBefore int64  `json:"peak_bytes_before"`
	PeakAfter  int64  `json:"peak_bytes_after"`
	PeakAt     string `json:"peak_at"`

	graph *Graph
}

// EstimateSummary is an Estimate without its per-node detail.
type EstimateSummary struct {
	Step        time.Duration `json:"step_ns"`
	Compute     time.Duration `json:"compute_ns"`
	Comm        time.Duration `json:"comm_ns"`
	Exposed     time.Duration `json:"exposed_ns"`
	Collectives int           `json:"collectives"`
	Regions     []RegionCost  `json:"regions"`
}

func summarize(e *Estimate) EstimateSummary {
	return EstimateSummary{Step: e.Step, Compute: e.Compute, Comm: e.Comm, Exposed: e.Exposed, Collectives: len(e.Collectives), Regions: e.Regions}
}

// Graph returns the planned graph.
func (s *PlanSummary) Graph() *Graph { return s.graph }

// RunPlanner runs the configured passes on g and summarises the result. It
// is pure: the same graph and config give the same summary on every rank
// and every machine.
func RunPlanner(g *Graph, cfg PlannerConfig) (*PlanSummary, error) {
	if err := cfg.Buckets.Validate(); err != nil {
		return nil, err
	}
	passes := cfg.Passes
	if passes == nil {
		passes = DefaultPasses
	}
	s := &PlanSummary{}
	ix, err := g.index()
	if err != nil {
		return nil, err
	}
	var peakAt string
	s.PeakBefore, peakAt = g.peakBytes()
	s.Before = g.simulate(ix, cfg.Buckets.Model)
	if cfg.PeakBudget < 0 {
		return nil, fmt.Errorf("stepgraph: peak-memory budget %d bytes is negative (0: no budget)", cfg.PeakBudget)
	}
	cur, curPeak := g, s.PeakBefore
	for _, p := range passes {
		var (
			rep  fmt.Stringer
			next *Graph
		)
		// The passes' inner forms take the index of their input and return
		// their result's: each graph of the chain is validated once.
		var nix *index
		switch p {
		case PassReshard:
			var r *ReshardReport
			rc := ReshardConfig{Model: cfg.Buckets.Model, Prefetch: cfg.ReshardPrefetch}
			if err = rc.validate(); err == nil {
				next, nix, r, err = cur.reshard(ix, rc)
			}
			rep = r
		case PassChunk:
			cc := cfg.Chunk
			cc.Model = cfg.Buckets.Model
			if cc.Pattern == "" {
				cc.Pattern = "*"
			}
			var r *ChunkReport
			if err = cc.validate(); err == nil {
				next, nix, r, err = cur.chunk(ix, cc)
			}
			rep = r
		case PassBlocks:
			next, nix, err = cur.bucketBlocks(ix, cfg.Buckets)
		case PassOverlap:
			next, nix, err = cur.bucketOverlap(ix, cfg.Buckets)
		default:
			return nil, fmt.Errorf("%w %q (known: %s, %s, %s, %s)", ErrPass, p, PassReshard, PassChunk, PassBlocks, PassOverlap)
		}
		if err != nil {
			return nil, fmt.Errorf("pass %s: %w", p, err)
		}
		pr := PassResult{Pass: p}
		if rep != nil && !isNilStringer(rep) {
			pr.Report = strings.TrimSpace(rep.String())
		}
		// Every pass checks (and so validates) its own result.
		peak, at := next.peakBytes()
		if cfg.PeakBudget > 0 && peak > cfg.PeakBudget && peak > curPeak {
			// Refuse the rewrite, not the plan: the graph before the pass
			// is a valid plan within (or no further over) the budget.
			pr.Refused = fmt.Sprintf("refused: the peak-memory estimate would rise from %d to %d bytes (at %s), over the budget of %d bytes; kept the graph before the pass",
				curPeak, peak, at, cfg.PeakBudget)
			next, nix, peak, at = cur, ix, curPeak, peakAt
		}
		cur, ix, curPeak, peakAt = next, nix, peak, at
		pr.Nodes, pr.PeakBytes = len(cur.Nodes), curPeak
		s.Passes = append(s.Passes, pr)
	}
	s.graph = cur
	s.After = cur.simulate(ix, cfg.Buckets.Model)
	s.PeakAfter, s.PeakAt = curPeak, peakAt
	s.Estimate.Before, s.Estimate.After = summarize(s.Before), summarize(s.After)
	// Buckets in plan order, with their simulated times.
	byStart := map[string]*Collective{}
	for i := range s.After.Collectives {
		byStart[s.After.Collectives[i].Start] = &s.After.Collectives[i]
	}
	for i := range cur.Nodes {
		nd := &cur.Nodes[i]
		if nd.Kind != Start {
			continue
		}
		b := PlanBucket{Name: nd.Name, Group: nd.Group, Op: nd.Op, DType: nd.DType, Direction: nd.Dir, Region: nd.Region, Bytes: nd.Bytes()}
		for _, m := range nd.Members {
			b.Members = append(b.Members, m.In)
		}
		if c := byStart[nd.Name]; c != nil {
			b.Issue, b.Begin, b.End, b.Exposed = c.Issue, c.Begin, c.End, c.Exposed
		}
		s.Buckets = append(s.Buckets, b)
	}
	s.Schedule = strings.Split(strings.TrimSpace(formatNodes(cur)), "\n")
	return s, nil
}

// isNilStringer reports a typed nil behind the interface (a pass that
// returned no report).
func isNilStringer(s fmt.Stringer) bool {
	switch r := s.(type) {
	case *ReshardReport:
		return r == nil
	case *ChunkReport:
		return r == nil
	}
	return false
}

// formatNodes is Format without the declarations: the schedule.
func formatNodes(g *Graph) string {
	return Format(&Graph{Nodes: g.Nodes})
}

// WriteText prints the summary for people: passes, buckets, the estimate
// before and after, peak memory, then the schedule.
func (s *PlanSummary) WriteText(w io.Writer) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "passes:")
	if len(s.Passes) == 0 {
		sb.WriteString(" none")
	}
	sb.WriteByte('\n')
	for _, p := range s.Passes {
		fmt.Fprintf(&sb, "  %-8s → %d nodes", p.Pass, p.Nodes)
		if p.Report != "" {
			fmt.Fprintf(&sb, "; %s", strings.ReplaceAll(p.Report, "\n", "; "))
		}
		if p.Refused != "" {
			fmt.Fprintf(&sb, "; %s", p.Refused)
		}
		sb.WriteByte('\n')
	}
	fmt.Fprintf(&sb, "buckets: %d\n", len(s.Buckets))
	fmt.Fprintf(&sb, "  %-32s %-8s %-14s %-9s %-12s %12s %10s %10s  %s\n", "name", "group", "op", "dir", "region", "bytes", "start", "exposed", "members")
	for _, b := range s.Buckets {
		dir := string(b.Direction)
		if dir == "" {
			dir = "-"
		}
		fmt.Fprintf(&sb, "  %-32s %-8s %-14s %-9s %-12s %12d %10v %10v  %s\n", b.Name, b.Group, b.Op, dir, dash(b.Region), b.Bytes,
			b.Begin.Round(time.Microsecond), b.Exposed.Round(time.Microsecond), strings.Join(b.Members, ","))
	}
	est := func(name string, e EstimateSummary) {
		frac := 0.0
		if e.Comm > 0 {
			frac = float64(e.Exposed) / float64(e.Comm)
		}
		fmt.Fprintf(&sb, "%s: step %v, compute %v, comm %v, exposed %v (%.1f%% of comm), %d collectives\n", name,
			e.Step.Round(time.Microsecond), e.Compute.Round(time.Microsecond), e.Comm.Round(time.Microsecond),
			e.Exposed.Round(time.Microsecond), 100*frac, e.Collectives)
	}
	est("estimate before", s.Estimate.Before)
	est("estimate after ", s.Estimate.After)
	fmt.Fprintf(&sb, "peak memory estimate: %d bytes before, %d after (first reached at %s)\n", s.PeakBefore, s.PeakAfter, dash(s.PeakAt))
	sb.WriteString("schedule:\n")
	for _, l := range s.Schedule {
		fmt.Fprintf(&sb, "  %s\n", l)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
