package comm

import (
	"errors"
	"fmt"
)

// Sentinels. Errors returned by this package wrap one of these (errors.Is) or
// are one of the typed errors below.
var (
	// ErrInvalidArgument: a call whose buffers, counts, root, peer, dtype or op
	// are wrong. The communicator is aborted, since the peers cannot skip the call.
	ErrInvalidArgument = errors.New("comm: invalid argument")
	// ErrDeviceBuffer: a buffer in device memory given to the CPU communicator.
	ErrDeviceBuffer = errors.New("comm: buffer is not in host memory")
	// ErrPeerLost: a member of the group died or its connection broke.
	ErrPeerLost = errors.New("comm: peer lost")
	// ErrClosed: the communicator or endpoint was closed.
	ErrClosed = errors.New("comm: closed")
	// ErrAborted: Abort was called.
	ErrAborted = errors.New("comm: aborted")
	// ErrDesync: ranks issued different calls at the same position.
	ErrDesync = errors.New("comm: desync")
	// ErrAuth: a data-plane connection failed the job-secret handshake.
	ErrAuth = errors.New("comm: authentication failed")
	// ErrProtocol: a peer sent a frame this version cannot parse.
	ErrProtocol = errors.New("comm: protocol error")
)

// PeerError is a failure attributed to one rank of the group: it died, closed
// its communicator, broke its connection or aborted.
type PeerError struct {
	Rank       int    // group rank
	WorldRank  int    // rank in the job
	Host       string // where it ran
	Reason     string // what was observed
	Err        error  // ErrPeerLost, ErrClosed, ErrAborted or the remote error
	RemoteText string // for a remote abort: the error text the peer sent
}

func (e *PeerError) Error() string {
	s := fmt.Sprintf("comm: rank %d (world rank %d) on %s: %s", e.Rank, e.WorldRank, e.Host, e.Reason)
	if e.RemoteText != "" {
		s += ": " + e.RemoteText
	}
	return s
}

func (e *PeerError) Unwrap() error { return e.Err }

// CallInfo describes one collective call, as a desync error reports it.
type CallInfo struct {
	Kind  Kind
	DType DType
	Op    Op // zero when the call does not reduce
	Count int
	Root  int // root, or peer for Send/Recv; -1 when not applicable
	Seq   uint64
}

func (ci CallInfo) String() string {
	s := fmt.Sprintf("%v(%v", ci.Kind, ci.DType)
	if ci.Op.Valid() {
		s += " " + ci.Op.String()
	}
	s += fmt.Sprintf(", count=%d", ci.Count)
	if ci.Root >= 0 {
		switch ci.Kind {
		case KindSend:
			s += fmt.Sprintf(", to=%d", ci.Root)
		case KindRecv:
			s += fmt.Sprintf(", from=%d", ci.Root)
		default:
			s += fmt.Sprintf(", root=%d", ci.Root)
		}
	}
	return s + fmt.Sprintf(") #%d", ci.Seq)
}

// DesyncError: this rank and Peer disagree about the call at one position.
type DesyncError struct {
	Rank   int      // this rank
	Mine   CallInfo // the call this rank issued
	Peer   int      // the rank whose message did not match
	Theirs CallInfo // the call Peer issued
	Detail string   // optional: which field differed
}

func (e *DesyncError) Error() string {
	s := fmt.Sprintf("comm: desync: rank %d called %v but rank %d called %v", e.Rank, e.Mine, e.Peer, e.Theirs)
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

func (e *DesyncError) Unwrap() error { return ErrDesync }
