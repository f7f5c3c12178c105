package outcome

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/internal/plural"
	"github.com/gorun-hpc/gorun/launcher/program"
)

// RankExitError reports the rank whose failure ended the job, in the manner
// of *exec.ExitError. Its message is the one line gorun prints.
type RankExitError struct {
	// Rank, Host and PID identify the failed rank process.
	Rank int
	Host string
	PID  int
	// Code is the exit code, meaningful when Signal is 0.
	Code int
	// Signal is the signal that killed the rank, or 0.
	Signal syscall.Signal
	// Stopped is the number of other ranks gorun had to stop.
	Stopped int
	// AlsoFailed is the number of other ranks that failed with their own
	// exit code or signal, not the one gorun's teardown sent them.
	AlsoFailed int
	// Collateral is the number of ranks whose runtime reported that they
	// failed because another rank was lost or aborted.
	Collateral int
}

// Error is the one line gorun prints. It claims to have stopped only the
// ranks gorun did stop: when the others all failed on their own, it says
// that instead.
func (e *RankExitError) Error() string {
	cause := fmt.Sprintf("exited with code %d", e.Code)
	if e.Signal != 0 {
		cause = fmt.Sprintf("killed by signal %d (%s)", int(e.Signal), e.Signal)
	}
	s := fmt.Sprintf("rank %d (host %s, pid %d) %s", e.Rank, e.Host, e.PID, cause)
	if e.AlsoFailed > 0 {
		s += fmt.Sprintf("; %d other %s also failed", e.AlsoFailed, plural.Noun(e.AlsoFailed, "rank", "ranks"))
	}
	s += collateralText(e.Collateral)
	if e.Stopped > 0 || (e.AlsoFailed == 0 && e.Collateral == 0) {
		s += fmt.Sprintf("; stopped %d other %s", e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
	}
	return s
}

// ExitCode is what gorun exits with: the rank's code, or 128+signal as a
// shell reports a signal death.
func (e *RankExitError) ExitCode() int {
	if e.Signal != 0 {
		return 128 + int(e.Signal)
	}
	return e.Code
}

// StartError reports a rank that could not be started at all.
type StartError struct {
	Rank int
	Host string
	// Err is the cause from the operating system.
	Err error
	// Stopped is the number of other ranks gorun had to stop.
	Stopped int
}

func (e *StartError) Error() string {
	return fmt.Sprintf("rank %d (host %s) could not start: %v; stopped %d other %s",
		e.Rank, e.Host, e.Err, e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
}

func (e *StartError) Unwrap() error { return e.Err }

// ExitCode is 127, a shell's code for a command that cannot be run.
func (e *StartError) ExitCode() int { return 127 }

// TimeoutError reports a job ended by --timeout.
type TimeoutError struct {
	// After is the configured timeout.
	After time.Duration
	// Stopped is the number of ranks still running that gorun stopped.
	Stopped int
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("job timed out after %s; stopped %d %s", e.After, e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
}

// ExitCode is 124, the code of timeout(1).
func (e *TimeoutError) ExitCode() int { return 124 }

// InterruptedError reports a job ended because gorun received a signal.
type InterruptedError struct {
	// Signal is the first terminating signal gorun received.
	Signal syscall.Signal
	// Stopped is the number of ranks still running when it arrived.
	Stopped int
}

func (e *InterruptedError) Error() string {
	if e.Stopped == 0 {
		// Before any rank started, or after every rank ended, some on the
		// forwarded signal itself (a program that catches SIGINT and exits
		// with its own code is not one gorun stopped).
		return fmt.Sprintf("received signal %d (%s); no rank was left to stop (each had ended, or none had started)", int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("received signal %d (%s); stopped %d %s", int(e.Signal), e.Signal, e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
}

// ExitCode is 128+signal, as a shell reports it.
func (e *InterruptedError) ExitCode() int { return 128 + int(e.Signal) }

// SupervisorError reports that the per-job supervisor process died or broke its
// protocol; the ranks it watched are lost (they die with it: Pdeathsig).
type SupervisorError struct {
	Err error
	// Ranks is the number of ranks still running when it was lost.
	Ranks int
	// Leftovers is the number of processes of the job (ranks' children in
	// other sessions) that gorun found and killed after the loss.
	Leftovers int
}

func (e *SupervisorError) Error() string {
	s := fmt.Sprintf("launcher: job supervisor failed: %v", e.Err)
	if e.Ranks > 0 {
		s += fmt.Sprintf("; %d running %s killed", e.Ranks, plural.Noun(e.Ranks, "rank", "ranks"))
	}
	if e.Leftovers > 0 {
		s += fmt.Sprintf("; %d leftover %s of the job killed", e.Leftovers, plural.Noun(e.Leftovers, "process", "processes"))
	}
	return s
}

func (e *SupervisorError) Unwrap() error { return e.Err }

// HostError reports a host that could not take part in the job: its host agent
// could not be started or reached, refused, or found that the program
// cannot run there. Nothing of the job was started when it is returned.
type HostError struct {
	// Host is the host name as in the plan.
	Host string
	// Op says what failed, e.g. "start agent over ssh".
	Op string
	// Err is the cause; a *program.Error for a program missing on the host.
	Err error
	// Detail holds what the host agent's starter (ssh, srun) printed, when it
	// says more than Err.
	Detail string
}

func (e *HostError) Error() string {
	cause := strings.TrimPrefix(e.Err.Error(), "launcher: ")
	s := fmt.Sprintf("host %s: %s: %s", e.Host, e.Op, cause)
	var pe *program.Error
	if errors.As(e.Err, &pe) {
		s = fmt.Sprintf("host %s: %s", e.Host, cause)
	}
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

func (e *HostError) Unwrap() error { return e.Err }

// ExitCode is 127 for a program missing on the host, like a shell; 1 for a
// rank count the host's limits refuse, which is bad input like the local
// refusal (a *plan.CapacityError), not a lost host; else 255, ssh's code for a
// failed connection.
func (e *HostError) ExitCode() int {
	var pe *program.Error
	if errors.As(e.Err, &pe) {
		return 127
	}
	var ce *HostCapacityError
	if errors.As(e.Err, &ce) {
		return 1
	}
	return 255
}

// HostCapacityError is a host agent's capacity refusal as it arrives in
// its hello: only the text crosses the wire, so the type is what tells
// HostError.ExitCode that the input, not the host, was at fault.
type HostCapacityError struct {
	// Msg is the refusal as the host agent worded it.
	Msg string
}

func (e *HostCapacityError) Error() string { return e.Msg }

// VersionError reports a remote gorun whose version differs from this
// one's: mixing versions is refused rather than debugged at run time.
type VersionError struct {
	Host          string
	Remote, Local string
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("host %s runs gorun %s but this gorun is %s; install the same version on every host (or use --preload-binary)",
		e.Host, e.Remote, e.Local)
}

// HostLostError reports a host whose host agent died or whose connection
// dropped while the job ran: its ranks count as failed and the job ended.
type HostLostError struct {
	// Host is the host name; FirstRank and Ranks the ranks it ran.
	Host             string
	FirstRank, Ranks int
	// Err says how the loss was noticed.
	Err error
	// Stopped is the number of other ranks gorun had to stop.
	Stopped int
	// Collateral is the number of ranks elsewhere whose runtime reported
	// failing because of the loss.
	Collateral int
}

func (e *HostLostError) Error() string {
	ranks := fmt.Sprintf("rank %d", e.FirstRank)
	if e.Ranks > 1 {
		ranks = fmt.Sprintf("ranks %d-%d", e.FirstRank, e.FirstRank+e.Ranks-1)
	}
	return fmt.Sprintf("lost host %s: %v; its %s counted as failed%s; stopped %d other %s",
		e.Host, e.Err, ranks, collateralText(e.Collateral), e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
}

func (e *HostLostError) Unwrap() error { return e.Err }

// ExitCode is 255, ssh's code for a lost connection.
func (e *HostLostError) ExitCode() int { return 255 }

// collateralText is the final line's count of collateral ranks.
func collateralText(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d %s failed as a consequence (peer lost)", n, plural.Noun(n, "rank", "ranks"))
}

// CollateralError reports a job whose every failed rank said it failed
// because another rank was lost or aborted, while no rank failed on its own
// as far as gorun saw: a frozen rank, a cut link. It names the rank the
// reports point to.
type CollateralError struct {
	// Blame is the rank the reports point to, -1 when the runtime could
	// not tell; BlameHost and BlamePID locate it.
	Blame     int
	BlameHost string
	BlamePID  int
	// Frozen is set when Blame was stopped (SIGSTOP, a debugger) when
	// gorun ended it: the process state letter its supervisor read
	// ("T" stopped, "t" traced). Its peers only saw it fall silent.
	Frozen string
	// ReportedBy is the rank whose report names Blame (on ReporterHost),
	// Why its words.
	ReportedBy   int
	ReporterHost string
	Why          string
	// Link is set when no process failed but the network did: Blame ran
	// on (or failed only because of a peer) on another host than its
	// reporter, not frozen, while both hosts' supervisors answered. A cut
	// link or a partition between the two hosts looks like this.
	Link bool
	// Failed is the number of ranks that failed as a consequence.
	Failed int
	// Stopped is the number of other ranks gorun had to stop.
	Stopped int
	// Code is the first collateral rank's exit status.
	Code int
	// Desync is set when the ranks failed because they issued different
	// calls: Why names both calls and both sides, Blame the rank of the
	// smaller side (-1 when the sides are equal).
	Desync bool
}

func (e *CollateralError) Error() string {
	s := fmt.Sprintf("rank %d reported a lost peer (%s)", e.ReportedBy, e.Why)
	switch {
	case e.Desync && e.Blame >= 0:
		s = fmt.Sprintf("desync: rank %d (host %s, pid %d) issued a call the other ranks did not: rank %d reported %q",
			e.Blame, e.BlameHost, e.BlamePID, e.ReportedBy, e.Why)
	case e.Desync:
		// No side known to be smaller: no rank is named alone.
		s = fmt.Sprintf("desync: the ranks issued different calls: rank %d reported %q", e.ReportedBy, e.Why)
	case e.Blame >= 0 && e.Link:
		s = fmt.Sprintf("the network between host %s and host %s failed: rank %d (host %s) lost rank %d (host %s, pid %d), which was still running: %q",
			e.ReporterHost, e.BlameHost, e.ReportedBy, e.ReporterHost, e.Blame, e.BlameHost, e.BlamePID, e.Why)
	case e.Blame >= 0 && e.Frozen != "":
		s = fmt.Sprintf("rank %d (host %s, pid %d) was frozen (process state %s: %s) and lost to its peers: rank %d reported %q",
			e.Blame, e.BlameHost, e.BlamePID, e.Frozen, stateName(e.Frozen), e.ReportedBy, e.Why)
	case e.Blame >= 0:
		s = fmt.Sprintf("rank %d (host %s, pid %d) was lost to its peers: rank %d reported %q", e.Blame, e.BlameHost, e.BlamePID, e.ReportedBy, e.Why)
	}
	if e.Desync {
		s += fmt.Sprintf("; %d %s failed with it", e.Failed, plural.Noun(e.Failed, "rank", "ranks"))
	} else {
		s += collateralText(e.Failed)
	}
	// As RankExitError: no "stopped 0 other ranks" when every other rank
	// failed on its own, which the line has just said.
	if e.Stopped > 0 || e.Failed == 0 {
		s += fmt.Sprintf("; stopped %d other %s", e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
	}
	return s
}

// FrozenError reports a rank that its supervisor found stopped (process
// state T) for longer than its lease, and that nothing else had ended
// first: most often a rank frozen before the world formed, which its
// peers cannot tell from one that is slow to start (supervisor/freeze.go).
// gorun ended it with the rest.
type FrozenError struct {
	Rank int
	Host string
	PID  int
	// State is the /proc state letter ("T"); Why says for how long.
	State string
	Why   string
	// Stopped is the number of other ranks gorun had to stop; Collateral
	// those whose runtime reported failing because of a lost peer;
	// AlsoFailed those that failed on their own (a program that exits 1
	// on gorun's SIGTERM counts here: its exit was not the signal's).
	Stopped, Collateral, AlsoFailed int
}

func (e *FrozenError) Error() string {
	s := fmt.Sprintf("rank %d (host %s, pid %d) was frozen (process state %s: %s): %s",
		e.Rank, e.Host, e.PID, e.State, stateName(e.State), e.Why)
	if e.AlsoFailed > 0 {
		s += fmt.Sprintf("; %d other %s also failed", e.AlsoFailed, plural.Noun(e.AlsoFailed, "rank", "ranks"))
	}
	s += collateralText(e.Collateral)
	if e.Stopped > 0 || (e.AlsoFailed == 0 && e.Collateral == 0) {
		s += fmt.Sprintf("; stopped %d other %s", e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
	}
	return s
}

// ExitCode is 1: a frozen rank has no exit status of its own.
func (e *FrozenError) ExitCode() int { return 1 }

// stateName says what a /proc state letter of a frozen rank means.
func stateName(st string) string {
	if st == "t" {
		return "stopped by a tracer"
	}
	return "stopped by a signal"
}

// ExitCode is 255 for a lost link (the network between two hosts failed:
// ssh's code for a lost connection, as for a lost host), else the first
// collateral rank's exit status: the blamed rank did not fail in a way
// gorun saw.
func (e *CollateralError) ExitCode() int {
	if e.Link {
		return 255
	}
	return e.Code
}

// MPIError reports a rank that ended the job through MPI's process
// management: it called MPI_Abort, or it exited 0 after MPI_Init without
// MPI_Finalize (its peers would have waited for it forever).
type MPIError struct {
	Rank int
	Host string
	PID  int
	// Aborted is true for MPI_Abort; Code is then the code it passed.
	Aborted bool
	Code    int
	// Message is the abort's message, when the library sent one.
	Message string
	// Stopped is the number of other ranks gorun had to stop.
	Stopped int
}

func (e *MPIError) Error() string {
	cause := "exited before MPI_Finalize (it left the PMI job after MPI_Init without finalizing)"
	if e.Aborted {
		cause = fmt.Sprintf("called MPI_Abort with code %d", e.Code)
		if e.Message != "" {
			cause += " (" + e.Message + ")"
		}
	}
	return fmt.Sprintf("rank %d (host %s, pid %d) %s; stopped %d other %s",
		e.Rank, e.Host, e.PID, cause, e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
}

// ExitCode is the abort code as a process exit status (its low byte, as
// the shell sees an exit code), or 1 for a rank that left without
// finalizing.
func (e *MPIError) ExitCode() int {
	if e.Aborted {
		return e.Code & 0xff
	}
	return 1
}
