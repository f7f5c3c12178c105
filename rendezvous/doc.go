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
// central store.
//
// What it leaves to others: moving data (comm/ runs collectives over the
// groups given here, through the Group interface it defines); starting and
// killing processes (launcher/); the names of the environment variables
// (rankenv/). The only collective implemented here is a small message-based
// all-gather, enough for World.Barrier and World.Split before comm/ exists.
//
// Failure model: a member that crashes, hangs or becomes unreachable is
// declared dead by memberlist's failure detector; every World and Group that
// contains it fails with a *LostError naming its rank and host, the epoch
// increases and everything blocked here is released. A member that leaves
// gracefully (World.Close) is not a failure. Gossip is encrypted with a key
// derived from the job secret and labelled with the job id, so a process
// without the secret can neither join nor read member data.
package rendezvous
