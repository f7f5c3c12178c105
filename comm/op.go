package comm

import "fmt"

// Op is a reduction operator.
type Op uint8

// The reductions every Communicator supports.
const (
	Sum Op = iota + 1
	Prod
	Min
	Max
	// Avg is Sum divided by the group size; integer types truncate.
	Avg
)

var opNames = [...]string{Sum: "sum", Prod: "prod", Min: "min", Max: "max", Avg: "avg"}

// Ops lists every supported Op, for tests and benchmarks.
var Ops = []Op{Sum, Prod, Min, Max, Avg}

// Valid reports whether o is one of the supported operators.
func (o Op) Valid() bool { return o >= Sum && o <= Avg }

func (o Op) String() string {
	if !o.Valid() {
		return fmt.Sprintf("op(%d)", uint8(o))
	}
	return opNames[o]
}

// ParseOp maps a name such as "sum" to its Op.
func ParseOp(s string) (Op, error) {
	for o, n := range opNames {
		if n != "" && n == s {
			return Op(o), nil
		}
	}
	return 0, fmt.Errorf("comm: unknown op %q", s)
}

// computeType is the type a reduction of dt runs in: float32 for the 16-bit
// floating types, dt itself otherwise.
func computeType(dt DType) DType {
	if dt.isHalf() {
		return Float32
	}
	return dt
}

type number interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~uint8
}

// reduceInto computes dst[i] = dst[i] op src[i] for the compute type dt (never a
// 16-bit float). dst holds the left operand: the contribution of lower ranks.
// Avg reduces as Sum; the division happens once at the end (finishAvg).
func reduceInto(op Op, dt DType, dst, src []byte) { reduce3(op, dt, dst, dst, src) }

// reduce3 computes dst[i] = a[i] op b[i] for the compute type dt, a being the
// left operand, so that an out-of-place reduction needs no copy of a into dst
// first. dst may be a or b itself, but must not partially overlap either.
func reduce3(op Op, dt DType, dst, a, b []byte) {
	switch dt {
	case Float32:
		d, x, y := castBytes[float32](dst), castBytes[float32](a), castBytes[float32](b)
		if op == Sum || op == Avg {
			sumFloat32(d, x, y)
			return
		}
		reduce3T(op, d, x, y)
	case Float64:
		d, x, y := castBytes[float64](dst), castBytes[float64](a), castBytes[float64](b)
		if op == Sum || op == Avg {
			sumFloat64(d, x, y)
			return
		}
		reduce3T(op, d, x, y)
	case Int32:
		reduce3T(op, castBytes[int32](dst), castBytes[int32](a), castBytes[int32](b))
	case Int64:
		reduce3T(op, castBytes[int64](dst), castBytes[int64](a), castBytes[int64](b))
	case Uint8:
		reduce3T(op, dst, a, b)
	}
}

// sumT is the portable d[i] = a[i] + b[i].
func sumT[T number](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	i := 0
	// Unrolled by hand through array pointers (one bounds check per 8
	// elements): the compiler does not vectorize, and per-element bounds
	// checks cost more than the adds. Each element is read before it is
	// written, so d may be a or b.
	for ; i+8 <= len(d); i += 8 {
		dd, aa, bb := (*[8]T)(d[i:i+8]), (*[8]T)(a[i:i+8]), (*[8]T)(b[i:i+8])
		dd[0] = aa[0] + bb[0]
		dd[1] = aa[1] + bb[1]
		dd[2] = aa[2] + bb[2]
		dd[3] = aa[3] + bb[3]
		dd[4] = aa[4] + bb[4]
		dd[5] = aa[5] + bb[5]
		dd[6] = aa[6] + bb[6]
		dd[7] = aa[7] + bb[7]
	}
	for ; i < len(d); i++ {
		d[i] = a[i] + b[i]
	}
}

func reduce3T[T number](op Op, d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	switch op {
	case Sum, Avg:
		sumT(d, a, b)
	case Prod:
		for i := range d {
			d[i] = a[i] * b[i]
		}
	case Min:
		// The builtin min propagates NaN and orders -0 below +0, so it is
		// commutative and every rank gets the same bits.
		for i := range d {
			d[i] = min(a[i], b[i])
		}
	case Max:
		for i := range d {
			d[i] = max(a[i], b[i])
		}
	}
}

// finishAvg divides every element of b (compute type dt) by n.
func finishAvg(dt DType, b []byte, n int) {
	switch dt {
	case Float32:
		f := float32(n)
		s := castBytes[float32](b)
		for i := range s {
			s[i] /= f
		}
	case Float64:
		f := float64(n)
		s := castBytes[float64](b)
		for i := range s {
			s[i] /= f
		}
	case Int32:
		s := castBytes[int32](b)
		for i := range s {
			s[i] /= int32(n)
		}
	case Int64:
		s := castBytes[int64](b)
		for i := range s {
			s[i] /= int64(n)
		}
	case Uint8:
		for i := range b {
			b[i] /= uint8(n)
		}
	}
}

// widen converts 16-bit floats in src (type dt) to float32 in dst.
func widen(dt DType, dst, src []byte) {
	d := castBytes[float32](dst)
	if dt == BFloat16 {
		for i, v := range castBytes[BFloat16Bits](src) {
			d[i] = v.Float32()
		}
		return
	}
	for i, v := range castBytes[Float16Bits](src) {
		d[i] = v.Float32()
	}
}

// narrow rounds float32 in src to the 16-bit type dt in dst.
func narrow(dt DType, dst, src []byte) {
	s := castBytes[float32](src)
	if dt == BFloat16 {
		d := castBytes[BFloat16Bits](dst)
		for i, v := range s {
			d[i] = BF16(v)
		}
		return
	}
	d := castBytes[Float16Bits](dst)
	for i, v := range s {
		d[i] = F16(v)
	}
}

// treeReduce reduces slots[0..n) into slots[0] along the documented fixed
// tree: at stride 1, 2, 4, ... slot i absorbs slot i+stride for every i that is
// a multiple of 2*stride. This is exactly "pairwise in rank order, odd one out
// moves up". Every slot has the same length.
func treeReduce(op Op, dt DType, slots [][]byte) {
	for stride := 1; stride < len(slots); stride *= 2 {
		for i := 0; i+stride < len(slots); i += 2 * stride {
			reduceInto(op, dt, slots[i], slots[i+stride])
		}
	}
}
