package comm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
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
	// ErrStalled: a call waited longer than Config.StallTimeout with no
	// desync found; the error is a *StallError naming who is where.
	ErrStalled = errors.New("comm: stalled")
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

// aborted reports whether the peer sent an abort frame: this rank learned
// of the failure from it, second hand (the cause travels in Err, so that a
// relayed loss is still ErrPeerLost).
func (e *PeerError) aborted() bool { return strings.HasPrefix(e.Reason, "aborted") }

// CallInfo describes one collective call, as a desync error reports it.
// Seq is the call's position: on frames, the number of calls this pair of
// ranks has run; from the side-channel comparison and in flight records,
// the number of collectives the group has run (Send and Recv carry the
// number of the collective before them).
type CallInfo struct {
	Kind  Kind   `json:"kind"`
	DType DType  `json:"dtype"`
	Op    Op     `json:"op,omitempty"` // zero when the call does not reduce
	Count int    `json:"count"`
	Root  int    `json:"root"` // root, or peer for Send/Recv; -1 when not applicable
	Seq   uint64 `json:"seq"`
}

// sameCall reports whether two ranks' calls at one position agree. The
// count of AllToAllV is this rank's total, which legitimately differs.
func (ci CallInfo) sameCall(o CallInfo) bool {
	if ci.Kind == KindAllToAllV && o.Kind == KindAllToAllV {
		return ci.DType == o.DType
	}
	return ci.Kind == o.Kind && ci.DType == o.DType && ci.Op == o.Op && ci.Count == o.Count && ci.Root == o.Root
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
// It is found either from a frame of the wrong call, or by the side-channel
// comparison of every rank's recent calls (see Config.DesyncCheckAfter); a
// rank told by an abort frame gets the detecting rank's DesyncError, turned
// to its own side where it is on one.
type DesyncError struct {
	Rank   int      `json:"rank"`   // this rank (a rank on Mine's side if this rank is on neither)
	Mine   CallInfo `json:"mine"`   // the call Rank issued
	Peer   int      `json:"peer"`   // the rank whose call did not match
	Theirs CallInfo `json:"theirs"` // the call Peer issued
	Detail string   `json:"detail,omitempty"`
	// MineRanks and TheirRanks, when known (side-channel comparison), are
	// every rank that issued Mine and every rank that issued Theirs.
	MineRanks  []int `json:"mine_ranks,omitempty"`
	TheirRanks []int `json:"their_ranks,omitempty"`
	// ReportedBy names the peer whose abort brought this error, when this
	// rank did not find the desync itself.
	ReportedBy string `json:"-"`
}

func (e *DesyncError) Error() string {
	s := fmt.Sprintf("comm: desync: rank %d called %v but rank %d called %v", e.Rank, e.Mine, e.Peer, e.Theirs)
	if len(e.MineRanks) > 0 && len(e.TheirRanks) > 0 {
		s += fmt.Sprintf(" (%s vs %s)", rankList(e.MineRanks), rankList(e.TheirRanks))
	}
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	if e.ReportedBy != "" {
		s += "; reported by " + e.ReportedBy
	}
	return s
}

// minority is the lowest rank of the strictly smaller side of the desync,
// -1 when the sides are not known or equal: the ranks that issued the
// call fewer ranks issued are the likelier culprits, and with equal sides
// no rank can be named alone.
func (e *DesyncError) minority() int {
	mine, theirs := len(e.MineRanks), len(e.TheirRanks)
	switch {
	case mine == 0 || theirs == 0 || mine == theirs:
		return -1
	case mine < theirs:
		return slices.Min(e.MineRanks)
	}
	return slices.Min(e.TheirRanks)
}

// turnedTo returns e as seen from rank me: swapped when me issued Theirs.
func (e *DesyncError) turnedTo(me int) *DesyncError {
	d := *e
	if slices.Contains(e.TheirRanks, me) {
		d.Rank, d.Mine, d.MineRanks, d.Peer, d.Theirs, d.TheirRanks = me, e.Theirs, e.TheirRanks, e.Rank, e.Mine, e.MineRanks
	} else if slices.Contains(e.MineRanks, me) {
		d.Rank = me
	}
	return &d
}

// StallError: a call waited longer than Config.StallTimeout while no desync
// was found; Report says which rank is where.
type StallError struct {
	Rank   int           `json:"rank"`   // the rank that timed out
	Call   CallInfo      `json:"call"`   // the call it waited in
	Waited time.Duration `json:"waited"` // how long
	Behind []int         `json:"behind"` // ranks that had not reached the call (the stragglers)
	Report string        `json:"report"` // the stall diagnosis, as logged
	// ReportedBy names the peer whose abort brought this error, when this
	// rank did not time out itself.
	ReportedBy string `json:"-"`
}

func (e *StallError) Error() string {
	s := fmt.Sprintf("comm: stalled: rank %d waited %v in %v: %s", e.Rank, e.Waited.Round(time.Millisecond), e.Call, e.Report)
	if e.ReportedBy != "" {
		s += "; reported by " + e.ReportedBy
	}
	return s
}

func (e *StallError) Unwrap() error { return ErrStalled }

// rankList prints ranks compactly: "rank 3", "ranks 0-2,5".
func rankList(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	rs = slices.Sorted(slices.Values(rs))
	var b strings.Builder
	b.WriteString("ranks ")
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", rs[i], rs[j])
		} else {
			fmt.Fprintf(&b, "%d", rs[i])
		}
		i = j + 1
	}
	return b.String()
}

func (e *DesyncError) Unwrap() error { return ErrDesync }
