package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/comm/commtest"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/model/modeltest"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/stepgraph"
	"github.com/rs/zerolog"
)

// numSteps is how long every bitwise comparison trains. Each step's loss
// and the final parameters are compared bit for bit, and a wrong bit in
// any step's gradient or update changes every later loss and the final
// parameters, so a few steps catch what twenty did (each step still reads
// a new batch and advances the optimizer's step count); under -race the
// matrix costs a quarter of what it did with 20.
const numSteps = 5

// reference is the one-rank simulation every run must reproduce bit for bit.
func reference(t *testing.T, o options) *modeltest.Result {
	t.Helper()
	ref, err := modeltest.Run(modeltest.Options{Model: o.modelConfig(), Optimizer: model.DefaultOptimizerConfig(),
		Batch: o.batch, Steps: o.steps, Ranks: 1})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func smallOptions() options {
	o := defaultOptions()
	o.steps, o.size, o.batch, o.deterministic = numSteps, "small", 8, true
	return o
}

// runInProcess trains with n goroutine ranks over comm on the in-memory
// network and returns rank 0's result (every rank's losses must agree).
func runInProcess(t *testing.T, o options, n int) *result {
	t.Helper()
	results, errs := runRanks(t, n, func(int) options { return o })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := 1; r < n; r++ {
		if !sameLosses(results[0].losses, results[r].losses) || results[0].params != results[r].params {
			t.Fatalf("rank %d disagrees with rank 0", r)
		}
	}
	return results[0]
}

// runRanks trains n goroutine ranks, rank r with opts(r).
func runRanks(t *testing.T, n int, opts func(r int) options) ([]*result, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nw := commtest.NewNetwork()
	addrs := make([]string, n)
	for r := range addrs {
		addrs[r] = fmt.Sprintf("rank%d:1", r)
	}
	ccfg := comm.LocalConfig()
	ccfg.Deterministic = opts(0).deterministic
	comms := make([][]*comm.Comm, n) // per rank: the world's, then hsdp's subgroups'
	results := make([]*result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ep := nw.Endpoint(addrs[r])
			c, err := comm.New(ctx, commtest.NewStaticGroup(r, addrs, nil), ep, ccfg)
			if err != nil {
				errs[r] = err
				return
			}
			comms[r] = append(comms[r], c)
			o := opts(r)
			// Subgroups over the same endpoint, told apart by their tag,
			// as rank.NewComm makes them under gorun.
			o.subgroup = func(ctx context.Context, name string, ranks []int) (overlap.Comm, error) {
				var sub []string
				me := -1
				for i, q := range ranks {
					sub = append(sub, addrs[q])
					if q == r {
						me = i
					}
				}
				cfg := ccfg
				cfg.Tag = name
				sc, err := comm.New(ctx, commtest.NewStaticGroup(me, sub, nil), ep, cfg)
				if err == nil {
					comms[r] = append(comms[r], sc)
				}
				return sc, err
			}
			var out bytes.Buffer
			results[r], errs[r] = run(ctx, o, c, zerolog.Nop(), &out)
			if errs[r] != nil {
				for _, c := range comms[r] {
					c.Abort(errs[r])
				}
			}
		})
	}
	wg.Wait()
	for _, cs := range comms {
		wg.Go(func() {
			for i := len(cs) - 1; i >= 0; i-- {
				_ = cs[i].Close()
			}
		})
	}
	wg.Wait()
	return results, errs
}

// TestPlanMismatch: a rank that buckets differently (here, without
// bucketing) makes every rank fail at the first collective with an error
// that says the plans differ — not a hang, not a silently wrong step.
func TestPlanMismatch(t *testing.T) {
	for _, mode := range []string{"dp", "sharded"} {
		t.Run(mode, func(t *testing.T) {
			_, errs := runRanks(t, 4, func(r int) options {
				o := smallOptions()
				o.batch, o.mode = 8, mode
				o.noBucketing = r == 1
				return o
			})
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "disagree on the bucket plan") {
					t.Errorf("rank %d: %v, want the plan mismatch", r, err)
				} else {
					t.Logf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func sameLosses(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func checkAgainst(t *testing.T, ref *modeltest.Result, losses []float32, params uint64) {
	t.Helper()
	if len(losses) != len(ref.Losses) {
		t.Fatalf("%d losses, reference has %d", len(losses), len(ref.Losses))
	}
	for i := range losses {
		if math.Float32bits(losses[i]) != math.Float32bits(ref.Losses[i]) {
			t.Fatalf("step %d: loss %s, reference %s", i+1, fmtLoss(losses[i]), fmtLoss(ref.Losses[i]))
		}
	}
	if want := model.Fingerprint(ref.Params...); params != want {
		t.Fatalf("final parameters %016x, reference %016x", params, want)
	}
}

func fmtLoss(f float32) string { return strconv.FormatFloat(float64(f), 'g', -1, 32) }

// TestNumericsMatrix: with --deterministic, every rank count, mode and
// option gives the losses and final parameters of the one-rank reference,
// bit for bit, over numSteps steps.
func TestNumericsMatrix(t *testing.T) {
	base := smallOptions()
	ref := reference(t, base)
	type variant struct {
		name string
		set  func(*options)
	}
	variants := []variant{
		{"plain", func(*options) {}},
		{"no-bucketing", func(o *options) { o.noBucketing = true }},
		{"no-overlap", func(o *options) { o.noOverlap = true }},
		{"tiny-cap", func(o *options) { o.bucketCap = 256 }},
		{"chunk", func(o *options) { o.chunk = true }},
		{"chunk-force", func(o *options) { o.chunk, o.chunkForce = true, true }},
		{"chunk-per-chunk", func(o *options) { o.chunk, o.chunkAccumulate = true, false }},
		{"grouped", func(o *options) { o.grouped = true }},
		{"reshard", func(o *options) { o.reshard = true }},
		{"reshard+chunk+no-overlap", func(o *options) { o.reshard, o.chunk, o.chunkForce, o.noOverlap = true, true, true, true }},
		{"reshard+chunk-per-chunk+grouped", func(o *options) { o.reshard, o.chunk, o.chunkAccumulate, o.grouped = true, true, false, true }},
	}
	hsdpOnly := []variant{
		{"shard-size-1", func(o *options) { o.shardSize = 1 }},
		{"shard-size-4", func(o *options) { o.shardSize = 4 }},
	}
	for _, mode := range []string{"dp", "sharded", "hsdp"} {
		for _, n := range []int{1, 2, 4} {
			vs := variants
			if mode == "hsdp" && n == 4 {
				vs = append(slices.Clone(variants), hsdpOnly...)
			}
			for _, v := range vs {
				// Every variant on 4 ranks; 1 and 2 ranks with the plain
				// run and the most different one, to keep -race short.
				if n < 4 && v.name != "plain" && v.name != "reshard+chunk+no-overlap" && v.name != "reshard+chunk-per-chunk+grouped" {
					continue
				}
				if mode == "hsdp" && strings.Contains(v.name, "per-chunk") {
					continue // refused (options.validate; TestHSDPRefusals)
				}
				t.Run(fmt.Sprintf("%s/np%d/%s", mode, n, v.name), func(t *testing.T) {
					o := base
					o.mode = mode
					v.set(&o)
					res := runInProcess(t, o, n)
					checkAgainst(t, ref, res.losses, res.params)
				})
			}
		}
	}
}

// TestDeterministicRepeats: two runs with the same flags give the same bits.
func TestDeterministicRepeats(t *testing.T) {
	o := smallOptions()
	o.mode, o.reshard = "sharded", true
	a := runInProcess(t, o, 4)
	b := runInProcess(t, o, 4)
	if !sameLosses(a.losses, b.losses) || a.params != b.params {
		t.Fatalf("repeat differs: %v vs %v", a.losses, b.losses)
	}
}

// TestTraceMerged: --trace writes every rank's timeline and rank 0's merge.
func TestTraceMerged(t *testing.T) {
	o := smallOptions()
	o.steps = 2
	o.trace = filepath.Join(t.TempDir(), "t.json")
	runInProcess(t, o, 2)
	for _, f := range []string{"t.rank0.json", "t.rank1.json", "t.json"} {
		fh, err := os.Open(filepath.Join(filepath.Dir(o.trace), f))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := overlap.ReadTrace(fh)
		fh.Close()
		if err != nil {
			t.Fatal(err)
		}
		pids := map[int]bool{}
		cats := map[string]bool{}
		for _, e := range tr.TraceEvents {
			pids[e.PID], cats[e.Cat] = true, true
		}
		if want := 1 + btoi(f == "t.json"); len(pids) != want {
			t.Errorf("%s: events of %d ranks, want %d", f, len(pids), want)
		}
		for _, c := range []string{"compute", "comm", "wait", "start→wait", "step"} {
			if !cats[c] {
				t.Errorf("%s: no %q events", f, c)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestRealProcesses runs the real binaries under the real launcher: gorun
// -np N trainer, losses parsed from rank 0's step lines, against the
// reference. A subset of the matrix: the launcher, rendezvous and TCP/shm
// data plane are what this adds.
func TestRealProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	ref := reference(t, smallOptions())
	for _, tc := range []struct {
		np   int
		args string
	}{
		{1, ""},
		{2, "--mode sharded --reshard --chunk"},
		{4, ""},
		{4, "--mode sharded --reshard --no-bucketing"},
		{4, "--chunk --no-overlap --bucket-cap 1024"},
		{4, "--mode hsdp --shard-size 2 --reshard --chunk"},
	} {
		t.Run(fmt.Sprintf("np%d %s", tc.np, tc.args), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := []string{"-np", strconv.Itoa(tc.np), filepath.Join(dir, "trainer"),
				"--steps", strconv.Itoa(numSteps), "--model", "small", "--batch", "8", "--deterministic"}
			args = append(args, strings.Fields(tc.args)...)
			cmd := exec.CommandContext(ctx, filepath.Join(dir, "gorun"), args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("gorun: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
			}
			losses, params := parseOutput(t, string(out))
			checkAgainst(t, ref, losses, params)
		})
	}
}

// TestRealPlanMismatch: under the real launcher, a rank started with other
// bucketing flags makes the job fail with the plan-mismatch error, not hang.
func TestRealPlanMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	dir := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script := `if [ "$RANK" = 1 ]; then set -- --no-bucketing; fi; exec "$0" --steps 3 --model small --batch 8 "$@"`
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "gorun"), "-np", "2", "/bin/sh", "-c", script, filepath.Join(dir, "trainer"))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("job succeeded with different plans:\n%s", out)
	}
	if !strings.Contains(string(out), "disagree on the bucket plan") {
		t.Fatalf("no plan-mismatch error in the job's output:\n%s", out)
	}
}

// buildBinaries builds gorun and the trainer into a temporary directory.
// buildBinaries builds gorun and the trainer once per test process (a
// link of each costs seconds on a loaded machine) into binDir, which
// TestMain removes.
func buildBinaries(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "trainer-test-bin-")
		if err != nil {
			binErr = err
			return
		}
		binDir = dir
		binErr = launchertest.GoBuild(dir, "cmd/gorun", "examples/trainer")
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// parseOutput reads the step lines and the summary's parameter fingerprint.
func parseOutput(t *testing.T, out string) ([]float32, uint64) {
	t.Helper()
	var losses []float32
	var params uint64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 6 && f[0] == "step" && f[2] == "loss" && f[4] == "time":
			v, err := strconv.ParseFloat(f[3], 32)
			if err != nil {
				t.Fatalf("bad loss in %q", line)
			}
			losses = append(losses, float32(v))
		case strings.HasPrefix(line, "summary:"):
			i := strings.LastIndex(line, "params ")
			v, err := strconv.ParseUint(strings.TrimSpace(line[i+len("params "):]), 16, 64)
			if err != nil {
				t.Fatalf("bad summary %q", line)
			}
			params = v
		}
	}
	if len(losses) == 0 {
		t.Fatalf("no step lines in:\n%s", out)
	}
	return losses, params
}

// TestDumpGraph: --dump-graph writes the step as written, before the passes,
// in stepgraph's JSON schema; it loads back, validates and is the graph the
// passes started from (the reshard pass finds its forward gathers in it).
func TestDumpGraph(t *testing.T) {
	o := smallOptions()
	o.steps, o.mode, o.reshard = 1, "sharded", true
	o.dumpGraph = filepath.Join(t.TempDir(), "step.json")
	runInProcess(t, o, 2)
	f, err := os.Open(o.dumpGraph)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := stepgraph.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	var gathers, regathers, computes int
	for _, n := range g.Nodes {
		switch {
		case n.Kind == stepgraph.Start && n.Op == "all_gather" && strings.HasSuffix(n.Name, "@bwd"):
			regathers++
		case n.Kind == stepgraph.Start && n.Op == "all_gather":
			gathers++
		case n.Kind == stepgraph.Compute:
			computes++
		}
	}
	// 4 regions (embed, 2 blocks, head): 4 gathers, none re-gathered yet;
	// forward, backward and optimizer per region plus the loss.
	if gathers != 4 || regathers != 0 || computes != 13 {
		t.Fatalf("dumped graph: %d gathers, %d re-gathers, %d computes; want 4, 0, 13", gathers, regathers, computes)
	}
	out, _, err := stepgraph.Reshard(g, buckets.DefaultModel())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Nodes) <= len(g.Nodes) {
		t.Fatal("reshard found nothing to re-gather in the dumped graph")
	}
}

// TestReshardFreesMemory: the collective memory the graph runner measures
// (gathered parameters, reduced gradients, from start to last reader) is
// the plan's estimate within 10% when collectives go out at their plan
// positions, and resharding after forward lowers it: the forward copy of a
// block's parameters is really dropped after its last forward reader.
func TestReshardFreesMemory(t *testing.T) {
	peak := map[bool]int64{}
	for _, reshard := range []bool{false, true} {
		o := smallOptions()
		o.steps, o.mode, o.reshard, o.prefetch = 2, "sharded", reshard, 0
		res := runInProcess(t, o, 4)
		got, est := res.total.PeakBytes, res.peakEstimate
		if got <= 0 || est <= 0 || math.Abs(float64(got-est)) > 0.1*float64(est) {
			t.Errorf("reshard=%v: measured peak %d bytes, plan estimate %d: not within 10%%", reshard, got, est)
		}
		t.Logf("reshard=%v: measured peak %d bytes, estimate %d", reshard, got, est)
		peak[reshard] = got
	}
	if peak[true] >= peak[false] {
		t.Errorf("resharding did not lower the measured peak: %d with, %d without", peak[true], peak[false])
	}
}

// TestHSDPRefusals: hybrid sharding options that cannot work are refused
// before anything is sent, with the reason.
func TestHSDPRefusals(t *testing.T) {
	sub := func(context.Context, string, []int) (overlap.Comm, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		set  func(*options)
		want string
	}{
		{"shard size not dividing", func(o *options) { o.shardSize = 3 }, "divides the rank count"},
		{"negative shard size", func(o *options) { o.shardSize = -1 }, "divides the rank count"},
		{"per-chunk reduction", func(o *options) { o.chunk, o.chunkAccumulate = true, false }, "per-chunk reduction"},
		{"no subgroups", func(o *options) { o.subgroup = nil }, "subgroup communicators"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := smallOptions()
			o.mode, o.subgroup = "hsdp", sub
			tc.set(&o)
			err := o.validate(4)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	o := smallOptions()
	o.mode, o.subgroup, o.shardSize = "hsdp", sub, 2
	if err := o.validate(4); err != nil {
		t.Fatalf("a valid hsdp configuration refused: %v", err)
	}
}
