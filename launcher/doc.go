// Package launcher owns starting an SPMD job: it plans which rank runs on
// which host (a pure function of hosts, slots and flags), then starts, watches
// and tears down the rank processes, so that the first failure ends the job,
// no process outlives it, and the user learns which rank failed, where, and
// why.
//
// Parsing command-line flags and mapping errors to exit codes belong to
// cmd/gorun; forming process groups between the ranks belongs to rendezvous.
//
// # Pieces
//
//   - Planning (plan.go, pure): NewPlan maps PlanConfig — hosts, -np, GPUs,
//     exports, job id, secret, ports — to a Plan with one RankSpec per rank
//     and its full environment (rankenv names). Host lists come from
//     hostfile.go; ResolveExports turns -x values into NAME=VALUE.
//   - Edges (local.go, ports.go, gpus.go): which names are this machine,
//     job identity, two kernel-chosen free ports held until the ranks start,
//     GPU count from nvidia-smi.
//   - Running (run.go, output.go): Launch = checks + plan + Run. Run starts
//     one agent process per job, streams every rank's stdout and stderr
//     line-whole to the terminal (and per-rank files), and applies the
//     failure rules: the first failure stops the others (SIGTERM to each
//     rank's process group, SIGKILL after Config.Grace), signals are
//     forwarded, --timeout ends the job.
//   - Multi-host (remote.go, hostagent.go, wire.go): gorun listens on the
//     interface that routes to the hosts (netif), starts one host agent per
//     host (`gorun agent`, over ssh, srun or a plain exec), waits for all of
//     them to authenticate with the job secret and report their interface
//     and ports, then plans and sends each its ranks. A host agent wraps the
//     same supervisor as a local job and relays output, events and commands
//     over its one connection; a lease on both ends turns a dropped or
//     silent connection into "ranks killed" on the host and "host lost" in
//     gorun. Above Config.FanoutThreshold hosts, agents start further
//     agents (a two-level tree). Inside a SLURM allocation one srun starts
//     every agent (Config.Starter).
//   - Around a multi-host launch: preload.go sends the program and files
//     to the hosts before any rank starts (zstd, SHA-256, skipped when
//     present); doctor.go runs the same agents for pre-flight checks
//     (versions, interfaces, ports, all-pairs reachability, GPUs).
//   - The agent (agent.go): the same executable re-run with an internal
//     variable set; a child subreaper that is the parent of every rank and
//     kills every descendant when gorun dies, however it died. agent.go
//     explains why this design was chosen over the alternatives. Programs
//     embedding the launcher call IsAgent/AgentMain first thing in main.
//
// # A multi-host launch's ordering obligations
//
// No rank starts anywhere until every host's agent has authenticated, said
// hello (version, interface, ports, program present) and received its
// preloaded files: any host failing before that ends the launch with an
// error naming it. The plan is made only then, because rank 0's host
// supplies MASTER_ADDR and the ports. An agent sends "done" only after the
// last byte of its ranks' output, so gorun has all output of a host when
// it counts that host finished.
//
// # Run's ordering obligations
//
// The agent starts every rank before it reads any command, so a command
// that addresses "all ranks" reaches each of them even when its "started"
// event is still in flight. Ports are released after the agent is running
// and before the spec is sent. Run returns only after the agent reported
// that no rank and no descendant is left, the agent was reaped, and every
// output stream reached EOF.
//
// Test support lives in launchertest: the helper rank modes a test binary
// runs as, and a /proc scan for a test's surviving processes.
package launcher
