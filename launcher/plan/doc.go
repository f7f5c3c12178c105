// Package plan owns a job's plan: which rank runs on which host, with which
// GPU, and the full environment each rank starts with. New maps a Config
// (hosts, -np, GPUs per host, exports, job id, secret, ports) to a Plan
// with one RankSpec per rank; ResolveExports turns -x values into
// NAME=VALUE pairs, refusing the names gorun sets per rank.
//
// It is pure: New is a deterministic function of its Config, with no I/O,
// no clock and no goroutine. Resources are the caller's: package launcher
// reserves the ports, makes the job id and secret, reads host lists
// (through launcher/hostfile) and machine limits, and executes the plan.
//
// A plan's promises, which the launcher relies on: ranks are placed by
// slot, host after host, and a host's ranks are contiguous (rank =
// FirstRank + LocalRank); hosts without a rank are left out; every rank's
// Env lists gorun's variables in a fixed order with the user's exports
// last, so that an export the plan allows wins.
//
// Its errors keep the "launcher:" prefix users have always seen.
package plan
