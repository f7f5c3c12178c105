package ft

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
)

// The environment a fault-tolerant replica reads beyond every rank's
// (GORUN_RANK, GORUN_WORLD_SIZE, GORUN_JOB_ID, GORUN_SECRET, GORUN_HOST).
const (
	// AddrEnv is host:port of the quorum service gorun --fault-tolerant
	// runs; a program started without it is not fault-tolerant (Join
	// fails with ErrNotFaultTolerant).
	AddrEnv = "GORUN_FT_ADDR"
	// IncarnationEnv is the replica's incarnation: 0 for the process gorun
	// started first, n for the n-th replacement of that replica.
	IncarnationEnv = "GORUN_FT_INCARNATION"
	// GroupSizeEnv is the size of a replica group (gorun
	// --fault-tolerant-group): HSDP's shard group of consecutive ranks
	// is one replica, replaced whole. Unset or 1: every rank is a
	// replica.
	GroupSizeEnv = "GORUN_FT_GROUP_SIZE"
)

// KeyPurpose is the HKDF purpose of the quorum service's key, derived from
// the job secret with the job id as salt (DeriveKey), as every key of a
// gorun job is.
const KeyPurpose = "gorun ft quorum v1"

// Errors. Failures of comm come back wrapped, their sentinels intact.
var (
	// ErrConfig: a Config field or the environment is invalid; the
	// message names which.
	ErrConfig = errors.New("ft: invalid configuration")
	// ErrNotFaultTolerant: AddrEnv is not set (the program was not
	// started by gorun --fault-tolerant).
	ErrNotFaultTolerant = errors.New("ft: not started by gorun --fault-tolerant (" + AddrEnv + " is not set)")
	// ErrAuth: the quorum service or a replica did not prove it holds
	// the job secret.
	ErrAuth = errors.New("ft: authentication failed (wrong job secret)")
	// ErrServiceLost: the connection to the quorum service ended; the
	// launcher is gone or has ended the job. Nothing can be agreed any
	// more, so the replica should exit.
	ErrServiceLost = errors.New("ft: quorum service lost")
	// ErrQuorumFailed: the quorum a call ran in failed (a participant
	// died, or gave up on it). Quorum retries on its own; AllReduce and
	// the collectives of Comm return it (wrapping comm's error).
	ErrQuorumFailed = errors.New("ft: quorum failed")
	// ErrNoState: this replica must heal (or serve a heal) and no State
	// was set.
	ErrNoState = errors.New("ft: no State set (SetState before the first Quorum)")
	// ErrHeal: a heal failed on this replica's side (a State.Save or Load
	// error, or a transfer whose digest did not match); the message says
	// which. A heal that failed because a source died is ErrQuorumFailed
	// and is retried, not returned.
	ErrHeal = errors.New("ft: heal failed")
	// ErrFinished: every replica that held the job's latest committed
	// step has finished and left, so this one (behind, a late
	// replacement) has nobody to heal from. The job's training is done;
	// a trainer exits successfully on it.
	ErrFinished = errors.New("ft: the other replicas finished the job and left")
	// ErrClosed: the Manager or Server was closed.
	ErrClosed = errors.New("ft: closed")
	// ErrPhase: a call out of order (ShouldCommit without a Quorum, a
	// second ShouldCommit for one quorum).
	ErrPhase = errors.New("ft: call out of order")
)

// State is what a heal copies from the live replicas: the trainer's
// parameters, optimizer state and anything else that must be equal on
// every replica after a committed step. The Manager calls Save on every
// heal source and Load on the healing replica, both from inside Quorum, on
// the goroutine that called Quorum (never concurrently with the
// trainer's own use of the state, since the trainer is inside Quorum).
type State interface {
	// Save serializes the state. Replicas at the same committed step
	// must return identical bytes (the heal checks a digest).
	Save() ([]byte, error)
	// Load replaces the state with one Save returned (on another
	// replica). The Manager has checked its length and digest.
	Load(b []byte) error
}

// StateFuncs adapts two functions to State.
type StateFuncs struct {
	SaveFunc func() ([]byte, error)
	LoadFunc func([]byte) error
}

var _ State = StateFuncs{}

// Save calls SaveFunc.
func (s StateFuncs) Save() ([]byte, error) { return s.SaveFunc() }

// Load calls LoadFunc.
func (s StateFuncs) Load(b []byte) error { return s.LoadFunc(b) }

// Config configures Join. Start from DefaultConfig.
type Config struct {
	// Logger receives the Manager's decisions (quorums, heals, commits)
	// at debug and failures at warn; it is passed to the endpoint and
	// every communicator.
	Logger zerolog.Logger
	// Lookup reads the environment; nil means os.LookupEnv (tests and
	// bindings that run several replicas in one process pass their own).
	Lookup func(string) (string, bool)
	// ListenAddr is the data-plane listen address (host:port); empty
	// means GORUN_DATA_ADDR, else the host's address gorun routes the job
	// over, on a port the kernel picks.
	ListenAddr string
	// Endpoint is the template of the data-plane listener; Addr, Secret
	// and Logger are filled by Join.
	Endpoint comm.EndpointConfig
	// Comm is the template of every quorum's communicator; Tag and Logger
	// are filled by the Manager. Every replica must use an equal Comm.
	Comm comm.Config
	// DialTimeout bounds Join's connection and handshake with the quorum
	// service. 10 s: the service is up before any replica starts, so only
	// a dead launcher takes that long.
	DialTimeout time.Duration
}

// DefaultConfig returns production settings: the process's environment,
// comm's and the endpoint's defaults except two, no logging. The two:
// Deterministic reductions, because a heal copies one replica's state to
// another and the replicas must hold bitwise the same state after every
// committed step, so every participant must get bitwise the same reduced
// gradients; and a 20 s connect timeout, since a participant that never
// connects is usually reported dead much sooner, which ends the wait.
func DefaultConfig() Config {
	cc := comm.DefaultConfig()
	cc.Deterministic = true
	cc.ConnectTimeout = 20 * time.Second
	return Config{
		Logger:      zerolog.Nop(),
		Endpoint:    comm.DefaultEndpointConfig(),
		Comm:        cc,
		DialTimeout: 10 * time.Second,
	}
}

// Validate reports the first invalid field, wrapping ErrConfig.
func (c *Config) Validate() error {
	cc := c.Comm
	cc.Logger = c.Logger
	if err := cc.Validate(); err != nil {
		return fmt.Errorf("%w: Comm: %w", ErrConfig, err)
	}
	e := c.Endpoint
	e.Secret = []byte{1}
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: Endpoint: %w", ErrConfig, err)
	}
	if c.DialTimeout <= 0 {
		return fmt.Errorf("%w: DialTimeout %v must be positive", ErrConfig, c.DialTimeout)
	}
	return nil
}

// Participant is one member of a quorum.
type Participant struct {
	// Replica is the replica id (the rank, in plain data parallelism).
	Replica int `json:"replica"`
	// Incarnation is the process's incarnation (0: the first).
	Incarnation int `json:"incarnation"`
	// Addr is its data-plane address, Host its host label.
	Addr string `json:"addr"`
	Host string `json:"host"`
	// Step is the committed step it held when it asked for the quorum.
	Step int64 `json:"step"`
}

// Quorum is the answer to Manager.Quorum: who participates in this step.
type Quorum struct {
	// ID numbers the communicator: it changes exactly when Participants
	// change or the previous quorum failed or did not commit (the
	// communicator is then rebuilt on every participant), and grows.
	ID int64
	// Step is the quorum's step: the highest committed step among the
	// participants, which every participant holds once Quorum returns
	// (the ones behind healed).
	Step int64
	// Participants are ordered by replica id; a participant's group rank
	// in Comm is its index here.
	Participants []Participant
	// Healed lists the replicas that healed in this quorum; HealSources
	// the ones that served the heal.
	Healed      []int
	HealSources []int
	// Changed is true when the participants differ from this replica's
	// previous quorum (always true for its first).
	Changed bool
	// Rank is this replica's index in Participants.
	Rank int
	// Group lists the ranks of this rank's replica group (HSDP; nil
	// without groups): GroupComm's members, in this order.
	Group []Participant
}

// Size is the number of participants.
func (q Quorum) Size() int { return len(q.Participants) }

// Record is what the quorum service saw: the report's fault-tolerance
// section. Times are seconds since the service started.
type Record struct {
	Replicas int            `json:"replicas"`
	Quorums  []QuorumRecord `json:"quorums,omitempty"`
	Losses   []LossRecord   `json:"losses,omitempty"`
	Joins    []JoinRecord   `json:"joins,omitempty"`
	Heals    []HealRecord   `json:"heals,omitempty"`
	// Served are the heal sources' own accounts of what they sent: one
	// per source per heal, so a heal's sharding can be seen.
	Served []ServedRecord `json:"served,omitempty"`
	// Uncommitted are the steps a quorum did not commit.
	Uncommitted []UncommittedRecord `json:"uncommitted,omitempty"`
	// Finished are the incarnations told ErrFinished: they asked for a
	// quorum after every replica that held the last committed step had
	// left, so there was nothing to heal from or join.
	Finished []JoinRecord `json:"finished,omitempty"`
	// Commits counts committed steps (one per quorum round that
	// committed); MaxStep is the highest step any replica reached.
	Commits int   `json:"commits"`
	MaxStep int64 `json:"max_step"`
}

// QuorumRecord is one new quorum id: a change of membership, or the same
// members again after a quorum that failed or did not commit.
type QuorumRecord struct {
	ID           int64   `json:"id"`
	Step         int64   `json:"step"`
	At           float64 `json:"at_s"`
	Participants []int   `json:"participants"`
	Healing      []int   `json:"healing,omitempty"`
}

// LossRecord is one replica incarnation lost.
type LossRecord struct {
	Replica     int     `json:"replica"`
	Incarnation int     `json:"incarnation"`
	At          float64 `json:"at_s"`
	// Step is the last step the replica had committed.
	Step int64  `json:"step"`
	Why  string `json:"why"`
}

// JoinRecord is one incarnation's connection to the service.
type JoinRecord struct {
	Replica     int     `json:"replica"`
	Incarnation int     `json:"incarnation"`
	At          float64 `json:"at_s"`
}

// HealRecord is one finished heal.
type HealRecord struct {
	Replica     int     `json:"replica"`
	Incarnation int     `json:"incarnation"`
	Quorum      int64   `json:"quorum"`
	Step        int64   `json:"step"`
	Sources     []int   `json:"sources"`
	Bytes       int64   `json:"bytes"`
	At          float64 `json:"at_s"`
	// Took is the transfer (first byte asked to Load returned); SinceJoin
	// is from the incarnation's connection to the end of its heal.
	Took      float64 `json:"took_s"`
	SinceJoin float64 `json:"since_join_s"`
}

// ServedRecord is what one heal source sent in one quorum: Bytes of the
// state (its slice), to each of the healing replicas.
type ServedRecord struct {
	Replica int     `json:"replica"`
	Quorum  int64   `json:"quorum"`
	Bytes   int64   `json:"bytes"`
	At      float64 `json:"at_s"`
}

// UncommittedRecord is one step a quorum did not commit.
type UncommittedRecord struct {
	Quorum int64   `json:"quorum"`
	Step   int64   `json:"step"`
	At     float64 `json:"at_s"`
	Why    string  `json:"why"`
}
