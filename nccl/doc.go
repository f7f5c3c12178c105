// Package nccl owns collectives on GPUs: comm's Communicator contract
// implemented over NCCL, with device buffers, CUDA streams and events, NCCL
// groups, and the abort that keeps a lost peer from hanging a rank.
//
// What it leaves to others: who the ranks are and when one is lost belong to
// rendezvous (a Bootstrap is its World or Group); host-memory collectives,
// the contract's definition and its sentinels belong to comm; bucketing and
// scheduling to buckets and overlap (GroupBackend is overlap's grouped
// backend mode on GPUs); which GPU a rank gets to the launcher
// (CUDA_VISIBLE_DEVICES).
//
// # Libraries, loaded at run time
//
// Nothing here links against CUDA or NCCL: gorun builds with cgo off and
// runs on hosts without a GPU. Open loads the NVIDIA driver's libcuda.so.1
// and NCCL's libnccl.so.2 with purego (dlopen without cgo) when a GPU path is
// asked for, and fails with one line naming what is missing: the driver, a
// device, NCCL, or a recent enough NCCL (MinVersion, 2.14). Only the driver
// API is used; NCCL carries its own CUDA runtime, and the handles are the
// runtime's (CUstream is cudaStream_t, the primary context is the runtime's
// context). ncclCommInitRankConfig takes the 128-byte ncclUniqueId by value;
// purego lays it out as the C ABI does (see notes/nccl-binding.md).
// gorgonia.org/cu is not used.
//
// # Life of a rank
//
//	world, _ := rendezvous.Join(ctx, cfg)         // or a Group from Split
//	c, _ := nccl.New(ctx, world, nccl.DefaultConfig())
//	buf, _ := c.Device().Alloc(comm.BFloat16, n)  // a comm.Buffer, Host() false
//	h := c.AllReduce(ctx, buf, buf, comm.Sum)
//	err := h.Wait(ctx)
//
// Rank 0 of the group makes the unique id (ncclGetUniqueId starts NCCL's
// bootstrap listener in its process, which stays in New until every rank
// has connected); the others learn it through the rendezvous' all-gather,
// over gossip or a host leader's local socket. No extra store.
//
// # Ordering, streams and events
//
// Every call returns a Handle at once. Each communicator issues on its own
// non-blocking stream: before a call it records an event on the caller's
// compute stream (Config.ComputeStream, or WithStream per call) and makes
// its stream wait on it, so the call starts after the kernels that produced
// its input without blocking the CPU; after the call it records a done
// event. Calls therefore complete in issue order. Handle.Wait polls the done
// event (a short spin, then sleeps up to 50 µs); StreamWait makes a compute
// stream wait on it instead, which is the overlap executor's wait → compute
// edge on a GPU. A Group (or GroupBackend for overlap's bucket sets) issues
// several calls between ncclGroupStart and ncclGroupEnd; they share one done
// event.
//
// Comm is an overlap.DeviceComm: an overlap executor over it keeps fused
// bucket buffers in device memory (AllocDevice, freed by FreeDevice after
// the stream's queued work), packs and scatters with cuMemcpyDtoDAsync and
// cuMemsetD8Async queued on the communicator's stream behind the compute
// stream (CopyDevice, never inside an NCCL group), and turns each wait into
// the compute stream waiting for the scatter's done event (WaitOnDevice).
//
// # Failure
//
// A communicator fails as a whole, as comm's does: a member lost in the
// rendezvous (comm.ErrPeerLost, naming the rank and host), an asynchronous
// NCCL error (ncclCommGetAsyncError, polled every Config.PollInterval), a
// cancelled call context, an invalid call, or Abort fail the pending and
// every future call with one error, and a watcher goroutine aborts the NCCL
// communicator (ncclCommAbort), which ends the kernels stuck waiting for the
// peer. The communicator is non-blocking (ncclConfig_t.blocking = 0), so a
// peer lost while it is still connecting aborts that too. A rank that
// fails for a reason of its own (Abort, a cancelled call, an asynchronous
// error, a refused call) while staying alive tells its peers through the
// rendezvous' notices (Notifier, on the topic the unique id names): their
// pending and future calls fail within milliseconds, naming the rank, its
// host and its reason, instead of waiting for their own NCCL to notice.
//
// # Tests
//
// No NCCL loads on the machines CI runs on, so the tests build small C
// stand-ins for libnccl.so.2 and libcuda.so.1 (nccltest) with NCCL's and the
// driver's signatures over host memory, streams as threads, asynchronous
// errors and abort, and drive this package through them, in one process and
// across processes bootstrapped by the real rendezvous.
package nccl
