// Command trainer is gorun's main job: a small decoder-only transformer
// (package model) trained on a synthetic task in pure Go on the CPU, data
// parallel, sharded, or hybrid-sharded (hsdp: sharded within groups of
// --shard-size ranks, replicated across them) over the ranks gorun starts. The step is described
// once as a stepgraph.Graph (graph.go), the stepgraph passes the flags ask
// for rewrite it (--reshard, --chunk, and the two bucketing passes unless
// --no-bucketing), and overlap's GraphRunner executes the result every step:
// gradient (and, sharded, parameter) collectives bucketed and overlapped
// with compute. --dump-graph writes the graph before the passes for
// `gorun plan`.
//
//	gorun -np 4 bin/trainer --steps 20
//	gorun -np 4 bin/trainer --mode sharded --reshard --deterministic --trace /tmp/t.json
//	gorun -np 4 bin/trainer --mode hsdp --shard-size 2 --deterministic
//
// Rank 0 prints one line per step, "step N loss X time Yms" (X with full
// float32 precision, so runs compare bit for bit), and a summary with the
// mean step time and exposed-communication fraction over every step but the
// first (which warms caches and connections; the summary names the steps). With --deterministic every reduction
// follows one pairwise tree over the global batch, so the losses do not
// depend on the rank count, bucketing, overlap, resharding or chunking.
//
// Rank setup is rank.Init (environment → data-plane endpoint → rendezvous →
// world communicator), then model + overlap. Started without a launcher, it
// runs as a single rank.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/overlap"
	"github.com/gorun-hpc/gorun/rank"
	"github.com/rs/zerolog"
)

func main() {
	os.Exit(mainErr(os.Args[1:]))
}

func parseFlags(args []string) (options, bool, error) {
	o := defaultOptions()
	fs := flag.NewFlagSet("trainer", flag.ContinueOnError)
	fs.IntVar(&o.steps, "steps", o.steps, "training steps")
	fs.StringVar(&o.mode, "mode", o.mode, "dp (gradient all-reduce), sharded (parameter all-gather, gradient reduce-scatter) or hsdp (sharded within groups of --shard-size ranks, gradient shards all-reduced across the groups)")
	fs.IntVar(&o.shardSize, "shard-size", 0, "hsdp: ranks per shard group, consecutive (0: 2)")
	fs.BoolVar(&o.deterministic, "deterministic", false, "reduce along one fixed tree: bitwise the same losses for any rank count and option")
	fs.Int64Var(&o.bucketCap, "bucket-cap", 0, "bucket size cap in bytes (0: from the cost model)")
	fs.BoolVar(&o.noBucketing, "no-bucketing", false, "skip the bucketing passes (block, then overlap-preserving): one collective per tensor")
	fs.BoolVar(&o.noOverlap, "no-overlap", false, "wait for every collective as soon as it is issued")
	fs.BoolVar(&o.reshard, "reshard", false, "sharded: run the reshard-after-forward pass (gather parameters again in backward instead of keeping the forward copy)")
	fs.BoolVar(&o.chunk, "chunk", false, "run the chunking pass: each region's batch in two chunks, one chunk's communication behind the other's compute")
	fs.BoolVar(&o.chunkAccumulate, "chunk-accumulate", o.chunkAccumulate, "with --chunk: sum the two chunks' gradients before one collective (false: one collective per chunk, as eager chunking does)")
	fs.BoolVar(&o.chunkForce, "chunk-force", false, "with --chunk: split every region, even where the cost model says that exposes more communication")
	fs.IntVar(&o.prefetch, "prefetch", o.prefetch, "issue a collective at most N starts ahead of its place in the plan (0: at its place; negative: as soon as its inputs exist)")
	fs.StringVar(&o.dumpGraph, "dump-graph", "", "write the step graph (before the passes) as JSON to FILE, for `gorun plan`")
	fs.BoolVar(&o.grouped, "grouped", false, "hand bucket sets to the communicator as grouped calls")
	fs.StringVar(&o.trace, "trace", "", "write a Chrome/Perfetto trace: FILE.rankK.json per rank and the merged FILE on rank 0")
	fs.IntVar(&o.batch, "batch", o.batch, "global batch (power of two)")
	fs.StringVar(&o.size, "model", o.size, "model size: default or small")
	fs.IntVar(&o.workers, "workers", 1, "compute goroutines per rank")
	fs.StringVar(&o.checkpoint, "checkpoint", "", "write checkpoints to `DIR` (rank 0, atomically) and resume from the one there at start")
	fs.IntVar(&o.checkpointEvery, "checkpoint-every", 0, "with --checkpoint: write one every `N` steps (0: only when gorun's checkpoint signal arrives)")
	fs.BoolVar(&o.faultTolerant, "fault-tolerant", false, "with --mode dp (or hsdp under gorun --fault-tolerant-group S) under gorun --fault-tolerant: a per-step quorum, steps committed only when every participant finished them, a replacement healed from the live replicas (every replica prints its steps and a state digest)")
	fs.DurationVar(&o.stepSleep, "step-sleep", 0, "with --fault-tolerant: pause `DUR` after every committed step")
	fs.StringVar(&o.crash, "crash", "", "with --fault-tolerant, for tests: kill this replica at `WHERE:rank=R[:incarnation=I][:step=N][:exit=C]`, WHERE reduce (after step N's all-reduce, before its commit vote), load (receiving a heal), save (serving one) or done (after the last step); exit=C exits with code C instead of SIGKILL; several comma-separated")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return o, false, err
	}
	if fs.NArg() > 0 {
		return o, false, fmt.Errorf("trainer: unexpected arguments %q", fs.Args())
	}
	return o, *verbose, nil
}

func mainErr(args []string) int {
	o, verbose, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lvl := zerolog.WarnLevel
	if verbose {
		lvl = zerolog.DebugLevel
	}
	log := consolelog.New(os.Stderr, lvl)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.checkpoint != "" {
		// Caught from the start: gorun may ask before the first step, and
		// an uncaught SIGUSR1 would kill the rank.
		sig, err := checkpointSignal()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		asked := make(chan os.Signal, 1)
		signal.Notify(asked, sig)
		defer signal.Stop(asked)
		o.checkpointAsked = asked
	}
	if o.faultTolerant {
		if (o.mode != "dp" && o.mode != "hsdp") || o.checkpoint != "" {
			fmt.Fprintln(os.Stderr, "trainer: --fault-tolerant runs --mode dp or hsdp without --checkpoint (the state heals from the live replicas)")
			return 2
		}
		if err := runFT(ctx, o, log, os.Stdout); err != nil {
			if ctx.Err() != nil {
				// gorun stopped this replica (the job ended): what it
				// was doing failed for that reason alone.
				fmt.Fprintln(os.Stderr, "trainer: stopped by a signal")
				return 1
			}
			fmt.Fprintf(os.Stderr, "trainer: %s\n", strings.TrimPrefix(err.Error(), "trainer: "))
			return 1
		}
		return 0
	}
	opts := rank.DefaultOptions()
	opts.Logger = log
	opts.Comm.Deterministic = o.deterministic
	r, err := rank.Init(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "trainer: %v\n", err)
		return 1
	}
	cm := r.Comm()
	log = log.With().Int("rank", cm.Rank()).Logger()
	o.subgroup = func(ctx context.Context, name string, ranks []int) (overlap.Comm, error) {
		g, err := r.Group(ranks)
		if err != nil {
			return nil, err
		}
		return r.NewComm(ctx, g, "trainer."+name) // closed by r.Close
	}
	o.reportStep = r.ReportStep
	_, err = run(ctx, o, cm, log, os.Stdout)
	if err != nil {
		r.Abort(err) // free the peers now instead of at their timeouts
	}
	cerr := r.Close()
	if err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "trainer: rank %d: %v\n", cm.Rank(), err)
		return 1
	}
	return 0
}

// writeTraces writes this rank's timeline to FILE.rankK.json and gathers
// every rank's onto rank 0, which writes the merged FILE: the ranks may be
// on different hosts, so the bytes travel over the communicator.
func writeTraces(ctx context.Context, cm overlap.Comm, tl *overlap.Timeline, file string) error {
	var own bytes.Buffer
	if _, err := tl.WriteTo(&own); err != nil {
		return err
	}
	base := strings.TrimSuffix(file, ".json")
	if err := os.WriteFile(fmt.Sprintf("%s.rank%d.json", base, cm.Rank()), own.Bytes(), 0o644); err != nil {
		return fmt.Errorf("%w: %w", errTrace, err)
	}
	n := cm.Size()
	sizes := make([]int64, n)
	if err := cm.AllGather(ctx, comm.Int64s([]int64{int64(own.Len())}), comm.Int64s(sizes)).Wait(ctx); err != nil {
		return err
	}
	var most int64
	for _, s := range sizes {
		most = max(most, s)
	}
	send := make([]byte, most)
	copy(send, own.Bytes())
	all := make([]byte, most*int64(n))
	if err := cm.AllGather(ctx, comm.Uint8s(send), comm.Uint8s(all)).Wait(ctx); err != nil {
		return err
	}
	if cm.Rank() != 0 {
		return nil
	}
	var traces []overlap.Trace
	for r := range n {
		t, err := overlap.ReadTrace(bytes.NewReader(all[int64(r)*most : int64(r)*most+sizes[r]]))
		if err != nil {
			return fmt.Errorf("%w: rank %d: %w", errTrace, r, err)
		}
		traces = append(traces, t)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("%w: %w", errTrace, err)
	}
	if err := overlap.MergeTraces(f, traces...); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
