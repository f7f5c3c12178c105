// Package buckets owns the decision of which collectives travel together: the
// latency–bandwidth cost model that says how big a bucket should be, and the
// bucket plan that says, per process group, which tensors form each bucket,
// where each one sits in the fused buffer and in what order the buckets are
// issued.
//
// A plan is what every consumer of bucketing shares: the graph passes in
// stepgraph produce one from a step graph (stepgraph.Plan), Assign produces
// one for eager programs that have no graph, the executor in overlap walks one
// every step, and a backend with group semantics (NCCL) can hand one bucket
// set (Bucket.Set) at a time to a grouped call. Filler is the bookkeeping of
// eager, on-the-fly bucketing over a plan: tensors go in as they become
// ready, startable buckets come out in issue order. Because every rank must issue the same
// buckets in the same order on each group, a plan is a pure, deterministic
// value and Plan.Hash gives a cheap fingerprint that ranks compare at the
// first collective of a step.
//
// What this package leaves to others: the step graph and its passes
// (stepgraph), moving bytes (comm, nccl), and running a step (overlap). It
// performs no I/O, starts no goroutines and reads no clock; the cost model's
// constants are given, or measured by `gorun bench` and turned into a Model
// by Fit.
package buckets
