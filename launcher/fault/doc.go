// Package fault owns the fault specs of gorun --inject and --inject-file:
// the spellings a user writes (kill:rank=2:at=2s, slow:..., drop:..., and
// the rest listed on Parse), parsed into a Fault and checked on their own.
// It is pure: it reads a string or a file's text and does no other I/O.
//
// Bad input is refused with a *SpecError naming the spec, the line of the
// file when there is one, and the part that is wrong.
//
// What the specs do belongs to others: checking them against a job's plan
// (a rank must exist, a host must run ranks) and turning them into a
// schedule of injections is the launcher's (inject.go, inject_chaos.go);
// the job loop owns the clock and the supervisors send the signals; the
// data-plane kinds (drop, delay, corrupt, partition) are parsed and acted
// out by internal/netfault in the ranks' transport.
//
// Its errors keep the "launcher: --inject" prefix users have always seen.
package fault
