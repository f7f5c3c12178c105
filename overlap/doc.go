// Package overlap owns running a step: it takes a bucket plan (buckets.Plan,
// from stepgraph.Plan or buckets.Assign) and, every step, packs tensors into
// the plan's fused buffers, starts each bucket's collective on its group's
// communicator as early as the plan allows, waits for it as late as the
// program allows, scatters the results back, and records what happened: a
// Chrome/Perfetto timeline and per-step metrics (step time, communication
// time, exposed communication time).
//
// # Two ways in
//
// Eager programs (no graph) drive an Executor directly, the way PyTorch DDP's
// reducer is driven by autograd hooks:
//
//	ex.Begin(step)
//	ex.Compute("backward layers.3", "layers.3", func() error { ... })
//	ex.Ready(ctx, "layers.3.grad", in, out) // copied into its bucket; the bucket
//	                                        // starts when its last member is in
//	...
//	ex.Wait(ctx, "layers.3.grad")          // results scattered before it returns
//	m, err := ex.Finish(ctx)
//
// Programs with a step graph call RunGraph, which walks the graph's nodes in
// plan order over the same Executor: a start is issued as soon as the compute
// writing its last input has run (not only when the plan reaches it), and a
// wait is taken right before the first compute that reads one of its outputs.
//
// # Ordering obligations (what every rank relies on)
//
// On each group, bucket k is started before bucket k+1, on every rank, in
// every mode: a bucket whose members are all ready waits for its
// predecessors. That bookkeeping is buckets.Filler's (shared with any other
// executor); so is the plan's Flush mark, which lets a bucket whose member
// was not produced start zero-filled at the end of its region instead of
// failing with an *IncompleteError that names the tensor. Collectives on one group complete in issue order (comm's
// contract), so waiting for bucket k completes every earlier bucket of that
// group; the executor still scatters each bucket only at its own wait or at
// Finish. At the first collective of a step on each group, every rank
// contributes a hash of the plan and the step number (an 8-byte all-gather
// issued just before the first bucket); the first wait on that group checks
// it, so ranks with different plans fail with a *PlanMismatchError naming the
// ranks and hashes instead of exchanging mismatched buffers silently.
//
// # Backends
//
// Native issues each bucket the moment it may start. Grouped hands the
// buckets that became startable between two compute calls or waits of the
// program (a bucket set; the same on every rank, since every rank runs the
// same program) to a GroupBackend as one grouped call, which is how NCCL's
// group semantics want them. Where starts are issued exactly where the plan
// places them, these sets are the runs buckets.Bucket.Set numbers;
// GraphRunner issues a start as soon as its inputs exist, which may merge
// runs the schedule kept apart. Both modes share the plan and issue the same
// collectives in the same order. Serial waits for every bucket as soon as it is issued: the
// no-overlap baseline, with the same buffers and bits.
//
// # Fused-buffer layout
//
// all_reduce and broadcast run in place on a buffer of the bucket's Bytes,
// members at their plan offsets. all_gather sends the members' shards packed
// at their offsets and receives Size blocks of that layout; member m's output
// is the concatenation of its slice of every block. reduce_scatter packs
// rank-major: block p holds every member's p-th 1/Size slice, so each rank's
// result is every member's own shard, contiguous — the layout FSDP's flat
// parameters use; it needs each member's bytes to divide by Size elements.
// all_to_all packs rank-major like reduce_scatter (block p, for rank p,
// holds every member's p-th slice) and unpacks block p, which came from
// rank p, into each member's p-th output slice; it needs a communicator
// that implements AllToAller.
//
// Copies: a bucket of one member runs on the member's own buffers (the
// fused layout is the member's layout), and a program that computes a
// tensor into its slot (Executor.View, DDP's gradient_as_bucket_view) has
// nothing packed or scattered; otherwise each member is copied in at Ready
// and out before its wait returns. A GraphRunner asks the program for each
// member's buffers by name every step (Tensors), unless the program bound
// them once (GraphRunner.Bind: buffers that persist, such as those slots).
//
// Memory: a bucket's fused buffers are taken when its first member is
// packed and handed back at its wait, for the next bucket to reuse, so an
// executor holds the most that was ever in flight at once
// (StepMetrics.FusedPeakBytes), not a buffer per bucket. GraphRunner
// further bounds how early collectives go out (Config.PrefetchStarts,
// Config.MaxInFlightBytes) and measures the collective outputs held
// (StepMetrics.PeakBytes).
//
// Device groups: when a group's communicator is a DeviceComm (nccl.Comm),
// its tensors are device buffers and so are its fused buffers, taken from a
// per-group pool and freed at Close. Packs and scatters are copies queued
// on the communicator's stream (the layouts above, applied by the same
// code as on the host), ordered after the kernels queued on the compute
// stream; a Wait queues the scatter and makes the compute stream wait for
// it on the device, so the CPU does not block (Serial still does, as its
// baseline). The plan check reads its result only once it has arrived:
// at the first wait that finds it complete, else at Finish. Builtins
// (split, concat, sum) run on host tensors only.
//
// What it leaves to others: what is bucketed (buckets, stepgraph), moving
// bytes (comm, nccl), the model's compute (the caller's callbacks). The
// Executor is not safe for concurrent use: one goroutine drives a step, as
// one compute stream does. It owns one goroutine per group that records when
// collectives complete; Close stops them.
package overlap
