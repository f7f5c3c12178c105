package buckets

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Op names a collective operation. The names are those of the JSON schema of
// stepgraph; stepgraph aliases this type so that the graph and the plan speak
// one vocabulary.
type Op string

// The collectives a plan can bucket.
const (
	AllReduce     Op = "all_reduce"
	AllGather     Op = "all_gather"
	ReduceScatter Op = "reduce_scatter"
	AllToAll      Op = "all_to_all"
	Broadcast     Op = "broadcast"
)

// Valid reports whether op is one of the known collectives.
func (op Op) Valid() bool {
	switch op {
	case AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast:
		return true
	}
	return false
}

// Direction is the phase of the training step a collective belongs to. The
// plan orders buckets by it: forward buckets come in forward block order,
// backward buckets in reverse block order (gradients of the last block are
// ready first), optimizer buckets last.
type Direction string

// The phases of a step. None is for collectives outside the three phases
// (e.g. a loss all-reduce for logging); they keep their issue order.
const (
	None      Direction = ""
	Forward   Direction = "forward"
	Backward  Direction = "backward"
	Optimizer Direction = "optimizer"
)

// Valid reports whether d is a known direction.
func (d Direction) Valid() bool {
	switch d {
	case None, Forward, Backward, Optimizer:
		return true
	}
	return false
}

// DTypeSize returns the size in bytes of one element of a data type named as
// in the JSON schema ("f32", "bf16", ...), or 0 for an unknown name.
func DTypeSize(dtype string) int64 {
	switch dtype {
	case "f64", "i64":
		return 8
	case "f32", "i32":
		return 4
	case "bf16", "f16":
		return 2
	case "u8":
		return 1
	}
	return 0
}

// Model is the latency–bandwidth (α–β) cost model of one collective: a fixed
// start-up cost plus the bytes each rank moves over the bus at the bus
// bandwidth that `gorun bench` reports (nccl-tests' busbw). It is deliberately
// this simple: bucketing decisions only need to know where latency stops
// dominating, and the two constants are exactly what a benchmark sweep
// measures.
type Model struct {
	// Latency is the time of a zero-byte collective (α). The default is the
	// 2-rank TCP loopback figure measured here for Open MPI (19 µs at 8 B),
	// rounded up: planning should not assume a faster fabric than measured.
	Latency time.Duration
	// BusBandwidth in bytes per second (1/β). The default, 1 GB/s, is the
	// TCP loopback busbw measured for Open MPI at ≥ 8 MiB.
	BusBandwidth float64
	// CopyBandwidth is the rate, in bytes per second, at which the
	// executor packs a member into a fused buffer and scatters its result
	// back out. Zero means members live in their bucket (views, DDP's
	// gradient_as_bucket_view) and merging copies nothing. When set, a
	// collective whose copies would cost more than the latency a merge
	// saves is left alone (MergePays): on a fast fabric with a
	// microsecond latency, packing a 40 KB gradient costs more than
	// issuing it on its own.
	CopyBandwidth float64
}

// DefaultModel is the model of TCP between hosts, from the anchors in
// DESIGN.md; use it when nothing was measured.
func DefaultModel() Model {
	return Model{Latency: 20 * time.Microsecond, BusBandwidth: 1e9}
}

// LocalModel is the model of ranks sharing one host over shared memory
// (Open MPI 4.7 GB/s at 2 MiB, a few µs of latency): small steps in tests and
// on laptops.
func LocalModel() Model {
	return Model{Latency: 2 * time.Microsecond, BusBandwidth: 4.7e9}
}

// ErrBadModel is returned by Model.Validate.
var ErrBadModel = errors.New("buckets: bad cost model")

// Validate reports a model that cannot produce times.
func (m Model) Validate() error {
	if m.Latency < 0 {
		return fmt.Errorf("%w: negative latency %v", ErrBadModel, m.Latency)
	}
	if !(m.BusBandwidth > 0) || math.IsInf(m.BusBandwidth, 0) {
		return fmt.Errorf("%w: bus bandwidth %v must be a positive finite number of bytes/s", ErrBadModel, m.BusBandwidth)
	}
	if c := m.CopyBandwidth; c < 0 || math.IsNaN(c) || math.IsInf(c, 0) {
		return fmt.Errorf("%w: copy bandwidth %v must be zero (views) or a positive finite number of bytes/s", ErrBadModel, c)
	}
	return nil
}

// MergePays reports whether a collective of op over ranks ranks with a
// per-rank input of bytes gains by joining a bucket: merging saves one
// latency (α) and costs packing its input into the fused buffer and
// scattering its output back, at CopyBandwidth. Always true when
// CopyBandwidth is zero (members are views, nothing is copied).
func (m Model) MergePays(op Op, bytes int64, ranks int) bool {
	if m.CopyBandwidth <= 0 {
		return true
	}
	out := bytes // all-reduce, broadcast, all-to-all: output as large as input
	switch op {
	case AllGather:
		out = bytes * int64(max(ranks, 1))
	case ReduceScatter:
		out = bytes / int64(max(ranks, 1))
	}
	copyTime := time.Duration(math.Round(float64(bytes+out) / m.CopyBandwidth * 1e9))
	return copyTime < m.Latency
}

// busBytes is how many bytes cross the bus per rank, following nccl-tests'
// busbw factors so that measured busbw plugs in unchanged. bytes is always
// the per-rank input (send) buffer, which is what a bucket's fused buffer
// holds: for all-gather that is the shard, and the data moved is the gathered
// output.
func busBytes(op Op, bytes int64, ranks int) float64 {
	n := float64(ranks)
	b := float64(bytes)
	switch op {
	case AllReduce:
		return b * 2 * (n - 1) / n
	case AllGather:
		return b * n * (n - 1) / n
	case ReduceScatter, AllToAll:
		return b * (n - 1) / n
	default: // broadcast
		return b
	}
}

// Time is the estimated duration of one collective of op over ranks ranks
// whose per-rank input is bytes long. A group of one rank moves nothing and
// costs nothing. The result is rounded to whole nanoseconds so that every
// rank, running the same binary, plans with identical integers.
func (m Model) Time(op Op, bytes int64, ranks int) time.Duration {
	if ranks <= 1 {
		return 0
	}
	return m.Latency + time.Duration(math.Round(busBytes(op, bytes, ranks)/m.BusBandwidth*1e9))
}

// EfficientBytes is the smallest bus payload for which the bandwidth part of
// a collective is at least eff (0 < eff < 1) of its time:
// (b/bw) / (α + b/bw) ≥ eff  ⇔  b ≥ α·bw·eff/(1−eff).
func (m Model) EfficientBytes(eff float64) int64 {
	if eff <= 0 {
		return 0
	}
	if eff >= 1 {
		eff = 0.999
	}
	return int64(math.Ceil(m.Latency.Seconds() * m.BusBandwidth * eff / (1 - eff)))
}

// MinBucketBytes is the size below which a collective is latency-bound
// (latency is at least half its time): buckets smaller than this are worth
// merging even when they are already hidden, because the comm stream they
// occupy delays the collectives queued behind them.
func (m Model) MinBucketBytes() int64 { return m.EfficientBytes(0.5) }

// CapBytes is the size beyond which growing a bucket buys less than 5% of
// bandwidth and only delays its start: the default bucket cap.
func (m Model) CapBytes() int64 { return m.EfficientBytes(0.95) }
