// Package model owns the example trainer's neural network: a small decoder-only
// transformer (token and position embedding, L pre-LayerNorm blocks of causal
// multi-head self-attention and an MLP, a final LayerNorm and an output head,
// cross-entropy loss) with an exact, hand-written backward pass, in pure Go,
// float32, on the CPU. It also owns the synthetic dataset the trainer learns
// and the elementwise optimizers that update its parameters.
//
// The package is shaped for distributed training by the step runtime:
//
//   - Parameters live in regions: "embed", "layers.0" … "layers.L-1", "head".
//     Each region is one flat []float32 buffer with named tensors at fixed
//     offsets ("layers.3.attn.qkv.weight"), so a region is exactly one bucket of
//     a gradient all-reduce, a parameter all-gather or a gradient
//     reduce-scatter, and it splits into N equal, zero-padded shards
//     ([Region.ShardSize]).
//   - Forward and backward run one region at a time ([Workspace.Forward],
//     [Workspace.Backward]); backward of a region returns that region's
//     gradient as soon as it is complete, so the caller can start its
//     collective while the next region computes. Parameters are passed in on
//     every call, so a caller may hand in a freshly all-gathered buffer and free
//     it afterwards (reshard after forward).
//   - Gradients and losses are summed over the batch by a fixed pairwise tree
//     over sample index (sample i pairs with i^1, then pairs of pairs …). A rank
//     that holds a contiguous, aligned, power-of-two slice of the global batch
//     computes the lower levels of that tree ([Workspace.Backward] returns the
//     sum at the slice's subtree root); the upper levels are the cross-rank
//     levels, which a deterministic collective reducing pairwise in rank order
//     computes as the same tree ([TreeSum] is that reduction in-process). The
//     mean (divide by the global batch size, [Mean]) comes after the whole tree.
//     The result is bitwise identical on 1, 2, 4 … ranks. With comm, use
//     Config.Deterministic and Op Sum (Avg would divide by the rank count,
//     not the batch size).
//   - Chunking along the batch keeps the bits: a region run forward over two
//     halves of the samples equals one run over all of them, and the halves'
//     gradient partial sums combine with [TreeSum]. If each chunk's gradient
//     is instead reduced across ranks on its own, assign samples chunk-major
//     ([SampleRange]) so that each chunk is still a node of the same tree.
//   - Optimizers ([Optimizer]) are elementwise on flat buffers: a full region
//     and its shards are updated bitwise identically.
//
// Package modeltest simulates N ranks in one process with exactly these
// rules; a real distributed run must match its losses and parameters bit for
// bit ([Fingerprint] makes that a one-number comparison).
//
// What it leaves to others: moving buffers between ranks (comm), deciding which
// regions share a bucket and when collectives start and are waited for
// (stepgraph, buckets, overlap), and the training loop, flags and output
// (examples/trainer). The package does no I/O; it starts goroutines only
// inside Forward and Backward when asked to (Workspace.SetWorkers) and waits
// for them before returning. One Workspace is not safe for concurrent use;
// distinct Workspaces are independent.
//
// Floating-point determinism: every reduction here has a fixed order that does
// not depend on how the batch is split, and products are rounded explicitly
// before they are summed (Go may otherwise fuse a*b+c into one FMA on some
// platforms; a test compiles for amd64 v3 and fails on any fused
// instruction), so the same binary gives the same bits on every run and every
// rank count, and amd64 builds with and without FMA agree. Across
// architectures the math library's Exp and Tanh (assembly on amd64, Go
// elsewhere) may differ in the last bit, so a job mixing architectures is not
// bitwise reproducible.
package model
