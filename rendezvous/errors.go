package rendezvous

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinels. Typed errors below match them with errors.Is.
var (
	// ErrLost matches every *LostError: a member died or became unreachable.
	ErrLost = errors.New("rendezvous: member lost")
	// ErrLeft: a member needed by an operation left the world gracefully
	// before taking part in it.
	ErrLeft = errors.New("rendezvous: member left")
	// ErrClosed: the World was closed.
	ErrClosed = errors.New("rendezvous: world closed")
	// ErrNotMember: a group was asked for that does not contain the caller.
	ErrNotMember = errors.New("rendezvous: not a member of the group")
	// ErrFormation matches every *FormationError.
	ErrFormation = errors.New("rendezvous: world did not form")
	// ErrConflict matches every *ConflictError.
	ErrConflict = errors.New("rendezvous: conflicting members")
	// ErrStale matches every *StaleError.
	ErrStale = errors.New("rendezvous: stale member of an older world")
	// ErrNoRankEnv: ConfigFromEnv found none of the supported launchers'
	// variables.
	ErrNoRankEnv = errors.New("rendezvous: no rank environment (set GORUN_RANK/GORUN_WORLD_SIZE, " +
		"RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or run under srun)")
)

// ErrAttachNameTaken: the host leader could not listen at its attach
// socket's name because another process already holds it.
var ErrAttachNameTaken = errors.New("rendezvous: the host leader's attach socket name is already taken by another process")

// PeerError is a process of another user on the other end of an attach
// socket (SO_PEERCRED): a leader refuses it as a rank, a rank refuses it as
// its leader (someone took the socket's name first).
type PeerError struct {
	UID, PID int // the peer's, as the kernel recorded them at connect
	Want     int // this process's user id
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("rendezvous: attach socket peer is pid %d of uid %d, not this job's user (uid %d)", e.PID, e.UID, e.Want)
}

// ConfigError is a bad Config field (from Validate or ConfigFromEnv).
type ConfigError struct {
	Field   string // the Config field or environment variable
	Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("rendezvous: config %s: %s", e.Field, e.Problem)
}

// LostError says that a member died or became unreachable. It is what
// Err() returns on a World or Group that contains the member, and what every
// blocked operation on them returns.
type LostError struct {
	Rank  int    // world rank of the lost member
	Host  string // its host, as it advertised it
	Epoch uint64 // the world epoch after the loss
	Cause error  // how it was detected
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("rendezvous: rank %d (host %s) lost", e.Rank, e.Host)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Unwrap returns the cause.
func (e *LostError) Unwrap() error { return e.Cause }

// LostWorldRank returns Rank. Packages that must not depend on this one
// (comm) find the lost member through this method: comm reports it to the
// launcher as the rank its own failure is a consequence of.
func (e *LostError) LostWorldRank() int { return e.Rank }

// ErrDeclaredDead is the Cause of a loss seen by the failure detector: the
// member answered no probe and no TCP connection for its lease
// (Config.GossipLease): it is frozen or cannot run, its host is down, or
// the network to it is cut.
var ErrDeclaredDead = errors.New("answered no probe (UDP) and no connection (TCP) for its lease: frozen, its host down, or the network to it cut")

// ErrRefused is the Cause of a loss proved by a refused connection: the
// member's host answered that nothing listens at its gossip port any more,
// so the process exited or was killed while its host is up.
var ErrRefused = errors.New("its host refused a connection to its gossip port: the process exited or was killed")

// LeftError: a member left gracefully while an operation still needed it.
type LeftError struct {
	Rank int
	Host string
	Op   string // what was waiting, e.g. "barrier"
}

func (e *LeftError) Error() string {
	return fmt.Sprintf("rendezvous: %s: rank %d (host %s) left the world before taking part", e.Op, e.Rank, e.Host)
}

// Is makes errors.Is(err, ErrLeft) true.
func (e *LeftError) Is(target error) bool { return target == ErrLeft }

// Missing is a rank the world is still waiting for; Host is "" when unknown.
type Missing struct {
	Rank int
	Host string
}

// FormationError: the world did not form before the timeout (or the context
// ended). It lists the ranks still missing.
type FormationError struct {
	Joined    int       // ranks seen, including this one
	WorldSize int       // ranks expected
	After     string    // how long Join waited, formatted
	Missing   []Missing // ranks not seen, ascending
	SeedErr   error     // last error joining the seed, if it never succeeded
	Cause     error     // the context's error, when that ended the wait
	Seed      string    // the seed address
	Rank      int       // this rank
	// LocalSize is set when this rank is a host leader that gave up
	// waiting for its own host's ranks to attach (it never joined the
	// gossip, so Missing lists every other rank): LocalsAttached of
	// LocalSize had, on Host.
	LocalsAttached, LocalSize int
	Host                      string
}

func (e *FormationError) Error() string {
	var b strings.Builder
	if e.SeedErr != nil {
		fmt.Fprintf(&b, "rendezvous: rank %d could not join the seed %s after %s: %v", e.Rank, e.Seed, e.After, e.SeedErr)
		return b.String()
	}
	if e.LocalSize > 0 {
		// Which of the host's ranks are missing is not known here: a
		// rank attaches with its world rank, and one that never did
		// could be any of the host's others.
		fmt.Fprintf(&b, "rendezvous: host leader rank %d (host %s): %d/%d of its host's ranks attached after %s; the world cannot form without the others",
			e.Rank, e.Host, e.LocalsAttached, e.LocalSize, e.After)
		if e.Cause != nil {
			fmt.Fprintf(&b, " (%v)", e.Cause)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "rendezvous: %d/%d ranks after %s; missing ", e.Joined, e.WorldSize, e.After)
	const show = 32 // a 1024-rank job missing 900 ranks needs no 900-item line
	for i, m := range e.Missing {
		if i == show {
			fmt.Fprintf(&b, ", ... (%d more)", len(e.Missing)-show)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d", m.Rank)
		if m.Host != "" {
			fmt.Fprintf(&b, " (%s)", m.Host)
		}
	}
	if e.Cause != nil {
		fmt.Fprintf(&b, " (%v)", e.Cause)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrFormation) true.
func (e *FormationError) Is(target error) bool { return target == ErrFormation }

// LostWorldRank returns the first rank that never joined: the one whose
// absence ended formation, so that the ranks that gave up waiting report
// their failure as its doing and gorun names it (a rank hung before it
// called Init looks like this; only the formation timeout ends that wait,
// since nothing tells it from a rank that is slow to start). It is -1
// when formation ended for another reason: the seed was never reached,
// the context ended, nobody is missing, or this is a host leader whose own
// host's ranks did not all attach (it cannot tell which).
func (e *FormationError) LostWorldRank() int {
	if e.SeedErr != nil || e.Cause != nil || e.LocalSize > 0 || len(e.Missing) == 0 {
		return -1
	}
	return e.Missing[0].Rank
}

// Unwrap returns the context error, if that ended the wait.
func (e *FormationError) Unwrap() error { return e.Cause }

// Claim is one side of a conflict: who said what about itself.
type Claim struct {
	Rank  int
	Host  string
	Addr  string // gossip address host:port
	JobID string
	Size  int // the world size it was started with
}

func (c Claim) String() string {
	return fmt.Sprintf("rank %d of job %q (size %d) on host %s at %s", c.Rank, c.JobID, c.Size, c.Host, c.Addr)
}

// ConflictError: two processes claim one rank, or a member belongs to another
// job or was started with another world size. The world refuses to form
// rather than be silently wrong; the error names both sides.
type ConflictError struct {
	What string // "two processes claim one rank", "member of another job", ...
	A, B Claim
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("rendezvous: %s: %s and %s", e.What, e.A, e.B)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// StaleError: this process belongs to an older world of its job (Config.Generation)
// than a member it met, which belongs to generation Newer: the job has restarted
// without it, and it must not take part.
type StaleError struct {
	Generation, Newer uint64
	// Seen is the member of the newer world.
	Seen Claim
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("rendezvous: this rank belongs to generation %d of its job's world (its restart count), which has restarted as generation %d (met %s): it is stale and must exit", e.Generation, e.Newer, e.Seen)
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }
