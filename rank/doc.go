// Package rank owns the start-up and shut-down of one rank of a job: the
// code every rank program (gorun bench, the example trainer, the step
// benchmark, the language bindings) would otherwise write for itself.
//
//	r, err := rank.Init(ctx, rank.DefaultOptions())
//	if err != nil { ... }
//	defer r.Close()
//	c := r.Comm() // the world communicator
//
// Init does, in this order:
//
//  1. Read who this rank is from the environment. The first complete set of
//     variables wins: gorun's GORUN_RANK/GORUN_WORLD_SIZE (with GORUN_SECRET,
//     GORUN_RDZV_ENDPOINT, ...), torch's RANK/WORLD_SIZE/MASTER_ADDR/
//     MASTER_PORT, SLURM's SLURM_PROCID/SLURM_NTASKS (rendezvous.ConfigFromEnv
//     documents every variable). With none, the rank runs alone as a world
//     of one (unless Options.RequireLauncher); with half a pair (RANK but no
//     WORLD_SIZE) Init fails, naming the missing variable.
//  2. Derive the data-plane key from the job secret
//     (rendezvous.Config.DeriveKey with DataPlanePurpose): every rank of the
//     job gets the same key with no message, and the gossip key stays
//     independent of it.
//  3. Listen on the data plane (comm.Listen), on one address policy: the
//     address the user gave (Options.ListenAddr, GORUN_DATA_ADDR), else the
//     interface the user named (Options.Iface, through netif.Override), else
//     loopback when alone or when the rendezvous seed is loopback, else the
//     source address of the route to the seed (netif.Toward) — the address
//     the rendezvous advertises for gossip as well.
//  4. Join the rendezvous (rendezvous.Join), advertising the data-plane
//     address; alone, a comm.StaticGroup of one takes the World's place.
//  5. Connect the world communicator (comm.New over the world).
//
// Afterwards the rank makes subgroups (Group, Split) and communicators over
// them (NewComm), all sharing the one endpoint. Close undoes everything in
// reverse order: the communicators from NewComm (newest first), the world
// communicator, the World (a graceful leave), the endpoint. Close is
// idempotent. After an error, call Abort first so that the peers stop at
// once instead of at their timeouts, and Close does not wait for calls that
// will never complete.
//
// What it leaves to others: the identity rules and gossip belong to
// rendezvous, the choice of interface to netif, the collectives to comm.
// Package rank decides only the order and the address policy.
package rank
