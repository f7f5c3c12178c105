// Package connlimit bounds the connections a listener holds before they
// authenticate.
//
// Every port and socket gorun opens (the data plane in comm, the host-agent
// port in launcher, the host leader's attach socket in rendezvous) accepts
// connections from anyone who can reach it and only then asks for proof of
// the job secret. Without a bound, an outsider who opens thousands of
// connections and says nothing makes the listener hold a file descriptor, a
// goroutine and a read buffer for each until its handshake deadline, and can
// exhaust a rank's descriptors or memory. A Gate caps that:
//
//   - at most Config.Max connections are in their handshake at once; beyond
//     that the Gate stops calling Accept, so further connections wait in the
//     kernel's listen backlog and cost the process nothing;
//   - at most Config.PerSource of them come from one source (an IP address,
//     or a user id on a Unix socket); more from that source are closed at
//     once, so one source cannot take every slot from the others;
//   - with Config.Evict, a full gate closes its oldest pending connection
//     instead (a silent one before one whose peer has spoken, Spoke), so
//     connections held open by an outsider give way to a newcomer (every
//     TCP port gorun opens: a job's processes share their host's address
//     with anyone on that host); an owner claims a connection (Claim)
//     once it has proved itself and before telling its peer so, after
//     which the gate never closes it;
//   - Close closes every connection still in its handshake, so a listener
//     that shuts down never waits for a stranger's deadline.
//
// What the Gate leaves to its users: the deadlines themselves (the greeting
// and the handshake are protocol-specific) and the authentication.
package connlimit
