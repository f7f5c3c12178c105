// Package wire owns the messages between gorun, its host agents and the
// per-job supervisors, and the framing of the connection that carries
// them to another host. Who sends which message when, and what a side does
// with one, is package launcher's (launcher/hoststartup.go, launcher/remote.go),
// the host agent's (launcher/hostagent) and the supervisor's
// (launcher/supervisor/supervisor.go): wire holds what
// crosses a process boundary, so that both ends of each link read one
// definition.
//
// # Two links
//
// gorun or a host agent talks to a supervisor over a pair of pipes, in
// newline-delimited JSON: one SupervisorSpec (the ranks to start), then
// Cmds; the supervisor answers with Events. Output never goes through the
// supervisor: each rank's stdout and stderr are pipes the client made.
//
// gorun talks to each host agent over one TCP connection. The agent dials
// gorun's listener (DialAuth; gorun's side is AcceptAuth) and both sides
// prove that they hold the job secret before anything else is exchanged:
//
//	agent → gorun   GORUN-AGENT/<proto> <job> <host> <nonceA>\n
//	gorun → agent   OK <nonceB> <mac("gorun/<proto>")>\n   (or NO <reason>\n)
//	agent → gorun   <mac("agent/<proto>")>\n
//
// where mac(role) is HMAC-SHA256 keyed with the secret over role, job, host
// and both nonces, each NUL-terminated (internal/handshake), so neither side
// can be replayed or impersonated without the secret; <proto> is the
// Protocol the agent claims. The secret itself never crosses the
// connection. gorun acts on the claim only after the agent's MAC checked
// out: a stranger's greeting that claims another protocol is a
// *HandshakeError like any other stranger's, and an authenticated agent of
// another protocol a *ProtocolError naming its host.
//
// The handshake is frozen across protocol versions: every gorun, whatever
// its Protocol, opens with the same three lines, so an agent of another
// version can still prove it holds the secret and only then be told (and
// reported) that it speaks another protocol. The protocol each side claims
// is bound into both MACs, so it cannot be altered in flight.
//
// Then frames flow both ways (Conn): a type byte, a 4-byte big-endian
// length and a payload. Messages are JSON (FrameMsg, one Msg each), rank
// output is raw bytes (FrameOutput), preloaded files are FrameData, rank
// 0's stdin FrameStdin, and pings (FramePing) keep the lease alive on both
// sides: a side that hears nothing for the lease period treats the other as
// gone. The payload is not encrypted; the job secret protects the job from
// strangers, not the output from someone who can read the network.
//
// A change to a message that an older peer would misread is a new
// Protocol; the handshake's bytes are pinned by tests.
package wire
