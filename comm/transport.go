package comm

import (
	"context"
	"encoding/binary"
	"fmt"
)

// Kind is the kind of a call, carried in every frame so that a peer can name a
// mismatched call.
type Kind uint8

// Call kinds. The values are part of the wire protocol.
const (
	KindAllReduce Kind = iota + 1
	KindAllGather
	KindReduceScatter
	KindBroadcast
	KindReduce
	KindAllToAll
	KindAllToAllV
	KindBarrier
	KindSend
	KindRecv
)

var kindNames = [...]string{
	KindAllReduce: "AllReduce", KindAllGather: "AllGather", KindReduceScatter: "ReduceScatter",
	KindBroadcast: "Broadcast", KindReduce: "Reduce", KindAllToAll: "AllToAll",
	KindAllToAllV: "AllToAllV", KindBarrier: "Barrier", KindSend: "Send", KindRecv: "Recv",
}

func (k Kind) String() string {
	if k >= KindAllReduce && k <= KindRecv {
		return kindNames[k]
	}
	if k == kindProbe {
		return "Probe"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Frame types.
const (
	frameData  uint8 = 1 // payload of a call
	frameAbort uint8 = 2 // the sender failed; payload is its error text
	frameBye   uint8 = 3 // the sender closed its communicator gracefully
)

// HeaderSize is the encoded size of a Header.
const HeaderSize = 56

// maxAbortText bounds the payload of an abort frame we are willing to read.
const maxAbortText = 4096

// Header prefixes every frame. Besides the payload length it carries the
// fingerprint of the call that produced it (kind, dtype, op, count, root, aux)
// and the call's sequence number on this pair of ranks, so the receiver can
// tell a desync from data.
type Header struct {
	Frame uint8
	Kind  Kind
	DType DType
	Op    Op
	Root  int32 // for an all-reduce: minus the calls the message carries (-1: one; see fuse.go)
	Group GroupID
	Seq   uint64
	Count uint64
	Aux   uint64 // a hash of per-call parameters that must agree (e.g. splits)
	Len   uint64 // payload bytes that follow
}

const headerMagic = 'G'

// Encode writes h into b[:HeaderSize].
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = headerMagic
	b[1] = h.Frame
	b[2] = byte(h.Kind)
	b[3] = byte(h.DType)
	b[4] = byte(h.Op)
	b[5], b[6], b[7] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[8:], uint32(h.Root))
	binary.LittleEndian.PutUint32(b[12:], 0)
	binary.LittleEndian.PutUint64(b[16:], uint64(h.Group))
	binary.LittleEndian.PutUint64(b[24:], h.Seq)
	binary.LittleEndian.PutUint64(b[32:], h.Count)
	binary.LittleEndian.PutUint64(b[40:], h.Aux)
	binary.LittleEndian.PutUint64(b[48:], h.Len)
}

// Decode parses b[:HeaderSize] into h. Garbage is ErrProtocol.
func (h *Header) Decode(b []byte) error {
	_ = b[HeaderSize-1]
	if b[0] != headerMagic || b[1] < frameData || b[1] > frameBye {
		return fmt.Errorf("%w: bad frame header % x", ErrProtocol, b[:8])
	}
	h.Frame = b[1]
	h.Kind = Kind(b[2])
	h.DType = DType(b[3])
	h.Op = Op(b[4])
	h.Root = int32(binary.LittleEndian.Uint32(b[8:]))
	h.Group = GroupID(binary.LittleEndian.Uint64(b[16:]))
	h.Seq = binary.LittleEndian.Uint64(b[24:])
	h.Count = binary.LittleEndian.Uint64(b[32:])
	h.Aux = binary.LittleEndian.Uint64(b[40:])
	h.Len = binary.LittleEndian.Uint64(b[48:])
	return nil
}

// Transport connects a communicator to the other members of its group.
// Endpoint (TCP and shared memory) and commtest's in-memory network implement it.
type Transport interface {
	// Connect returns one Link per group rank (nil at g.Rank()) for group id
	// gid, blocking until every peer has connected or ctx ends. Safe for
	// concurrent use by several communicators.
	Connect(ctx context.Context, g Group, gid GroupID) ([]Link, error)
}

// Link is an ordered, reliable, bidirectional stream of frames to one peer,
// private to one group. One goroutine may send while another receives;
// neither direction is safe for concurrent use by several goroutines.
type Link interface {
	// Send writes one frame. It blocks until payload may be reused, which may
	// mean until the peer has received it when the payload exceeds EagerLimit.
	Send(h *Header, payload []byte) error
	// RecvHeader blocks until the next frame's header arrives.
	RecvHeader(h *Header) error
	// RecvPayload reads the payload of the frame whose header was just
	// received; len(dst) must equal that header's Len.
	RecvPayload(dst []byte) error
	// EagerLimit is the largest payload that Send delivers without waiting for
	// the peer to receive, given at most two unreceived frames in flight.
	// Larger sends are overlapped with receives by the caller.
	EagerLimit() int
	// Kind names the medium for logs and benchmarks: "tcp", "shm", "mem".
	Kind() string
	// Close unblocks every pending and future call with an error. Idempotent.
	Close() error
}

// ReduceReceiver is an optional Link fast path: receive the payload of the
// current frame and fold it into dst with f(dst[i:j], src) as pieces arrive,
// without copying it into a staging buffer first.
type ReduceReceiver interface {
	RecvReduce(dst []byte, f func(dst, src []byte)) error
}
