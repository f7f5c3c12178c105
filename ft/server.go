package ft

import (
	"errors"

	"github.com/rs/zerolog"
)

var errNotYet = errors.New("ft: not implemented yet")

// ServerConfig configures the quorum service.
type ServerConfig struct {
	// Addr is the listen address (host:port; port 0: the kernel picks).
	Addr string
	// JobID and Secret identify the job; the service's key is derived
	// from them (DeriveKey), and replicas of another job are refused.
	JobID  string
	Secret []byte
	// Replicas is the number of replicas (the world size); replica ids
	// are 0..Replicas-1.
	Replicas int
	// Logger receives quorum changes and losses (info) and refused
	// connections (warn).
	Logger zerolog.Logger
	// OnLoss, when set, is called (on the service's goroutine; it must not
	// block) when a replica's incarnation is lost to the connection's end,
	// so the launcher may learn of a frozen or partitioned replica.
	OnLoss func(replica, incarnation int, why string)
}

// Server is the quorum service ("lighthouse"): it answers every replica's
// Quorum once every live replica asked, decides every quorum's commit, and
// keeps the Record. gorun --fault-tolerant runs one per job; tests run one
// in process. Methods are safe for concurrent use.
type Server struct {
	notImplemented struct{}
}

// NewServer listens on cfg.Addr and serves until Close.
func NewServer(cfg ServerConfig) (*Server, error) { return nil, errNotYet }

// Addr returns the address replicas dial (AddrEnv's value).
func (s *Server) Addr() string { return "" }

// Lost tells the service that replica's incarnation is dead (the launcher
// reaped its process, or its host was lost): the replica leaves the live
// set at once, a quorum waiting for it is answered without it, and a
// quorum it participates in fails (its members' communicators fail, its
// step is not committed). A stale incarnation (already replaced) is
// ignored. It does not block.
func (s *Server) Lost(replica, incarnation int, why string) {}

// Left tells the service that a replica exited successfully, for good
// (the launcher saw exit code 0): like Lost, but not recorded as a loss.
func (s *Server) Left(replica, incarnation int) {}

// Record returns a copy of what the service saw so far.
func (s *Server) Record() Record { return Record{} }

// Close stops the service, closing every replica's connection, and
// returns once its goroutines have exited. Idempotent.
func (s *Server) Close() error { return nil }

// DeriveKey is the service's key for a job: HKDF-SHA256 of the job secret,
// salted with the job id, with KeyPurpose.
func DeriveKey(secret []byte, jobID string) ([]byte, error) { return nil, errNotYet }
