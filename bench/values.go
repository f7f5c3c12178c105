package bench

import (
	"math"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
)

// The check values. Every input element is a small integer chosen by a hash
// of (seed, rank, index), so that every partial result of any reduction
// order is exact in every element type and the expected output can be
// computed locally and compared with ==, as nccl-tests does with its
// integer-valued float inputs.
//
//	sum, avg:       [-4, 4] ([0, 4] for uint8): |partial sums| ≤ 4n, exact
//	                in bfloat16 (8 significant bits) up to 64 ranks, in
//	                float32 up to millions
//	prod:           1 or -1 everywhere except one rank per index, which
//	                contributes 2 or 3: the product is ±1, ±2 or ±3
//	min, max, data: [-64, 64] ([0, 128] for uint8)

// valueGen produces the input of rank r at index j.
type valueGen struct {
	seed    uint64
	n       int // ranks
	op      comm.Op
	reduces bool
	signed  bool
}

func newValueGen(cfg *Config, n int) valueGen {
	return valueGen{seed: cfg.Seed, n: n, op: cfg.RedOp, reduces: cfg.Op.Reduces(), signed: cfg.DType != comm.Uint8}
}

// mix is splitmix64's finalizer: cheap, and every input bit affects every
// output bit, so neighbouring ranks and indices get unrelated values.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func (g valueGen) hash(r, j int) uint64 {
	return mix(g.seed*0x9e3779b97f4a7c15 ^ mix(uint64(r)+1)<<1 ^ uint64(j)*0xd1b54a32d192ed03)
}

// at is the input value of rank r at index j.
func (g valueGen) at(r, j int) float64 {
	h := g.hash(r, j)
	if !g.reduces {
		return g.wide(h)
	}
	switch g.op {
	case comm.Sum, comm.Avg:
		if g.signed {
			return float64(h%9) - 4
		}
		return float64(h % 5)
	case comm.Prod:
		// One rank per index holds the large factor; the others hold ±1.
		if special := int(mix(g.seed^uint64(j)) % uint64(g.n)); special == r {
			return float64(2 + h%2)
		}
		if g.signed && h&4 != 0 {
			return -1
		}
		return 1
	}
	return g.wide(h)
}

func (g valueGen) wide(h uint64) float64 {
	if g.signed {
		return float64(h%129) - 64
	}
	return float64(h % 129)
}

// reduced is the exact result of the reduction at index j over all ranks,
// in the element type's arithmetic: integer sums wrap, averages divide the
// (wrapped) sum and truncate for integers, and 16-bit floats reduce in
// float32 and round once, as comm documents.
func (g valueGen) reduced(dt comm.DType, j int) float64 {
	acc := g.at(0, j)
	for r := 1; r < g.n; r++ {
		v := g.at(r, j)
		switch g.op {
		case comm.Sum, comm.Avg:
			acc += v
		case comm.Prod:
			acc *= v
		case comm.Min:
			acc = math.Min(acc, v)
		case comm.Max:
			acc = math.Max(acc, v)
		}
	}
	if g.op != comm.Avg {
		return quantize(dt, acc)
	}
	n := g.n
	switch dt {
	case comm.Float64:
		return acc / float64(n)
	case comm.Int32:
		return float64(int32(int64(acc)) / int32(n))
	case comm.Int64:
		return float64(int64(acc) / int64(n))
	case comm.Uint8:
		return float64(uint8(int64(acc)) / uint8(n))
	}
	return quantize(dt, float64(float32(acc)/float32(n)))
}

// quantize converts x to dt and back, wrapping integers as a conversion in
// Go (and in the reduction's arithmetic) does.
func quantize(dt comm.DType, x float64) float64 {
	switch dt {
	case comm.Float32:
		return float64(float32(x))
	case comm.BFloat16:
		return float64(comm.BF16(float32(x)).Float32())
	case comm.Float16:
		return float64(comm.F16(float32(x)).Float32())
	case comm.Int32:
		return float64(int32(int64(x)))
	case comm.Int64:
		return float64(int64(x))
	case comm.Uint8:
		return float64(uint8(int64(x)))
	}
	return x
}

// elems reads and writes elements of one type in raw host memory. Buffers
// come from alignedBytes, so every view is aligned for its type.
type elems struct {
	get func(b []byte, j int) float64
	set func(b []byte, j int, v float64)
}

func view[T any](b []byte) []T {
	var z T
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

func elemsOf(dt comm.DType) elems {
	switch dt {
	case comm.Float32:
		return elems{
			get: func(b []byte, j int) float64 { return float64(view[float32](b)[j]) },
			set: func(b []byte, j int, v float64) { view[float32](b)[j] = float32(v) },
		}
	case comm.Float64:
		return elems{
			get: func(b []byte, j int) float64 { return view[float64](b)[j] },
			set: func(b []byte, j int, v float64) { view[float64](b)[j] = v },
		}
	case comm.BFloat16:
		return elems{
			get: func(b []byte, j int) float64 { return float64(view[comm.BFloat16Bits](b)[j].Float32()) },
			set: func(b []byte, j int, v float64) { view[comm.BFloat16Bits](b)[j] = comm.BF16(float32(v)) },
		}
	case comm.Float16:
		return elems{
			get: func(b []byte, j int) float64 { return float64(view[comm.Float16Bits](b)[j].Float32()) },
			set: func(b []byte, j int, v float64) { view[comm.Float16Bits](b)[j] = comm.F16(float32(v)) },
		}
	case comm.Int32:
		return elems{
			get: func(b []byte, j int) float64 { return float64(view[int32](b)[j]) },
			set: func(b []byte, j int, v float64) { view[int32](b)[j] = int32(v) },
		}
	case comm.Int64:
		return elems{
			get: func(b []byte, j int) float64 { return float64(view[int64](b)[j]) },
			set: func(b []byte, j int, v float64) { view[int64](b)[j] = int64(v) },
		}
	}
	return elems{
		get: func(b []byte, j int) float64 { return float64(b[j]) },
		set: func(b []byte, j int, v float64) { b[j] = uint8(v) },
	}
}

// alignedBytes allocates n bytes aligned for any element type (a []uint64
// backing array), so typed views of it are valid.
func alignedBytes(n int64) []byte {
	if n == 0 {
		return nil
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), n)
}

// sentinelByte fills output buffers before a checked call, so an element
// the collective never wrote is caught. For floats 0x5a5a... is far outside
// the input range; for integer types it can equal an expected value (90),
// which only hides an unwritten element at those indices.
const sentinelByte = 0x5a
