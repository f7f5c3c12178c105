// Package stepgraph owns the training step as data: a schedule of compute,
// collective-start and wait nodes, each tagged with its direction (forward,
// backward, optimizer) and region (a module path such as "layers.3.attn"),
// plus the passes that rewrite it and the checker that estimates how much
// communication each region leaves exposed.
//
// # The model
//
// A Graph is a list of nodes in plan order. Compute runs on one compute
// stream in that order; a start issues its collective on its group's comm
// stream when the plan reaches it; a wait blocks the compute stream until its
// collective (and, since a group completes in issue order, everything issued
// before it on that group) has finished. Tensors are written once (single
// assignment): data edges run from a tensor's writer to its readers. A start
// reads its members' input tensors; its wait writes their outputs.
//
// Besides data edges the graph has implicit ones, the ideas the runtime
// carries from its seeds: start → wait; start → hiding compute → wait for the
// compute that hides a collective (named by the author, or found by
// simulation); and one FIFO chain of starts per group. Validate rejects
// graphs whose edges form a cycle or that the plan order violates.
//
// # Passes
//
// BucketBlocks, BucketOverlap, Reshard and Chunk are pure functions
// Graph → Graph: no goroutines, clocks or I/O, and the same input gives the
// same output on every rank. Each one checks its own result with Check and
// never returns a plan in which a collective that was hidden became exposed;
// the bucketing passes and Chunk also never increase the total exposed time.
// Plan extracts the buckets.Plan that executors consume.
//
// RunPlanner chains passes by name, as `gorun plan` and libgorun's
// gorun_plan do. With a peak-memory budget it refuses any pass whose result
// would raise the PeakBytes estimate above the budget, keeps the graph from
// before that pass and says why in the pass's result. Planning cost grows
// about linearly with the step (scripts/bench-plan.sh measures it at 10k,
// 30k and 100k nodes): every graph of the chain is validated once, and no
// pass compares every pair of collectives.
//
// # What a plan obliges its executor to do
//
// Compute runs in plan order (or concurrently where data edges allow, as
// long as the result is the same). On each group, starts are issued in plan
// order, which every rank shares (buckets.Plan.Hash checks it); a start may
// be issued earlier than its plan position once its inputs exist and the
// previous start of its group was issued, never later than the compute it
// precedes in the plan. A wait may be taken later than its plan position but
// no later than the first reader of its outputs. A bucket's members are
// packed at the offsets of buckets.Plan and scattered back before its wait
// returns. Compute with a Builtin is run by the executor itself (Split and
// Concat may be views over one batch-major buffer; Sum adds chunk 0 and
// chunk 1 in that order); compute with a Chunk runs the author's callback for
// Chunk.Of on that chunk of the batch.
//
// # Left to others
//
// Cost constants and bucket plans belong to buckets; moving bytes to comm and
// nccl; executing a plan, timelines and the per-step plan-hash exchange to
// overlap. The JSON form of a graph is versioned and described in SCHEMA.md.
package stepgraph
