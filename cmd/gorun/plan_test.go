package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An FSDP-shaped step of two blocks on 4 ranks: per-parameter gathers and
// reduce-scatters that the bucketing passes merge.
const planGraph = `{
  "schema": "gorun.stepgraph/v1",
  "groups": [{"name": "dp", "size": 4}],
  "regions": ["layers.0", "layers.1"],
  "tensors": [
    {"name": "x", "bytes": 4096, "input": true},
    {"name": "a", "bytes": 4096, "input": true},
    {"name": "b", "bytes": 4096, "input": true},
    {"name": "c", "bytes": 4096, "input": true}
  ],
  "nodes": [
    {"name": "ag.a", "kind": "start", "direction": "forward", "region": "layers.0", "op": "all_gather", "group": "dp", "dtype": "f32", "members": [{"in": "a", "out": "A", "bytes": 4096}]},
    {"name": "ag.c", "kind": "start", "direction": "forward", "region": "layers.0", "op": "all_gather", "group": "dp", "dtype": "f32", "members": [{"in": "c", "out": "C", "bytes": 4096}]},
    {"name": "ag.b", "kind": "start", "direction": "forward", "region": "layers.0", "op": "all_gather", "group": "dp", "dtype": "f32", "members": [{"in": "b", "out": "B", "bytes": 4096}]},
    {"name": "ag.a.w", "kind": "wait", "direction": "forward", "region": "layers.0", "of": "ag.a"},
    {"name": "ag.c.w", "kind": "wait", "direction": "forward", "region": "layers.0", "of": "ag.c"},
    {"name": "f0", "kind": "compute", "direction": "forward", "region": "layers.0", "cost_ns": 100000, "reads": ["x", "A", "C"], "writes": ["h"]},
    {"name": "ag.b.w", "kind": "wait", "direction": "forward", "region": "layers.1", "of": "ag.b"},
    {"name": "f1", "kind": "compute", "direction": "forward", "region": "layers.1", "cost_ns": 100000, "reads": ["h", "B"], "writes": ["y"]},
    {"name": "b1", "kind": "compute", "direction": "backward", "region": "layers.1", "cost_ns": 200000, "reads": ["y", "B"], "writes": ["gb", "dh"]},
    {"name": "rs.b", "kind": "start", "direction": "backward", "region": "layers.1", "op": "reduce_scatter", "group": "dp", "dtype": "f32", "members": [{"in": "gb", "out": "GB", "bytes": 16384}]},
    {"name": "b0", "kind": "compute", "direction": "backward", "region": "layers.0", "cost_ns": 200000, "reads": ["dh", "A"], "writes": ["ga"]},
    {"name": "rs.a", "kind": "start", "direction": "backward", "region": "layers.0", "op": "reduce_scatter", "group": "dp", "dtype": "f32", "members": [{"in": "ga", "out": "GA", "bytes": 16384}]},
    {"name": "rs.b.w", "kind": "wait", "direction": "optimizer", "of": "rs.b"},
    {"name": "rs.a.w", "kind": "wait", "direction": "optimizer", "of": "rs.a"},
    {"name": "opt", "kind": "compute", "direction": "optimizer", "cost_ns": 10000, "reads": ["GA", "GB"], "writes": ["done"]}
  ]
}`

func writePlanGraph(t *testing.T, text string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "step.json")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestPlanText(t *testing.T) {
	f := writePlanGraph(t, planGraph)
	out := filepath.Join(t.TempDir(), "planned.json")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plan", f, "--passes", "reshard,blocks,overlap", "-o", out}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	s := stdout.String()
	for _, want := range []string{"reshard", "blocks", "overlap", "buckets:", "estimate before:", "estimate after", "peak memory estimate:", "schedule:", "reduce_scatter"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	// The planned graph is written and loads again.
	if code := run([]string{"plan", "--passes", "", out}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("re-planning the written graph: exit %d: %s", code, stderr.String())
	}
}

func TestPlanJSON(t *testing.T) {
	f := writePlanGraph(t, planGraph)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plan", "--json", f}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var s struct {
		Passes  []struct{ Pass string }
		Buckets []struct {
			Name, Group, Op, Direction string
			Bytes                      int64
			Members                    []string
		}
		Estimate struct{ Before, After struct{ Collectives int } }
	}
	if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(s.Passes) != 2 || s.Passes[0].Pass != "blocks" || s.Passes[1].Pass != "overlap" {
		t.Errorf("default passes: %+v", s.Passes)
	}
	// Block 0's two exposed gathers merge (one latency saved); no bucket
	// mixes directions, and every member is accounted for.
	members := 0
	for _, b := range s.Buckets {
		members += len(b.Members)
		if b.Group != "dp" || b.Bytes <= 0 || (b.Direction != "forward" && b.Direction != "backward") {
			t.Errorf("bucket %+v", b)
		}
	}
	if members != 5 || len(s.Buckets) >= 5 || s.Estimate.Before.Collectives != 5 {
		t.Errorf("%d buckets carrying %d members (before: %d collectives); want fewer than 5 carrying 5", len(s.Buckets), members, s.Estimate.Before.Collectives)
	}
}

// Bad input: an error that names what is wrong, and the usage exit code for
// a bad command line.
func TestPlanErrors(t *testing.T) {
	bad := strings.Replace(planGraph, `"reads": ["dh", "A"]`, `"reads": ["dh", "nosuch"]`, 1)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no file", []string{"plan"}, exitUsage, "need exactly one graph file"},
		{"missing file", []string{"plan", "/nonexistent/step.json"}, exitFailure, "no such file"},
		{"unknown pass", []string{"plan", "--passes", "blocks,fuse", writePlanGraph(t, planGraph)}, exitUsage, `unknown pass "fuse"`},
		{"bad node", []string{"plan", writePlanGraph(t, bad)}, exitFailure, `"b0"`},
		{"not json", []string{"plan", writePlanGraph(t, "{")}, exitFailure, "schema"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, nil, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d naming %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// --peak-budget reaches the planner: on the trainer's sharded step the chunk
// pass raises the peak estimate (266756 → 478212 bytes), so a budget
// between the two refuses it and the text says so; a budget above accepts.
func TestPlanPeakBudget(t *testing.T) {
	f := filepath.Join("..", "..", "libgorun", "testdata", "trainer-step.json")
	for _, tc := range []struct {
		budget  string
		refused bool
	}{{"300000", true}, {"500000", false}} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"plan", "--passes", "chunk", "--peak-budget", tc.budget, f}, nil, &stdout, &stderr); code != 0 {
			t.Fatalf("budget %s: exit %d: %s", tc.budget, code, stderr.String())
		}
		if got := strings.Contains(stdout.String(), "refused: the peak-memory estimate would rise"); got != tc.refused {
			t.Errorf("budget %s: refused=%v, want %v:\n%s", tc.budget, got, tc.refused, stdout.String())
		}
	}
}
