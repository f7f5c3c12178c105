// Package comm owns the collective engine on CPUs: the Communicator that moves
// tensors between the ranks of one process group, the algorithms that do it
// (ring, recursive doubling, direct exchange, a fixed deterministic tree) and
// the transports underneath (TCP between hosts, shared memory inside a host).
//
// What it leaves to others: membership, failure detection by gossip and the
// group's epoch belong to rendezvous, which hands comm a Group (the interface is
// defined here, by its consumer); GPU collectives belong to nccl, which
// implements the same Communicator contract; bucketing and scheduling belong to
// buckets and overlap.
//
// # Life of a rank
//
// Programs start with package rank, which does the following in one call
// (and derives the endpoint's key from the job secret); by hand:
//
//	ep, _ := comm.Listen(comm.EndpointConfig{Addr: ":0", Secret: secret})
//	// advertise ep.Addr() through the rendezvous, which returns a Group
//	c, _ := comm.New(ctx, group, ep, comm.DefaultConfig())
//	h := c.AllReduce(ctx, comm.Float32s(grad), comm.Float32s(grad), comm.Sum)
//	err := h.Wait(ctx)
//
// Several communicators share one Endpoint; each has its own connections,
// tagged with a group id derived from the member list, so groups progress
// independently.
//
// # Ordering
//
// Every call returns a Handle at once. Calls on one Communicator run one at a
// time in the order they were issued (small all-reduces queued together may
// run as one; see Fusion), so they complete in issue order on every rank;
// the overlap runtime relies on this. A call runs on the communicator's
// worker goroutine, so it progresses while its issuer computes, or, when no
// call is running, on the goroutine that waits for it (saving two goroutine
// hand-offs on the latency path). Every rank of a group must issue the
// same collectives in the same order (as in MPI and NCCL). A rank that issues a
// different call at the same position gets a *DesyncError naming both calls, and
// the peers it talks to get that error too (as an abort naming both calls); no
// mismatched frame is ever read into a buffer. A rank whose own part of the
// call completed before a peer noticed (its result is then correct) gets the
// error at its next call.
//
// # Fusion
//
// Small all-reduces queued on a communicator behind one another travel as
// one message (fuse.go): an async loop of small all-reduces, or the calls
// of a coalesced call issued back to back, cost one exchange of their
// total size instead of one each. AllReduceCoalesced is such a call in
// one: its vectors are the units of the message, with one Handle and one
// flight record for the lot. The rule:
//
//   - When the goroutine running calls takes a fusable all-reduce (valid,
//     each vector at most Config.FuseBytes and taking the latency path,
//     recursive doubling, on its own), it also takes the calls queued
//     right behind it while they are all-reduces of the same dtype and
//     op, fusable, within FuseBytes together (and 128 vectors), and read
//     no buffer an earlier one of them writes. That is its offer. It
//     never waits for a call: a call alone is offered alone and starts at
//     once, and its frames are exactly the unfused ones.
//   - Any other call ends the offer and runs next, after it: nothing is
//     reordered, and kinds, dtypes and ops never share a message.
//   - The ranks' offers may differ, since what is queued when depends on
//     timing. Every message of the recursive doubling carries how many
//     vectors it holds (in the header's Root, and their counts, each
//     marked where a call begins, before the data); a rank that receives
//     m' vectors while holding m goes on with min(m, m'). After the last
//     exchange every rank holds the same number of vectors, the least
//     offer, reduced over all ranks (the proof is on fusedRD); what it
//     offered beyond that runs next, as the lead of a new offer (a
//     coalesced call cut short goes on with its remaining vectors). No
//     rank ever waits for a call another has not issued.
//
// Proof obligations, and the tests that hold the code to them
// (fuse_test.go): every rank runs the same calls in each fused message
// whatever the interleaving, and gets bitwise what it gets unfused (every
// element is combined in the same order; TestFusionMatchesUnfusedBitwise,
// ranks issuing with random timing, at 2 to 6 ranks, over memory, shared
// memory and TCP); a lone call is never held
// (TestFusionNeverHoldsALoneCall, which would deadlock otherwise, and runs
// a rank with fusion off beside ranks with it on); kinds, dtypes and ops
// never mix and order is kept (TestFusionNeverMixes, and the flight
// records of every test); a rank whose call differs inside a fused message
// still gets a *DesyncError naming both calls, from the header (kind,
// dtype, op, the first call's count) or the count list (any later call's
// count, or where a call begins), before any data of the message reaches a
// receive buffer (TestFusionDesync, TestAllReduceCoalescedDesync).
// Each call keeps its own sequence number, flight record (FlightRecord.Fused
// says how many ran together) and Handle, so the side-channel desync check
// sees the same calls fused or not.
//
// Not fused: calls the cost model sends over the ring (on 3 ranks off a
// crowded host that is every all-reduce above a few bytes, since recursive
// doubling needs two extra messages there), all-reduces in deterministic
// mode on more than two ranks, and other kinds. Measurements:
// notes/fusion.md.
//
// # Desync, stalls and the flight recorder
//
// Some pairs of algorithms never send a frame of the wrong call to a rank
// that would read it (a binomial broadcast against recursive doubling), so
// frames alone cannot end every desync. Once a call has waited
// Config.DesyncCheckAfter (1 s), a watchdog compares every rank's recent
// calls, fetched over the transport's side channel (StatusTransport: a
// separate authenticated connection to the peer's Endpoint, answered even
// while that peer is stuck in a call) through group rank 0, which gathers
// them once for every asker of a round (about 3n connections a round, not
// n²). Collectives that differ at one sequence number, and Sends and
// Recvs that do not pair off in order between two ranks (another kind,
// size or position, or a peer that went on to a collective without its
// partner call), fail the group with a *DesyncError naming both calls and
// the ranks on each side, on every rank; ranks that have not reached the call are
// logged as stragglers ("rank 3 is idle since AllReduce(...) #40 (has not
// issued #41) (2.1 s); ranks 0-2,4-7 wait in AllReduce(...) #41"), at once and
// then at doubling intervals, and Config.StallTimeout turns that into a
// *StallError. Nothing is sent while no call waits that long.
//
// Each communicator keeps its last Config.FlightRecords calls (kind, dtype,
// count, root, sequence number, issue/start/end times, state): always on,
// for two clock reads and two atomic stores per call (flight.go). They are written to the log and, as JSON, to
// Config.FlightDir ($GORUN_FLIGHT_DIR under gorun) when the communicator
// fails, and on DumpFlightRecords, which SIGUSR2 triggers under gorun.
// FlightTable merges the ranks' dumps into one table marking the first
// sequence number where the ranks disagree; gorun prints it.
//
// # Failure
//
// A communicator fails as a whole: a lost peer (Group.Failed, a reset or closed
// connection), a desync, a cancelled call context, an invalid call or Abort
// fail the running call and every queued and future call with the same error,
// and the failure is passed to the peers (an abort frame, then closed
// connections) so that no rank waits for a message that will never come. There
// is no way to un-issue a collective, which is why a cancelled context or an
// invalid argument poisons the communicator instead of skipping one call.
//
// # Transports
//
// Endpoint (Listen) is the production Transport: one TCP listener per rank,
// one connection per pair of ranks per group (the lower rank dials), each
// proven in both directions with an HMAC-SHA256 challenge over the job
// secret; a connection that fails the handshake is logged and dropped.
// EndpointConfig.TCPStreams > 1 gives a TCP link several such connections,
// each authenticated alike, with large frames striped across them.
// Between ranks whose Group.Host is the same, the dialer offers a
// shared-memory segment (two single-producer rings in /dev/shm, unlinked as
// soon as both sides mapped it) and the data moves there, the TCP connection
// staying open only to notice a dead peer. A small message (a whole one of at
// most 4 KiB plus 24 bytes) skips the ring: it goes into one of 16 fast slots
// per direction, header, payload and flag in the same cache lines, written
// and polled by the goroutine running the call, which is the latency path of
// every collective and of Send/Recv. EndpointConfig.ForceTCP turns shared
// memory off. commtest provides an in-memory Transport for tests.
//
// # Algorithms
//
// All-reduce picks recursive doubling (latency) or ring reduce-scatter +
// all-gather (bandwidth) with the alpha-beta cost model documented on
// Config.LatencyNs; with two ranks over shared memory the bandwidth case is
// a pair exchange that sends each reduced segment back as soon as it is
// made, all on one goroutine. Reduce-scatter and all-gather run on the
// ring; broadcast is a binomial tree, or scatter + ring all-gather when
// large; reduce is a reduce-scatter plus a gather at the root when large;
// all-to-all exchanges pairwise in n-1 staggered steps. Large messages
// travel in segments of Config.SegmentBytes so receiving, reducing and
// sending overlap. Out-of-place all-reduce and reduce read the send buffer
// where they first combine it, without copying it into the receive buffer
// first (reduce-scatter still copies; see reduceScatter).
// Counts need not divide by the group size, nor the group size be a power
// of two.
//
// # Numerics
//
// Reductions of bfloat16 and float16 run in float32 from end to end (inputs are
// widened, partial results travel as float32, the final result is rounded once).
// Avg is Sum followed by a division by the group size (truncating for integers).
// Results are bitwise identical on every rank. With Config.Deterministic every
// element is reduced along one fixed tree over the ranks, pairwise in rank
// order: at each level neighbours (0,1), (2,3), ... are combined with the lower
// rank on the left, and an odd one out moves up unchanged. For 4 ranks that is
// ((r0 op r1) op (r2 op r3)); for 3 it is ((r0 op r1) op r2). The tree does not
// depend on message size, chunking, algorithm or on which other tensors share a
// bucket.
package comm
