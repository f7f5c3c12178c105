// Package hostagent is the host agent: the process gorun starts on every
// host of a multi-host job (`gorun agent --connect ADDR --job ID`), by ssh,
// srun or a plain exec, and what it serves over its one connection to
// gorun. Programs that embed the launcher dispatch `gorun agent` to
// ParseArgs and Main.
//
// It is a relay around the same per-job supervisor a single-host job uses
// (package launcher/supervisor): it dials gorun, proves it holds the job
// secret (launcher/wire's handshake), reports the interface and ports
// peers reach this host through, receives the preloaded files
// (launcher/preload), then starts the supervisor with one pipe per rank
// stream and forwards output, events and commands over the connection.
// The supervisor keeps its guarantees — subreaper, process groups, no
// orphans — and ends everything when its command pipe closes, which is how
// the relay ends the job on its host: when the connection drops, when
// gorun is silent for the lease (a cut link delivers no FIN), or when the
// relay itself dies (the kernel closes the pipe). gorun, symmetrically,
// counts the host's ranks as failed when the connection drops or falls
// silent.
//
// What it owns, file by file:
//
//   - agent.go: the command line (Options, ParseArgs), the secret (stdin's
//     first line, or SecretEnv under srun), the connection to gorun with
//     its retries (connectAuth), and the order of a job: job description,
//     hello, preload, the spec, the relay.
//   - prepare.go: what this host checks before any rank starts and
//     reports in its hello: the interface (package netif), the rank count
//     against this host's limits (launcher/limits), the program
//     (launcher/program), two free ports (launcher/ports).
//   - children.go: the further agents a tree parent starts (ssh commands
//     gorun hands it, with launcher/sshkex's option), reported to gorun
//     until setup is over.
//   - relay.go: the relay proper; stdin.go: rank 0's stdin queue; the
//     ranks' flight records, kept in a launcher/flight directory and sent
//     to gorun as "flight" events.
//   - doctor.go: `gorun doctor`'s agent side: report, answer probes, probe
//     every other host over TCP and UDP.
//
// What it leaves to others: the plan, the failure rules and the verdict
// are gorun's (package launcher: its job loop sees this host through the
// connection); starting this agent (the starters), accepting it
// (agentauth.go) and everything gorun does with what it reports are
// launcher's too. This package imports no part of package launcher.
//
// # Ordering obligations
//
// The agent sends its hello only after placing the preloaded files it
// already has, and starts no rank before gorun sends the spec; until then
// it holds the reserved ports, released just before the supervisor
// starts. It sends "done" only after the last byte of its ranks' output
// and their flight records, so gorun has all of a host's output when it
// counts the host finished. Every goroutine it starts is waited for before
// Main returns; every process it starts (the supervisor, a tree parent's
// ssh commands) is reaped.
package hostagent
