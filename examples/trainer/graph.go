package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/buckets"
	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/model"
	"github.com/gorun-hpc/gorun/stepgraph"
)

// The trainer's step as a stepgraph.Graph, written the way autograd runs it
// (forward block by block, the loss, backward in reverse block order, the
// optimizer block by block), before any pass. Names:
//
//	p.R         region R's parameters: the rank's own copy (dp) or the
//	            gathered full buffer (sharded, output of ag.R)
//	p.R.shard   the rank's shard of region R (sharded, an input)
//	act.R, d.R  region R's activations and the gradient flowing out of its
//	            backward; the model's workspace holds them, batch-major, so
//	            these names carry order and chunking, not bytes
//	g.T / G.T   dp: gradient of parameter tensor T before / after its
//	            all-reduce (the same memory: reduced in place)
//	g.R / gs.R  sharded, hsdp: region R's gradient and its reduce-scattered
//	            shard (over the shard group in hsdp)
//	gr.R        hsdp: gs.R all-reduced over the replica group (in place)
//	loss.local  the rank's loss sum; loss its all-reduced value (in place)
//	upd.R       marks the optimizer's update of region R
//
// Every tensor that a pass may split per chunk follows the chunk rules of
// stepgraph: activations are Batch (the default for compute outputs),
// gradients and the loss sum Partial (each chunk's is a partial sum over its
// samples), parameters Replicated.

// The one process group: every rank.
const world = "world"

// flopsPerNs prices compute for the passes' cost model: 1 GFLOP/s per
// worker, about what the pure-Go kernels reach on one core here. Only the
// ratio of compute to communication matters to the passes, and every rank
// computes the same numbers, so the plan is the same on every rank.
const flopsPerNs = 1

// buildGraph describes one step of t's configuration: the declarations,
// then forward, backward and the optimizer in plan order.
func (t *trainer) buildGraph() (*stepgraph.Graph, error) {
	b := stepgraph.NewBuilder().Group(world, t.N)
	if t.hsdp {
		b.Group("shard", t.S).Group("replica", t.N/t.S)
	}
	t.declareTensors(b)
	t.addForward(b)
	t.addBackward(b)
	t.addOptimizer(b)
	g, err := b.Graph()
	if err != nil {
		return nil, err
	}
	waitsAfterBackwardToOptimizer(g)
	if err := g.Validate(); err != nil {
		return nil, err
	}
	// The batch is split along its samples when a region is chunked
	// (inputs default to replicated: most are parameters).
	for i := range g.Tensors {
		if g.Tensors[i].Name == "batch" {
			g.Tensors[i].Chunk = stepgraph.Batch
		}
	}
	return g, nil
}

// cost prices compute of flops per sample for the passes' cost model.
func (t *trainer) cost(flops int64) time.Duration {
	return time.Duration(flops * int64(t.n) / int64(flopsPerNs*max(t.o.workers, 1)))
}

// declareTensors declares the batch, the parameters (shards, when
// sharded) and the gradients, which are partial sums over chunks.
func (t *trainer) declareTensors(b *stepgraph.Builder) {
	T := t.m.Config().SeqLen
	b.Input("batch", int64(t.n*T*4))
	for _, reg := range t.lay.Regions {
		if t.sharded {
			b.Input("p."+reg.Name+".shard", int64(reg.ShardSize(t.S))*4)
			b.Tensor("g."+reg.Name, int64(reg.PaddedSize(t.S))*4, stepgraph.Partial)
			continue
		}
		b.Input("p."+reg.Name, int64(reg.Size)*4)
		for _, ten := range reg.Tensors {
			b.Tensor("g."+ten.Name, int64(ten.Len)*4, stepgraph.Partial)
		}
	}
	b.Tensor("loss.local", 4, stepgraph.Partial)
}

// gather starts the all-gather of region r's parameters, in region.
func (t *trainer) gather(b *stepgraph.Builder, r int, region string) {
	reg := t.lay.Regions[r]
	b.Start("ag."+reg.Name, buckets.Forward, region, buckets.AllGather, t.shardGroup, "f32",
		[]stepgraph.Member{{In: "p." + reg.Name + ".shard", Out: "p." + reg.Name, Bytes: int64(reg.ShardSize(t.S)) * 4}})
}

// addForward adds forward and the loss. Sharded, the gather of block r+1
// is started before block r runs (FSDP's forward prefetch of one), block
// 0's first.
func (t *trainer) addForward(b *stepgraph.Builder) {
	regs := t.lay.Regions
	for r, reg := range regs {
		fwd, _ := t.m.FLOPs(r)
		if t.sharded {
			if r == 0 {
				t.gather(b, 0, reg.Name)
			}
			if r+1 < len(regs) {
				t.gather(b, r+1, reg.Name)
			}
			b.Wait("ag."+reg.Name+".wait", "ag."+reg.Name, reg.Name)
		}
		in := "batch"
		if r > 0 {
			in = "act." + regs[r-1].Name
		}
		b.Compute("fwd."+reg.Name, buckets.Forward, reg.Name, t.cost(fwd), []string{in, "p." + reg.Name}, []string{"act." + reg.Name})
	}
	head := regs[len(regs)-1].Name
	T := t.m.Config().SeqLen
	b.Compute("loss", buckets.Forward, head, t.cost(int64(T)), []string{"act." + head}, []string{"loss.local"})
	b.Start("ar.loss", buckets.Forward, head, buckets.AllReduce, world, "f32",
		[]stepgraph.Member{{In: "loss.local", Out: "loss", Bytes: 4}})
}

// addBackward adds backward, last block first; each block's gradient
// collectives start as soon as its backward has written them.
func (t *trainer) addBackward(b *stepgraph.Builder) {
	regs := t.lay.Regions
	head := regs[len(regs)-1].Name
	for r := len(regs) - 1; r >= 0; r-- {
		reg := regs[r]
		_, bwd := t.m.FLOPs(r)
		in := "act." + head
		if r < len(regs)-1 {
			in = "d." + regs[r+1].Name
		}
		writes := []string{"d." + reg.Name}
		if t.sharded {
			writes = append(writes, "g."+reg.Name)
		} else {
			for _, ten := range reg.Tensors {
				writes = append(writes, "g."+ten.Name)
			}
		}
		b.Compute("bwd."+reg.Name, buckets.Backward, reg.Name, t.cost(bwd), []string{in, "p." + reg.Name}, writes)
		if t.sharded {
			b.Start("rs."+reg.Name, buckets.Backward, reg.Name, buckets.ReduceScatter, t.shardGroup, "f32",
				[]stepgraph.Member{{In: "g." + reg.Name, Out: "gs." + reg.Name, Bytes: int64(reg.PaddedSize(t.S)) * 4}})
			continue
		}
		for _, ten := range reg.Tensors {
			b.Start("ar."+ten.Name, buckets.Backward, reg.Name, buckets.AllReduce, world, "f32",
				[]stepgraph.Member{{In: "g." + ten.Name, Out: "G." + ten.Name, Bytes: int64(ten.Len) * 4}})
		}
	}
}

// addUpdate adds region reg's optimizer update, reading its reduced gradients.
func (t *trainer) addUpdate(b *stepgraph.Builder, reg model.Region, reads []string) {
	b.Compute("opt."+reg.Name, buckets.Optimizer, reg.Name, t.cost(int64(3*reg.Size)/int64(t.n)), reads, []string{"upd." + reg.Name})
}

// addOptimizer adds the updates, in the order the gradients were reduced,
// each block waiting for its own gradients right before it reads them:
// the last reductions hide behind the first updates. Last, the loss's
// wait.
//
// Hybrid sharding sums each shard's gradient over the shard group
// (reduce-scatter) and then over the replicas (all-reduce of that output,
// on the replica group): the all-reduce reads another collective's result,
// so it starts after the reduce-scatter's wait, and is waited for one
// block later, so that it hides behind the previous block's update.
func (t *trainer) addOptimizer(b *stepgraph.Builder) {
	regs := t.lay.Regions
	var prev *model.Region // hsdp: the block whose replica all-reduce is in flight
	for r := len(regs) - 1; r >= 0; r-- {
		reg := regs[r]
		var reads []string
		switch {
		case t.hsdp:
			b.Wait("rs."+reg.Name+".wait", "rs."+reg.Name, reg.Name)
			b.Start("ar."+reg.Name, buckets.Optimizer, reg.Name, buckets.AllReduce, "replica", "f32",
				[]stepgraph.Member{{In: "gs." + reg.Name, Out: "gr." + reg.Name, Bytes: int64(reg.ShardSize(t.S)) * 4}})
			if prev != nil {
				b.Wait("ar."+prev.Name+".wait", "ar."+prev.Name, prev.Name)
				t.addUpdate(b, *prev, []string{"gr." + prev.Name})
			}
			prev = &regs[r]
			continue
		case t.sharded:
			b.Wait("rs."+reg.Name+".wait", "rs."+reg.Name, reg.Name)
			reads = []string{"gs." + reg.Name}
		default:
			for _, ten := range reg.Tensors {
				b.Wait("ar."+ten.Name+".wait", "ar."+ten.Name, reg.Name)
				reads = append(reads, "G."+ten.Name)
			}
		}
		t.addUpdate(b, reg, reads)
	}
	if prev != nil {
		b.Wait("ar."+prev.Name+".wait", "ar."+prev.Name, prev.Name)
		t.addUpdate(b, *prev, []string{"gr." + prev.Name})
	}
	b.Wait("ar.loss.wait", "ar.loss", "")
}

// waitsAfterBackwardToOptimizer gives the waits after backward to the
// optimizer, which blocks on them (Builder.Wait gives a wait its start's
// direction). The plan then says so, and the chunk pass, whose segments
// are runs of one direction, ends backward's last segment before them: its
// recombined results come before the optimizer's first wait, not behind
// it (TestOptimizerWaitsAfterBackward).
func waitsAfterBackwardToOptimizer(g *stepgraph.Graph) {
	lastBwd := 0
	for i := range g.Nodes {
		if g.Nodes[i].Kind == stepgraph.Compute && g.Nodes[i].Dir == buckets.Backward {
			lastBwd = i
		}
	}
	for i := lastBwd + 1; i < len(g.Nodes); i++ {
		if g.Nodes[i].Kind == stepgraph.Wait {
			g.Nodes[i].Dir = buckets.Optimizer
		}
	}
}

// passes runs the passes the flags ask for, in the order a compiler would:
// reshard after forward, chunking, then bucketing by block and
// overlap-preserving bucketing (the second merges what the first left
// apart across blocks, without exposing anything the first hid).
// --no-bucketing skips both bucketing passes: one collective per tensor.
func (t *trainer) passes(g *stepgraph.Graph) (*stepgraph.Graph, []string, error) {
	cfg := buckets.DefaultConfig()
	cfg.CapBytes = t.o.bucketCap
	var did []string
	var err error
	if t.o.reshard && t.sharded {
		var rep *stepgraph.ReshardReport
		if g, rep, err = stepgraph.Reshard(g, cfg.Model); err != nil {
			return nil, nil, fmt.Errorf("reshard: %w", err)
		}
		did = append(did, fmt.Sprintf("reshard (%d re-gathered, %d kept)", len(rep.Regathered), len(rep.Kept)))
	}
	if t.o.chunk {
		var rep *stepgraph.ChunkReport
		// Per-chunk reduction is only bitwise the reference when every
		// segment is split (the samples are chunk-major then); early
		// accumulation is whatever the pass decides.
		g, rep, err = stepgraph.ChunkWith(g, stepgraph.ChunkConfig{Pattern: "*", Model: cfg.Model,
			Accumulate: t.o.chunkAccumulate, Always: t.o.chunkForce || !t.o.chunkAccumulate})
		if err != nil {
			return nil, nil, fmt.Errorf("chunk: %w", err)
		}
		did = append(did, fmt.Sprintf("chunk (%d split, %d kept, accumulate=%v)", len(rep.Chunked), len(rep.Kept), t.o.chunkAccumulate))
	}
	if !t.o.noBucketing {
		if g, err = stepgraph.BucketBlocks(g, cfg); err != nil {
			return nil, nil, fmt.Errorf("bucket blocks: %w", err)
		}
		if g, err = stepgraph.BucketOverlap(g, cfg); err != nil {
			return nil, nil, fmt.Errorf("bucket overlap: %w", err)
		}
		did = append(did, "bucket-blocks", "bucket-overlap")
	}
	return g, did, nil
}

// splitChunk parses "NAME#C" (as stepgraph.Chunk names a tensor's chunk C;
// primes after C when a name was taken) into NAME and C, or NAME and -1.
func splitChunk(name string) (string, int) {
	i := strings.LastIndexByte(name, '#')
	if i < 0 {
		return name, -1
	}
	c, err := strconv.Atoi(strings.TrimRight(name[i+1:], "'"))
	if err != nil {
		return name, -1
	}
	return name[:i], c
}

// placeholder is the buffer of a tensor the workspace holds (activations):
// empty, so stepgraph's Split and Concat builtins over it are the views
// they are allowed to be.
var placeholder = comm.Float32s(nil)

// tensor resolves a graph tensor name to this rank's memory.
func (t *trainer) tensor(name string) (comm.Buffer, error) {
	base, c := splitChunk(name)
	if c >= t.chunks {
		return nil, fmt.Errorf("trainer: tensor %q: chunk %d of %d", name, c, t.chunks)
	}
	// grad returns chunk c's gradient buffer of region r, or the whole one.
	grad := func(r int) []float32 {
		if c < 0 {
			return t.gradWhole[r]
		}
		return t.grads[c][r]
	}
	kind, rest, _ := strings.Cut(base, ".")
	switch kind {
	case "batch", "act", "d", "upd":
		return placeholder, nil
	case "loss":
		// "loss" and "loss.local": reduced in place.
		if c < 0 {
			return comm.Float32s(t.lossWhole[:]), nil
		}
		return comm.Float32s(t.loss[c : c+1]), nil
	case "p":
		region, suffix, _ := strings.Cut(rest, "@")
		region, shard := strings.CutSuffix(region, ".shard")
		r, ok := t.regionIdx[region]
		switch {
		case !ok:
		case shard:
			return comm.Float32s(t.own[r]), nil
		case !t.sharded:
			return comm.Float32s(t.own[r]), nil
		case suffix == "bwd":
			return comm.Float32s(t.gathered(t.fullBwd, r)), nil
		case suffix == "":
			return comm.Float32s(t.gathered(t.full, r)), nil
		}
	case "g", "G":
		if r, ok := t.regionIdx[rest]; ok && t.sharded {
			return comm.Float32s(grad(r)), nil
		}
		if r, off, n, ok := t.tensorAt(rest); ok && !t.sharded {
			return comm.Float32s(grad(r)[off : off+n]), nil
		}
	case "gs", "gr":
		// gr (hsdp): the shard's gradient all-reduced over the replicas,
		// in place.
		if r, ok := t.regionIdx[rest]; ok && t.sharded && (kind == "gs" || t.hsdp) {
			if c < 0 {
				return comm.Float32s(t.gshWhole[r]), nil
			}
			return comm.Float32s(t.gsh[c][r]), nil
		}
	}
	return nil, fmt.Errorf("trainer: the step graph names tensor %q, which this trainer does not have", name)
}

// tensorAt finds parameter tensor name: its region, offset and length.
func (t *trainer) tensorAt(name string) (r, off, n int, ok bool) {
	ten, r, ok := t.lay.Tensor(name)
	if !ok {
		return 0, 0, 0, false
	}
	return r, ten.Offset, ten.Len, true
}

// gathered returns region r's gathered-parameter buffer from bufs (the
// forward or the backward copy), allocating it if released: the memory the
// graph runner frees after its last reader (see release) is really
// returned, and a reader that the plan let run after that gets a fresh
// buffer of zeros, not the old values.
func (t *trainer) gathered(bufs [][]float32, r int) []float32 {
	if bufs[r] == nil {
		bufs[r] = make([]float32, t.lay.Regions[r].PaddedSize(t.S))
	}
	return bufs[r]
}

// release is the graph runner's hook: a gathered parameter buffer is
// dropped once its last reader of the step has run (reshard-after-forward
// frees the forward copy after the last forward block that reads it).
// Gradients and the loss live in fixed buffers and are not dropped.
func (t *trainer) release(name string) {
	base, _ := splitChunk(name)
	kind, rest, _ := strings.Cut(base, ".")
	if kind != "p" || !t.sharded {
		return
	}
	region, suffix, _ := strings.Cut(rest, "@")
	if r, ok := t.regionIdx[region]; ok {
		if suffix == "bwd" {
			t.fullBwd[r] = nil
		} else {
			t.full[r] = nil
		}
	}
}
