package commtest

import (
	"encoding/binary"
	"math"

	"github.com/gorun-hpc/gorun/comm"
)

// The reference implementation: one element at a time, from the documented
// definitions, with none of comm's chunking, scratch or algorithms. Inputs
// and outputs are raw little-endian bytes of the given dtype, one slice per
// rank.

// value is one element in its compute type: float32 for the 16-bit floats.
type value struct {
	f float64 // float32 and float64 (float32 values are kept exact)
	i int64   // int32, int64, uint8
}

func load(dt comm.DType, b []byte, i int) value {
	switch dt {
	case comm.Float32:
		return value{f: float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))}
	case comm.Float64:
		return value{f: math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))}
	case comm.BFloat16:
		return value{f: float64(comm.BFloat16Bits(binary.LittleEndian.Uint16(b[2*i:])).Float32())}
	case comm.Float16:
		return value{f: float64(comm.Float16Bits(binary.LittleEndian.Uint16(b[2*i:])).Float32())}
	case comm.Int32:
		return value{i: int64(int32(binary.LittleEndian.Uint32(b[4*i:])))}
	case comm.Int64:
		return value{i: int64(binary.LittleEndian.Uint64(b[8*i:]))}
	default:
		return value{i: int64(b[i])}
	}
}

func store(dt comm.DType, b []byte, i int, v value) {
	switch dt {
	case comm.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v.f)))
	case comm.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v.f))
	case comm.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(comm.BF16(float32(v.f))))
	case comm.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(comm.F16(float32(v.f))))
	case comm.Int32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v.i)))
	case comm.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v.i))
	default:
		b[i] = uint8(v.i)
	}
}

// combine computes a op b in the compute type of dt, rounding as that type
// does (float32 arithmetic for float32 and the 16-bit floats; wrap-around for
// integers).
func combine(op comm.Op, dt comm.DType, a, b value) value {
	isF32 := dt == comm.Float32 || dt == comm.BFloat16 || dt == comm.Float16
	switch dt {
	case comm.Float32, comm.Float64, comm.BFloat16, comm.Float16:
		var r float64
		switch op {
		case comm.Sum, comm.Avg:
			if isF32 {
				r = float64(float32(a.f) + float32(b.f))
			} else {
				r = a.f + b.f
			}
		case comm.Prod:
			if isF32 {
				r = float64(float32(a.f) * float32(b.f))
			} else {
				r = a.f * b.f
			}
		case comm.Min:
			r = min(a.f, b.f)
		case comm.Max:
			r = max(a.f, b.f)
		}
		return value{f: r}
	}
	var r int64
	switch op {
	case comm.Sum, comm.Avg:
		r = a.i + b.i
	case comm.Prod:
		r = a.i * b.i
	case comm.Min:
		r = min(a.i, b.i)
	case comm.Max:
		r = max(a.i, b.i)
	}
	switch dt {
	case comm.Int32:
		r = int64(int32(r))
	case comm.Uint8:
		r = int64(uint8(r))
	}
	return value{i: r}
}

// pairwiseTree reduces vals in the documented deterministic order: neighbours
// (0,1), (2,3), ... combine with the lower rank on the left, an odd one out
// moves up unchanged, until one value is left.
// It works in place: vals is clobbered.
func pairwiseTree(op comm.Op, dt comm.DType, vals []value) value {
	for len(vals) > 1 {
		k := 0
		for i := 0; i < len(vals); i += 2 {
			if i+1 < len(vals) {
				vals[k] = combine(op, dt, vals[i], vals[i+1])
			} else {
				vals[k] = vals[i]
			}
			k++
		}
		vals = vals[:k]
	}
	return vals[0]
}

func finishAvg(dt comm.DType, v value, n int) value {
	switch dt {
	case comm.Float32, comm.BFloat16, comm.Float16:
		return value{f: float64(float32(v.f) / float32(n))}
	case comm.Float64:
		return value{f: v.f / float64(n)}
	case comm.Uint8:
		return value{i: int64(uint8(v.i) / uint8(n))}
	}
	return value{i: v.i / int64(n)}
}

// AllReduce returns op over the inputs along the pairwise tree. For inputs
// whose reduction is exact (small integers), every order gives this result.
func AllReduce(op comm.Op, dt comm.DType, inputs [][]byte) []byte {
	n := len(inputs[0]) / dt.Size()
	out := make([]byte, len(inputs[0]))
	vals := make([]value, len(inputs))
	for i := range n {
		for r, in := range inputs {
			vals[r] = load(dt, in, i)
		}
		v := pairwiseTree(op, dt, vals)
		if op == comm.Avg {
			v = finishAvg(dt, v, len(inputs))
		}
		store(dt, out, i, v)
	}
	return out
}

// ReduceScatter returns block rank of AllReduce.
func ReduceScatter(op comm.Op, dt comm.DType, inputs [][]byte, rank int) []byte {
	all := AllReduce(op, dt, inputs)
	l := len(all) / len(inputs)
	return all[rank*l : (rank+1)*l]
}

// AllGather returns the concatenation of the inputs in rank order.
func AllGather(inputs [][]byte) []byte {
	var out []byte
	for _, in := range inputs {
		out = append(out, in...)
	}
	return out
}

// AllToAllV returns what rank receives when rank p sends
// counts[p][q] elements (consecutive, in rank order) to each q.
func AllToAllV(dt comm.DType, inputs [][]byte, counts [][]int, rank int) []byte {
	es := dt.Size()
	var out []byte
	for p, in := range inputs {
		off := 0
		for q := range rank {
			off += counts[p][q]
		}
		out = append(out, in[off*es:(off+counts[p][rank])*es]...)
	}
	return out
}

// Encode returns vals as little-endian elements of dt (integers truncate).
func Encode(dt comm.DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case comm.Int32, comm.Int64, comm.Uint8:
			store(dt, b, i, value{i: int64(v)})
		default:
			store(dt, b, i, value{f: v})
		}
	}
	return b
}
