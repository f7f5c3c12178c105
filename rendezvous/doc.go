// Package rendezvous owns how the ranks of one job find each other: it forms
// the World (who is rank what, on which host, reachable at which data-plane
// address), splits it into process groups, and tells every member within
// seconds that another member is gone.
//
// Membership is gossip (hashicorp/memberlist, SWIM with Lifeguard). No rank is
// special once the world has formed: rank 0 binds the seed address every other
// rank joins through, and it pushes the complete member table to everyone once
// it sees all of them (gossip alone is a slow, unreliable way to decide that
// all N ranks are present; see notes/dependencies.md), but after that it is a
// member like the others and its death is detected like anyone's. There is no
// central store. Above 2·PushConcurrency gossip members the push is relayed:
// the seed pushes to the √H lowest-ranked members, each of which, once it
// has the complete table, pushes to its own block of about √H (pushPlan), so
// no process sends the whole table more than about √H times; a push that is
// lost is covered by each rank's own pulls (Config.RejoinInterval).
//
// Host leaders: when several ranks share a host (Config.LocalWorldSize > 1,
// from GORUN_LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE or SLURM's tasks per node),
// only local rank 0 of each host is a gossip member; the host's other ranks
// attach to it over a local stream (a Unix socket in Linux's abstract
// namespace whose name is derived from the job secret and the host, so
// nobody else can know it first; another user's process is refused by its
// SO_PEERCRED credentials; the stream is authenticated both ways with a key
// derived from the job secret), so gossip size is the host count. The
// leader announces its ranks in memberlist's push-pull state, relays the
// world table, the messages and the membership changes to them, and reports
// an attached rank whose stream closes (a crash closes it at once) to every
// other leader as that rank lost. A leader's death loses its whole host: the
// other hosts learn it by gossip, its ranks by their stream closing. Measured
// here (2 cores): flat gossip falsely declares starved members dead from
// about 64 rank processes; with host leaders 64 processes form every time.
// Config.Flat forces one gossip member per rank.
//
// What it leaves to others: moving data (comm/ runs collectives over the
// groups given here, through the Group interface it defines); starting and
// killing processes (launcher/); the names of the environment variables
// (rankenv/). The only collective implemented here is a small message-based
// all-gather, enough for World.Barrier and World.Split before comm/ exists.
//
// Failure model: a member that crashes, hangs or becomes unreachable is
// lost; every World and Group that contains it fails with a *LostError
// naming its rank and host, the epoch increases and everything blocked here
// is released. A member that leaves gracefully (World.Close) is not a
// failure. Proof that a process is gone (its attach stream closed, its
// gossip port refused a connection) is acted on at once; silence (a freeze,
// a dead host, a cut) only after the lease, so that a cut shorter than the
// lease heals and a cut of gossip's UDP alone is survived over TCP
// (doubt.go, Config's failure-detection fields). Gossip is encrypted with a key
// derived from the job secret and labelled with the job id, so a process
// without the secret can neither join nor read member data.
package rendezvous
