package ft

import (
	"context"

	"github.com/gorun-hpc/gorun/comm"
)

// Manager is one replica's side of fault-tolerant training: its connection
// to the quorum service, its data-plane endpoint, the current quorum's
// communicator, its committed step and its State. Quorum, AllReduce,
// ShouldCommit and Comm's collectives are the training loop's and must be
// called from one goroutine at a time, in the order of the package doc;
// ReportError, Step, Replica and Close are safe for concurrent use.
type Manager struct {
	notImplemented struct{}
}

// Join starts this replica: it reads the environment (see the package
// doc), listens on the data plane and connects to the quorum service,
// proving it holds the job secret. It does not wait for other replicas.
// It fails with ErrNotFaultTolerant when AddrEnv is unset.
func Join(ctx context.Context, cfg Config) (*Manager, error) {
	return nil, errNotYet
}

// SetState sets what a heal copies. Call it before the first Quorum; a
// replica that must heal or serve a heal without one gets ErrNoState.
func (m *Manager) SetState(s State) {}

// Replica returns this replica's id (its rank).
func (m *Manager) Replica() int { return 0 }

// Replicas returns the number of replicas the job was started with (the
// world size); a quorum may hold fewer.
func (m *Manager) Replicas() int { return 0 }

// Incarnation returns this process's incarnation (0: the first).
func (m *Manager) Incarnation() int { return 0 }

// Step returns the number of steps this replica has committed (after a
// heal, the sources' number). Safe for concurrent use.
func (m *Manager) Step() int64 { return 0 }

// Quorum starts a step: it asks the service for the step's quorum, blocks
// until the service answers (every live replica asked), rebuilds the
// communicator when the participants changed, and heals this replica (or
// serves the heal of others) when some participant is behind. A quorum
// that fails on the way (a participant died, a heal source died) is asked
// again at once with the remaining replicas, so Quorum returns only with a
// usable quorum, or an error: ctx's, ErrClosed, ErrServiceLost, ErrNoState
// or ErrHeal. Calling Quorum again before ShouldCommit abandons the
// previous quorum's step (its other participants get no commit for it).
func (m *Manager) Quorum(ctx context.Context) (Quorum, error) {
	return Quorum{}, errNotYet
}

// Comm returns the current quorum's communicator (over its participants,
// group rank = index in Quorum.Participants), for collectives beyond
// AllReduce. It is valid until the next Quorum, which may close it; nil
// before the first Quorum. Its calls fail (comm.ErrPeerLost, wrapping the
// loss) when a participant dies; report such an error with ReportError.
func (m *Manager) Comm() *comm.Comm { return nil }

// AllReduce reduces buf in place over the quorum's participants with op
// (comm.Sum, or comm.Avg: the sum divided by the number of participants).
// An error (a participant died: ErrQuorumFailed wrapping comm's error) is
// also recorded as this step's failure, so ShouldCommit returns false.
func (m *Manager) AllReduce(ctx context.Context, buf []float32, op comm.Op) error {
	return errNotYet
}

// ReportError marks the current step failed on this replica (a collective
// it ran itself over Comm failed, its data loader broke): its vote will be
// false. Safe for concurrent use.
func (m *Manager) ReportError(err error) {}

// ShouldCommit ends the step: it votes (true unless an error was
// reported) and blocks until the service decides for the quorum, then
// returns the decision, equal on every participant: true only if every
// participant voted true before any of them died. On true the committed
// step advances by one. On false the caller discards the step's update;
// the next Quorum recovers in place. The error is non-nil only when no
// decision could be had (ctx ended, the service was lost, the Manager
// closed); the decision is then false.
func (m *Manager) ShouldCommit(ctx context.Context) (bool, error) {
	return false, errNotYet
}

// Close leaves the job gracefully (the service does not count it as a
// loss), closes the communicator and the endpoint, and returns once every
// goroutine the Manager started has exited. Idempotent.
func (m *Manager) Close() error { return nil }
