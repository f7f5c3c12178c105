package bench

import (
	"fmt"
	"strings"
)

// Collective is the operation a benchmark measures.
type Collective int

// The operations of `gorun bench`, named as on its command line.
const (
	AllReduce Collective = iota + 1
	AllGather
	ReduceScatter
	Broadcast
	Reduce
	AllToAll
	SendRecv
	Barrier
)

var collectiveNames = [...]string{
	AllReduce: "allreduce", AllGather: "allgather", ReduceScatter: "reducescatter",
	Broadcast: "broadcast", Reduce: "reduce", AllToAll: "alltoall",
	SendRecv: "sendrecv", Barrier: "barrier",
}

// Collectives lists every operation in command-line order.
var Collectives = []Collective{AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, SendRecv, Barrier}

func (c Collective) String() string {
	if c < AllReduce || c > Barrier {
		return fmt.Sprintf("collective(%d)", int(c))
	}
	return collectiveNames[c]
}

// ParseCollective accepts the command-line names and the spellings of
// nccl-tests binaries and OSU tests ("all_reduce", "all-reduce", "AllReduce").
func ParseCollective(s string) (Collective, error) {
	k := strings.NewReplacer("_", "", "-", "", " ", "").Replace(strings.ToLower(s))
	k = strings.TrimSuffix(strings.TrimSuffix(k, "perf"), "test")
	switch k {
	case "alltoall", "a2a":
		return AllToAll, nil
	case "sendrecv", "p2p":
		return SendRecv, nil
	}
	for c, n := range collectiveNames {
		if n != "" && n == k {
			return Collective(c), nil
		}
	}
	return 0, &UsageError{Problem: fmt.Sprintf("unknown operation %q (one of %s)", s, strings.Join(collectiveNames[1:], " "))}
}

// Reduces reports whether the operation takes a reduction operator.
func (c Collective) Reduces() bool { return c == AllReduce || c == ReduceScatter || c == Reduce }

// Rooted reports whether the operation takes a root rank.
func (c Collective) Rooted() bool { return c == Broadcast || c == Reduce }

// BusFactor is nccl-tests' ratio of bus bandwidth to algorithm bandwidth on
// n ranks: the fraction of the data each rank must send over its busiest
// link for an optimal algorithm, so that busbw is comparable with the
// hardware's link speed whatever the rank count.
//
//	all-reduce                            2(n-1)/n
//	all-gather, reduce-scatter, all-to-all (n-1)/n
//	broadcast, reduce, send/recv          1
//	barrier                               0 (moves no data)
func (c Collective) BusFactor(n int) float64 {
	if n < 1 {
		return 0
	}
	switch c {
	case AllReduce:
		return 2 * float64(n-1) / float64(n)
	case AllGather, ReduceScatter, AllToAll:
		return float64(n-1) / float64(n)
	case Broadcast, Reduce, SendRecv:
		return 1
	}
	return 0
}

// shape is how one requested size maps onto buffers on n ranks, following
// nccl-tests' getCollByteCount: the size is the larger of the send and
// receive buffers, count is the per-call parameter (elements per rank for
// all-gather, reduce-scatter and all-to-all).
type shape struct {
	sendCount  int // elements in the send buffer
	recvCount  int // elements in the receive buffer
	paramCount int // the "count" column
	// algBytes is what algbw divides by the time: the bytes of the whole
	// result (nccl-tests' baseBw).
	algBytes int64
}

// shapeFor sizes a call of about size bytes of es-byte elements on n ranks.
// Sizes too small to give every rank one element are rounded up to one
// element per rank rather than measured as empty calls.
func shapeFor(c Collective, size int64, es, n int) shape {
	count := int(size / int64(es))
	per := max(count/n, 1)
	var s shape
	switch c {
	case AllGather:
		s = shape{sendCount: per, recvCount: per * n, paramCount: per}
		s.algBytes = int64(per*n) * int64(es)
	case ReduceScatter:
		s = shape{sendCount: per * n, recvCount: per, paramCount: per}
		s.algBytes = int64(per*n) * int64(es)
	case AllToAll:
		s = shape{sendCount: per * n, recvCount: per * n, paramCount: per}
		s.algBytes = int64(per*n) * int64(es)
	case Barrier:
		return shape{}
	default:
		count = max(count, 1)
		s = shape{sendCount: count, recvCount: count, paramCount: count}
		s.algBytes = int64(count) * int64(es)
	}
	return s
}

// bytes is the size column: the larger buffer, in bytes.
func (s shape) bytes(es int) int64 { return int64(max(s.sendCount, s.recvCount)) * int64(es) }
