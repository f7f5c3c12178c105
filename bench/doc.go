// Package bench owns gorun's collective microbenchmark: the sweep of message
// sizes that `gorun bench OP` runs on every rank, the correctness check of
// every result, and the result formats around it — the nccl-tests text table
// (written and parsed back), JSON, parsers for the text that nccl-tests and
// the OSU micro-benchmarks print, a side-by-side table with ratios, and a PNG
// plot of bus bandwidth and latency against size.
//
// What it leaves to others: starting ranks (launcher), finding peers
// (rendezvous), moving bytes (comm). A rank of
//
//	gorun -np N gorun bench allreduce -b 8 -e 64M -f 4
//
// starts with rank.Init (identity from the environment, a comm Endpoint, the
// rendezvous, a comm.Comm over the whole world) and calls Run. Run only needs a
// comm.Communicator, so tests drive it over commtest's in-memory network.
//
// # Measurement
//
// For every size and placement (out-of-place, then in-place) each rank runs
// Warmup untimed calls, a barrier, then Iters calls issued back to back and
// waits for the last one (calls on one communicator complete in issue order,
// so this times Iters complete collectives, as nccl-tests times a stream of
// launches). With Blocking (-z 1, nccl-tests' --blocking) each call is
// waited for before the next is issued, and run by the waiting goroutine
// (comm.IssuerWaits), as a blocking call from C or Python runs. The reported time is the maximum over ranks of the mean per
// iteration, reduced with a collective, so one slow rank shows. Bandwidths
// follow nccl-tests: algbw = bytes/time with the bytes nccl-tests counts for
// the operation, busbw = algbw · factor (BusFactor), in GB/s of 1e9 bytes.
//
// # Correctness
//
// With Check on, after the timed calls every rank fills its input with
// values that depend on a seed, its rank and the element index, runs the
// collective once more and compares every output element with the exact
// expected value, computed locally from the same generator. The values are
// small integers (and, for products, one factor of 2 or 3 among ones), so
// every partial result is exact in every type and the expected value does
// not depend on the order of the reduction. Wrong elements are summed over
// ranks; any makes Run return a *WrongError.
package bench
