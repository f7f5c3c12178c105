// Package supervisor owns the per-job supervisor: the process that is the
// parent of one host's ranks, and its client. gorun (package launcher's
// RunLocal) starts one on the launching machine, a host agent one on every
// other host of a multi-host job; the supervisor starts every rank, each
// in its own process group, reports what happens to them as events,
// applies the commands it is sent (signals, injected faults, PMI answers,
// respawns), and makes sure that no process of the job outlives it or its
// client, however either of them died. supervisor.go explains why this is
// a separate process, a child subreaper, and not the launcher itself.
//
// What the job is, where its ranks run and what a failure means belong to
// package launcher (the plan, the job loop, the host agents); the messages
// exchanged belong to launcher/wire. This package knows one host and one
// job: the spec it was sent.
//
// # Pieces
//
//   - The process (supervisor.go): Is and Main are how an executable that
//     embeds the launcher becomes a supervisor (cmd/gorun and test
//     binaries call them first thing in main); runSupervisor reads the
//     spec, starts the ranks (startAll) and runs its loop until no rank
//     and no descendant is left. It beats every 200 ms so that its client
//     can tell it from a stopped or hung one.
//   - The client (client.go): Start starts a supervisor with the
//     descriptors Pipes built (one pipe per rank output stream, a stdin),
//     Client sends it the spec and commands, reads its events, leases it
//     (WatchLease: a silent supervisor the kernel shows stopped, or one
//     silent for StarvedLimitX leases, is SIGKILLed), and after it exited
//     ends and removes its job cgroup (ReleaseCgroup). AdoptOrphans and
//     KillLeftovers (proc_linux.go) let the client find what a killed
//     supervisor's ranks left behind.
//   - Containment: the /proc walks (proc_linux.go), the job cgroup
//     (cgroup_linux.go, CgroupSupport) and the job reaper that ends it
//     when the supervisor and its client die together (reaper_linux.go;
//     started as this executable too, and dispatched by Main).
//   - What a rank gets at start, read from its environment: CPU binding,
//     its own session on a crowded host and GOMAXPROCS (bind.go:
//     ParseBind, ParseSession, CPUShares), the shared hardware topology
//     (topology.go, ParseTopology), its GPU (devices.go), and MPI's PMI
//     (pmi.go: PMI, the server for the ranks of this host; package
//     launcher's pmi.go tells how a barrier spans hosts).
//   - Faults acted out here: a signal to a rank's process group, the
//     SIGCONT that ends a timed stop, a slow (slow.go); a rank the kernel
//     shows stopped for too long is reported frozen (freeze.go).
//   - Fault-tolerant jobs (ft.go): the supervisor keeps what a rank's next
//     incarnation needs and starts it in place when told to; for Python
//     ranks that ask (forkserver.go), by a fork from a per-host process
//     that has imported torch already, still reaped by the supervisor.
//
// # Ordering obligations
//
// The supervisor starts every rank before it reads any command, so a
// command that addresses "all ranks" reaches each of them. It sends
// "done" only once no rank and no descendant is left, and exits after
// that. A client closes its copies of the supervisor's descriptors once
// Start returned (Pipes.CloseChildEnds), so that EOF on a rank's stream
// means that rank and its descendants are gone; it calls ReleaseCgroup
// only after Wait.
package supervisor
