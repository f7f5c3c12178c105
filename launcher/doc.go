// Package launcher owns starting an SPMD job: it plans which rank runs on
// which host (a pure function of hosts, slots and flags), then starts, watches
// and tears down the rank processes, so that the first failure ends the job,
// no process outlives it, and the user learns which rank failed, where, and
// why.
//
// Parsing command-line flags and mapping errors to exit codes belong to
// cmd/gorun; forming process groups between the ranks belongs to rendezvous.
package launcher
