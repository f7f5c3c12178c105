//go:build cgo

package main

/*
#include <stdlib.h>
#include <stdint.h>
*/
import "C"

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// The planner's door: `gorun plan` as a function of bytes to bytes, for
// bindings that trace a step themselves (the Python fx tracer) and for
// trainers that plan at start-up. Planning is stepgraph.RunPlanner; this file
// only parses options, encodes the result and hashes it.

// planOptions is the options object of gorun_plan (gorun.h documents the
// keys). Unknown keys are refused: a misspelt budget must not silently plan
// without one.
type planOptions struct {
	// Passes is a comma-separated string or a list of names; absent means
	// stepgraph.DefaultPasses, "" or [] none.
	Passes          json.RawMessage `json:"passes"`
	CapBytes        int64           `json:"cap_bytes"`
	MinBytes        int64           `json:"min_bytes"`
	SearchLimit     int             `json:"search_limit"`
	LatencyNs       *int64          `json:"latency_ns"`
	BusBandwidth    *float64        `json:"bus_bandwidth"`
	CopyBandwidth   *float64        `json:"copy_bandwidth"`
	ChunkRegions    *string         `json:"chunk_regions"`
	ChunkAccumulate *bool           `json:"chunk_accumulate"`
	ChunkDirs       *string         `json:"chunk_dirs"`
	ChunkAlways     *bool           `json:"chunk_always"`
	ChunkCount      int             `json:"chunk_count"`
	ReshardPrefetch *int            `json:"reshard_prefetch"`
	PeakBudget      int64           `json:"peak_budget_bytes"`
}

// plannerConfig turns the options into the config `gorun plan` would use
// with the same flags.
func plannerConfig(opts []byte) (stepgraph.PlannerConfig, error) {
	cfg := stepgraph.PlannerConfig{
		Buckets:         buckets.DefaultConfig(),
		Chunk:           stepgraph.ChunkConfig{Pattern: "*", Accumulate: true},
		ReshardPrefetch: 1,
	}
	var o planOptions
	if len(bytes.TrimSpace(opts)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(opts))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return cfg, fmt.Errorf("%w: gorun_plan: options: %v", errInvalid, err)
		}
	}
	if len(o.Passes) > 0 && string(o.Passes) != "null" {
		var list []string
		var s string
		if err := json.Unmarshal(o.Passes, &s); err == nil {
			list = strings.Split(s, ",")
		} else if err := json.Unmarshal(o.Passes, &list); err != nil {
			return cfg, fmt.Errorf("%w: gorun_plan: options: passes must be a comma-separated string or a list of names, got %s", errInvalid, o.Passes)
		}
		cfg.Passes = []string{}
		for _, p := range list {
			if p = strings.TrimSpace(p); p != "" {
				cfg.Passes = append(cfg.Passes, p)
			}
		}
	}
	cfg.Buckets.CapBytes, cfg.Buckets.MinBytes = o.CapBytes, o.MinBytes
	if o.SearchLimit != 0 {
		cfg.Buckets.SearchLimit = o.SearchLimit
	}
	if o.LatencyNs != nil {
		cfg.Buckets.Model.Latency = time.Duration(*o.LatencyNs)
	}
	if o.BusBandwidth != nil {
		cfg.Buckets.Model.BusBandwidth = *o.BusBandwidth
	}
	if o.CopyBandwidth != nil {
		cfg.Buckets.Model.CopyBandwidth = *o.CopyBandwidth
	}
	if o.ChunkRegions != nil {
		cfg.Chunk.Pattern = *o.ChunkRegions
	}
	if o.ChunkAccumulate != nil {
		cfg.Chunk.Accumulate = *o.ChunkAccumulate
	}
	if o.ChunkDirs != nil {
		cfg.Chunk.Dirs = nil
		for _, d := range strings.Split(*o.ChunkDirs, ",") {
			switch strings.TrimSpace(d) {
			case "":
			case "forward", "fwd":
				cfg.Chunk.Dirs = append(cfg.Chunk.Dirs, buckets.Forward)
			case "backward", "bwd":
				cfg.Chunk.Dirs = append(cfg.Chunk.Dirs, buckets.Backward)
			case "optimizer", "opt":
				cfg.Chunk.Dirs = append(cfg.Chunk.Dirs, buckets.Optimizer)
			default:
				return cfg, fmt.Errorf("%w: gorun_plan: options: chunk_dirs %q: unknown direction %q (want forward, backward, optimizer)", errInvalid, *o.ChunkDirs, d)
			}
		}
	}
	if o.ChunkAlways != nil {
		cfg.Chunk.Always = *o.ChunkAlways
	}
	if o.ChunkCount < 0 || o.ChunkCount == 1 {
		return cfg, fmt.Errorf("%w: gorun_plan: options: chunk_count %d (want 2 or more; 0: 2)", errInvalid, o.ChunkCount)
	}
	cfg.Chunk.Count = o.ChunkCount
	if o.ReshardPrefetch != nil {
		cfg.ReshardPrefetch = *o.ReshardPrefetch
	}
	cfg.PeakBudget = o.PeakBudget
	if err := cfg.Buckets.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: gorun_plan: options: %v", errInvalid, err)
	}
	if cfg.PeakBudget < 0 {
		return cfg, fmt.Errorf("%w: gorun_plan: options: peak_budget_bytes %d is negative (0: no budget)", errInvalid, cfg.PeakBudget)
	}
	return cfg, nil
}

// planResult is gorun_plan's output document.
type planResult struct {
	// Plan is what `gorun plan --json` prints.
	Plan *stepgraph.PlanSummary `json:"plan"`
	// Graph is the planned graph as a step-graph document (what `gorun plan
	// -o` writes), present when the passes changed the graph.
	Graph json.RawMessage `json:"graph,omitempty"`
	// Text is what `gorun plan` prints, for logs.
	Text string `json:"text"`
	// BucketsHash is buckets.Plan.Hash of the planned graph (%016x): what
	// an executor's per-step plan check compares.
	BucketsHash string `json:"buckets_hash"`
	// Hash is "sha256:" and the hex SHA-256 of the planned graph's
	// document and the plan, as encoded here: equal on ranks that planned
	// the same graph with the same options and binary.
	Hash string `json:"hash"`
}

// planJSON is gorun_plan without C: graph document and options in, result
// document out.
func planJSON(graph, opts []byte) ([]byte, error) {
	cfg, err := plannerConfig(opts)
	if err != nil {
		return nil, err
	}
	g, err := stepgraph.Load(bytes.NewReader(graph))
	if err != nil {
		return nil, fmt.Errorf("%w: gorun_plan: graph: %v", errInvalid, err)
	}
	var in bytes.Buffer
	if err := stepgraph.Save(&in, g); err != nil {
		return nil, fmt.Errorf("gorun_plan: encoding the graph: %w", err)
	}
	s, err := stepgraph.RunPlanner(g, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: gorun_plan: %v", errInvalid, err)
	}
	var out bytes.Buffer
	if err := stepgraph.Save(&out, s.Graph()); err != nil {
		return nil, fmt.Errorf("gorun_plan: encoding the planned graph: %w", err)
	}
	summary, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("gorun_plan: encoding the plan: %w", err)
	}
	bp, err := stepgraph.Plan(s.Graph())
	if err != nil {
		return nil, fmt.Errorf("gorun_plan: the planned graph's bucket plan: %w", err)
	}
	var text strings.Builder
	if err := s.WriteText(&text); err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(out.Bytes())
	h.Write(summary)
	res := planResult{
		Plan:        s,
		Text:        text.String(),
		BucketsHash: fmt.Sprintf("%016x", bp.Hash()),
		Hash:        "sha256:" + hex.EncodeToString(h.Sum(nil)),
	}
	if !bytes.Equal(in.Bytes(), out.Bytes()) {
		res.Graph = json.RawMessage(bytes.TrimSpace(out.Bytes()))
	}
	return json.Marshal(res)
}

//export gorun_plan
func gorun_plan(graph *C.char, graphLen C.size_t, options *C.char, out **C.char, outLen *C.size_t) (rc C.int) {
	defer guard(&rc)
	if out == nil || outLen == nil {
		return setErr(fmt.Errorf("%w: gorun_plan: out or out_len is NULL", errInvalid), nil)
	}
	*out, *outLen = nil, 0
	if graph == nil {
		return setErr(fmt.Errorf("%w: gorun_plan: graph is NULL", errInvalid), nil)
	}
	if uint64(graphLen) > math.MaxInt32 {
		return setErr(fmt.Errorf("%w: gorun_plan: graph_len %d is over 2 GiB", errInvalid, uint64(graphLen)), nil)
	}
	in := C.GoBytes(unsafe.Pointer(graph), C.int(graphLen))
	var opts []byte
	if options != nil {
		opts = []byte(C.GoString(options))
	}
	res, err := planJSON(in, opts)
	if err != nil {
		return setErr(err, nil)
	}
	// malloc'd, NUL-terminated for C callers that treat it as a string;
	// gorun_plan_free releases it.
	buf := C.malloc(C.size_t(len(res) + 1))
	if buf == nil {
		return setErr(fmt.Errorf("gorun_plan: out of memory for a %d-byte result", len(res)), nil)
	}
	dst := unsafe.Slice((*byte)(buf), len(res)+1)
	copy(dst, res)
	dst[len(res)] = 0
	*out, *outLen = (*C.char)(buf), C.size_t(len(res))
	return ok()
}

//export gorun_plan_free
func gorun_plan_free(buf *C.char) {
	C.free(unsafe.Pointer(buf))
}
