//go:build cgo

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// planOut is the part of gorun_plan's result the tests read.
type planOut struct {
	Plan        json.RawMessage `json:"plan"`
	Graph       json.RawMessage `json:"graph"`
	Text        string          `json:"text"`
	BucketsHash string          `json:"buckets_hash"`
	Hash        string          `json:"hash"`
}

func readStep(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/step.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustPlan(t *testing.T, graph []byte, opts string) planOut {
	t.Helper()
	res, err := planJSON(graph, []byte(opts))
	if err != nil {
		t.Fatalf("planJSON(%s): %v", opts, err)
	}
	var out planOut
	if err := json.Unmarshal(res, &out); err != nil {
		t.Fatalf("result is not JSON: %v\n%s", err, res)
	}
	return out
}

// The result is what `gorun plan` computes for the same flags: the summary
// of stepgraph.RunPlanner, the planned graph, and hashes of both.
func TestPlanJSONMatchesPlanner(t *testing.T) {
	graph := readStep(t)
	out := mustPlan(t, graph, `{"passes": "reshard,blocks,overlap", "cap_bytes": 1048576}`)

	g, err := stepgraph.Load(bytes.NewReader(graph))
	if err != nil {
		t.Fatal(err)
	}
	cfg := stepgraph.PlannerConfig{Passes: []string{"reshard", "blocks", "overlap"}, Buckets: buckets.DefaultConfig(), ReshardPrefetch: 1,
		Chunk: stepgraph.ChunkConfig{Pattern: "*", Accumulate: true}}
	cfg.Buckets.CapBytes = 1 << 20
	s, err := stepgraph.RunPlanner(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(s)
	if !bytes.Equal(out.Plan, want) {
		t.Errorf("plan differs from RunPlanner's summary:\n got %s\nwant %s", out.Plan, want)
	}
	if len(out.Graph) == 0 {
		t.Fatal("the passes rewrote the graph but the result has no graph")
	}
	planned, err := stepgraph.Load(bytes.NewReader(out.Graph))
	if err != nil {
		t.Fatalf("the result's graph does not load: %v", err)
	}
	if stepgraph.Format(planned) != stepgraph.Format(s.Graph()) {
		t.Errorf("the result's graph is not the planned graph:\n%s\nwant\n%s", stepgraph.Format(planned), stepgraph.Format(s.Graph()))
	}
	bp, err := stepgraph.Plan(planned)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%016x", bp.Hash()); out.BucketsHash != want {
		t.Errorf("buckets_hash %q, want %s", out.BucketsHash, want)
	}
	if !strings.HasPrefix(out.Hash, "sha256:") || len(out.Hash) != len("sha256:")+64 {
		t.Errorf("hash %q is not sha256:<64 hex>", out.Hash)
	}
	var text strings.Builder
	_ = s.WriteText(&text)
	if out.Text != text.String() {
		t.Errorf("text differs from `gorun plan`'s:\n%s\nwant\n%s", out.Text, text.String())
	}
}

// Every rank gets the same bytes for the same input; the hash tells apart
// plans made with other options, and a list of passes means the string.
func TestPlanJSONDeterministicHash(t *testing.T) {
	graph := readStep(t)
	a, err := planJSON(graph, []byte(`{"passes": "reshard,blocks,overlap"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := planJSON(graph, []byte(`{"passes": ["reshard", "blocks", "overlap"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("the same plan asked twice (string and list of passes) gave different bytes")
	}
	x := mustPlan(t, graph, `{"passes": "reshard,blocks,overlap"}`)
	y := mustPlan(t, graph, `{"passes": "blocks,overlap"}`)
	if x.Hash == y.Hash {
		t.Errorf("different plans share hash %s", x.Hash)
	}
	// No passes: the graph is unchanged, so it is left out.
	none := mustPlan(t, graph, `{"passes": ""}`)
	if len(none.Graph) != 0 {
		t.Errorf("no passes ran but the result carries a graph")
	}
	// No options at all: gorun plan's defaults.
	def := mustPlan(t, graph, ``)
	blocks := mustPlan(t, graph, `{"passes": "blocks,overlap"}`)
	if def.Hash != blocks.Hash {
		t.Errorf("empty options did not plan with the default passes")
	}
}

// Bad input is GORUN_ERR_INVALID with text that names what was wrong.
func TestPlanJSONErrors(t *testing.T) {
	graph := readStep(t)
	for _, tc := range []struct {
		name, graph, opts, want string
	}{
		{"unknown option", string(graph), `{"peak_budget": 5}`, `unknown field "peak_budget"`},
		{"bad passes", string(graph), `{"passes": 3}`, "passes must be"},
		{"unknown pass", string(graph), `{"passes": "blocks,fuse"}`, `unknown pass "fuse"`},
		{"negative budget", string(graph), `{"peak_budget_bytes": -1}`, "peak_budget_bytes -1 is negative"},
		{"bad model", string(graph), `{"bus_bandwidth": 0}`, "bus bandwidth"},
		{"bad chunk direction", string(graph), `{"chunk_dirs": "forward,sideways"}`, `unknown direction "sideways"`},
		{"one chunk", string(graph), `{"chunk_count": 1}`, "chunk_count 1"},
		{"not JSON", `{"schema":`, ``, "graph:"},
		{"other schema", `{"schema": "gorun.stepgraph/v0"}`, ``, `schema "gorun.stepgraph/v0"`},
		{"dangling read", strings.Replace(string(graph), `"reads": ["GA", "GB"]`, `"reads": ["GA", "GZ"]`, 1), ``, "GZ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := planJSON([]byte(tc.graph), []byte(tc.opts))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, errInvalid) {
				t.Errorf("error %q is not an invalid-argument error", err)
			}
			if code, _ := classify(err, nil); code != statusInvalid {
				t.Errorf("status %d, want GORUN_ERR_INVALID", code)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// The peak-memory budget: on the trainer's sharded step the chunk pass
// raises the estimate; under a budget below its result it is refused (the
// graph before it kept, the reason in the plan), above it accepted.
func TestPlanJSONPeakBudget(t *testing.T) {
	graph, err := os.ReadFile("testdata/trainer-step.json")
	if err != nil {
		t.Fatal(err)
	}
	type pass struct {
		Pass      string `json:"pass"`
		PeakBytes int64  `json:"peak_bytes"`
		Refused   string `json:"refused"`
	}
	type summary struct {
		Passes []pass `json:"passes"`
		Before int64  `json:"peak_bytes_before"`
		After  int64  `json:"peak_bytes_after"`
	}
	plan := func(opts string) (summary, planOut) {
		out := mustPlan(t, graph, opts)
		var s summary
		if err := json.Unmarshal(out.Plan, &s); err != nil {
			t.Fatal(err)
		}
		return s, out
	}
	free, _ := plan(`{"passes": "chunk"}`)
	if free.After <= free.Before {
		t.Fatalf("the fixture no longer shows chunk raising the peak (%d → %d)", free.Before, free.After)
	}
	budget := (free.Before + free.After) / 2
	tight, out := plan(fmt.Sprintf(`{"passes": "chunk", "peak_budget_bytes": %d}`, budget))
	if r := tight.Passes[0].Refused; !strings.Contains(r, "refused") || !strings.Contains(r, fmt.Sprint(budget)) {
		t.Errorf("chunk over the budget %d not refused with a reason: %+v", budget, tight.Passes[0])
	}
	if tight.After != tight.Before || len(out.Graph) != 0 {
		t.Errorf("a refused rewrite changed the plan: peak %d → %d, graph returned: %v", tight.Before, tight.After, len(out.Graph) != 0)
	}
	if !strings.Contains(out.Text, "refused") {
		t.Errorf("the text form does not say the pass was refused:\n%s", out.Text)
	}
	loose, out := plan(fmt.Sprintf(`{"passes": "chunk", "peak_budget_bytes": %d}`, free.After))
	if loose.Passes[0].Refused != "" || loose.After != free.After || len(out.Graph) == 0 {
		t.Errorf("chunk within the budget %d was not accepted: %+v", free.After, loose)
	}
}

// chunk_dirs limits the chunk pass to the directions named: on the
// trainer's step, forward alone splits only forward nodes, backward alone
// only backward ones, and both split both.
func TestPlanJSONChunkDirs(t *testing.T) {
	graph, err := os.ReadFile("testdata/trainer-step.json")
	if err != nil {
		t.Fatal(err)
	}
	chunkedDirs := func(opts string) map[string]int {
		out := mustPlan(t, graph, opts)
		var g struct {
			Nodes []struct {
				Dir   string          `json:"direction"`
				Chunk json.RawMessage `json:"chunk"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal(out.Graph, &g); err != nil {
			t.Fatalf("%s: planned graph: %v", opts, err)
		}
		n := map[string]int{}
		for _, nd := range g.Nodes {
			if len(nd.Chunk) > 0 {
				n[nd.Dir]++
			}
		}
		return n
	}
	all := chunkedDirs(`{"passes": "chunk", "chunk_always": true}`)
	if all["forward"] == 0 || all["backward"] == 0 {
		t.Fatalf("the fixture no longer chunks both directions: %v", all)
	}
	// chunk_count reaches the pass: every chunk copy says it is one of 3.
	out := mustPlan(t, graph, `{"passes": "chunk", "chunk_always": true, "chunk_count": 3}`)
	var g3 struct {
		Nodes []struct {
			Chunk *struct{ Count int } `json:"chunk"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(out.Graph, &g3); err != nil {
		t.Fatal(err)
	}
	n3 := 0
	for _, nd := range g3.Nodes {
		if nd.Chunk != nil {
			if nd.Chunk.Count != 3 {
				t.Fatalf("chunk_count 3 made a chunk of %d", nd.Chunk.Count)
			}
			n3++
		}
	}
	if n3 == 0 || n3%3 != 0 {
		t.Errorf("chunk_count 3: %d chunk copies, want a positive multiple of 3", n3)
	}
	for _, dir := range []string{"forward", "backward"} {
		got := chunkedDirs(fmt.Sprintf(`{"passes": "chunk", "chunk_always": true, "chunk_dirs": %q}`, dir))
		if got[dir] != all[dir] || len(got) != 1 {
			t.Errorf("chunk_dirs %s chunked %v, want only the %d %s nodes", dir, got, all[dir], dir)
		}
	}
}
