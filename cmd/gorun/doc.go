// Command gorun starts SPMD jobs: `gorun -np N [flags] PROGRAM [ARGS...]`.
//
// It maps flags to launcher calls and errors to exit codes, and nothing
// else: planning, process supervision and output live in package launcher.
// Subcommands (bench, agent, doctor) are dispatched on the first argument
// before flags are parsed, so a program's own flags are never read as
// gorun's.
package main
