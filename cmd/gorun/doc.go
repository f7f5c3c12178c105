// Command gorun starts SPMD jobs: `gorun -np N [flags] PROGRAM [ARGS...]`.
//
// It maps flags to launcher calls and errors to exit codes, and nothing
// else: planning, process supervision and output live in package launcher.
// Subcommands — bench (the collective benchmark), doctor (pre-flight
// checks of the hosts), plan (the offline step-graph planner), trace
// (merging the ranks' traces) and agent (the host agent, started by gorun
// itself) — are dispatched on the first argument before flags are parsed,
// so a program's own flags are never read as gorun's; `gorun --help` lists
// them.
package main
