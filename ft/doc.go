// Package ft owns fault-tolerant data parallelism across replicas: the
// per-step quorum (who participates, at which step), the commit decision
// (a step counts only if every participant finished it), and the heal (a
// replica that is behind copies the live replicas' state over the data
// plane, sharded across them, with no checkpoint file).
//
// What it leaves to others: starting, watching and replacing processes
// belongs to the launcher (gorun --fault-tolerant), which also hosts this
// package's quorum service (Server); moving tensors belongs to comm, whose
// Communicator the Manager builds over each quorum's participants; what the
// state is (parameters, optimizer moments, step counters) belongs to the
// trainer, which hands it over as opaque bytes (State).
//
// # Words
//
// A replica is one member of the data-parallel job: in plain data
// parallelism one rank (R replicas = the world size), its id the rank. An
// incarnation is one process of a replica: gorun starts incarnation 0, and
// a replacement for a dead one is incarnation 1, 2, ... with the same
// replica id. The quorum service (the "lighthouse" of torchft) is Server,
// run by the launcher; every replica's Manager holds one authenticated
// connection to it.
//
// # The step, as a replica sees it
//
//	m, err := ft.Join(ctx, ft.DefaultConfig()) // from gorun's environment
//	m.SetState(state)                         // what a heal copies
//	for m.Step() < steps {
//		q, err := m.Quorum(ctx)   // blocks until every live replica asked;
//		                          // heals this replica first if it is behind
//		if err != nil { ... }     // only ctx's end, Close, or a lost service
//		grads := compute(batch(m.Step(), m.Replica()))
//		err = m.AllReduce(ctx, grads, comm.Avg) // over q's participants
//		if err != nil { m.ReportError(err) }   // a participant died
//		if ok, err := m.ShouldCommit(ctx); ok {
//			apply(grads) // m.Step() advanced by one
//		}                // else: discard; the next Quorum recovers in place
//	}
//	m.Close()
//
// Quorum: the service answers once every live replica has asked (a replica
// known dead is not waited for; a replacement that connected is). The
// first quorum waits for every replica of the job to connect (or be
// reported dead; ServerConfig.StartTimeout), so it holds the whole job.
// A replica behind the job's last committed step when every replica that
// held that step has left (finished) cannot heal: Quorum returns
// ErrFinished. The
// answer lists the participants (replica ids, data-plane addresses, and the
// step each holds). The highest step among them is the quorum's step; a
// participant below it (a replacement, incarnation > 0, at step 0) heals
// before Quorum returns: each participant at the quorum's step (a source)
// serializes its State once and sends its 1/k slice (k sources) to each
// healing replica, with the total length and a SHA-256 digest of the whole;
// the healer checks every source announced the same length and digest,
// assembles the slices, checks the digest, and calls State.Load. Its state
// is then bitwise the sources' state. A source that dies during the heal
// fails the quorum for everyone; Quorum asks again (same step) and the heal
// is retried with the remaining sources. Quorum retries on its own until it
// holds a usable quorum, so a trainer calls it once per step.
//
// The communicator: when the participants change (or the last quorum
// failed), Quorum builds a new comm.Communicator over them (tag
// "ft/<quorum id>"; group rank = position in Participants, ordered by
// replica id). Its group fails (Failed()
// closes) the moment the service tells of a participant's death (the
// launcher sees it through the process's exit; the service also through
// the replica's connection closing), so a survivor blocked in a collective
// returns within milliseconds, not at a timeout.
//
// Commit: ShouldCommit sends this replica's vote (true unless ReportError
// was called or a collective of this step failed) and returns the service's
// decision for the quorum: true only if every participant voted true before
// any of them died or gave up. Every participant gets the same answer. On
// true the Manager's step advances; on false the caller discards the
// step's update and calls Quorum again: the process stays alive and
// recovers in place (torchft's should_commit).
//
// # Replica groups (HSDP)
//
// With GroupSizeEnv = S > 1 (gorun --fault-tolerant-group S) a replica is a
// group of S consecutive ranks, HSDP's shard group: parameters sharded
// within it, replicated across groups. A group takes part in a quorum
// only when all its ranks are live; the loss of one rank is the loss of
// its group (gorun kills the others and starts all S again). Each rank's
// Quorum lists as Participants the ranks at its place (rank mod S) in
// every participating group, so Comm, AllReduce and the heal work per
// shard exactly as without groups, and Quorum.Group lists its own group,
// over which GroupComm is built (the parameter all-gather and gradient
// reduce-scatter).
//
// # Identity, secret and endpoint
//
// Under gorun --fault-tolerant a replica reads GORUN_RANK (its replica id),
// GORUN_WORLD_SIZE (the number of replicas), GORUN_JOB_ID, GORUN_SECRET and
// GORUN_HOST as every rank does, and AddrEnv (the service) and
// IncarnationEnv. It does not join the gossip world (rank.Init):
// a replacement process cannot join a world that already formed, and the
// service already knows every member. Its data-plane endpoint is a
// comm.Endpoint keyed with the job's data-plane key (rank.DataPlanePurpose,
// derived from the job secret exactly as rank.Init derives it), so
// replicas and replacements authenticate each other as any two ranks of
// the job do. The service's connections are authenticated with a key of
// their own purpose (KeyPurpose), by a challenge and response in both
// directions (the same construction as gorun's host-agent handshake): a
// process without the job secret cannot join a quorum or vote.
//
// # What the service records
//
// Server.Record lists every quorum (id, step, participants, who healed),
// every loss (replica, incarnation, why, when, the step it was lost in),
// every step that was not committed and why, every heal (bytes, from
// which sources, how long), what each source served, and every
// incarnation told ErrFinished. Two facts serve the launcher's decision
// whether a failure is worth a replacement: HeldState (did that
// incarnation ever take part in a committed step or finish a heal) and
// StateLive (does a live replica hold the last committed step, or did its
// holders finish).
//
// # Where it differs from torchft
//
// torchft runs a lighthouse server and learns of deaths by heartbeat
// timeouts; here gorun is the service and reaps every replica itself. The
// first quorum waits for the whole job, later ones for every live replica
// (no min_replica_size and join timeout to tune). The heal is sharded
// across every live replica rather than served by one. The launcher copies it into gorun's --report.
package ft
