// Package outcome owns how a job that did not succeed is reported: one
// typed error per way a job ends badly, each carrying the data that
// locates the cause (rank, host, pid, exit code or signal, what was lost)
// and the counts of the other ranks (stopped by gorun, failed on their
// own, failed as a consequence), in the manner of *exec.ExitError.
//
// Each error's Error is the one line gorun prints, and most have an
// ExitCode method that gives the status gorun exits with (128+signal for
// a signal, 124 for a timeout, 127 for a program that cannot run, 255 for
// a lost host or link, as a shell, timeout(1) and ssh report them);
// cmd/gorun reads it through that method alone.
//
// The package is a leaf: it only names and words the outcomes. Deciding
// which failure ended a job (the exit policy, collateral failures, the
// blamed rank) belongs to the launcher's job loop, and the causal record
// written by --report (launcher.CauseReport) is built from these errors
// there.
package outcome
