package comm

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"testing"
	"unsafe"
)

func BenchmarkReduceSumFloat32(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprint(n*4), func(b *testing.B) {
			d, s := make([]byte, n*4), make([]byte, n*4)
			b.SetBytes(int64(n * 4))
			for b.Loop() {
				reduceInto(Sum, Float32, d, s)
			}
		})
	}
}

func BenchmarkMemmove(b *testing.B) {
	d, s := make([]byte, 4<<20), make([]byte, 4<<20)
	b.SetBytes(4 << 20)
	for b.Loop() {
		copy(d, s)
	}
}

func TestHalfConversions(t *testing.T) {
	bf := []struct {
		f    float32
		bits uint16
	}{{1, 0x3f80}, {-2, 0xc000}, {0, 0}, {3.140625, 0x4049}, {1.00390625, 0x3f80} /* tie to even */, {1.01171875, 0x3f82}}
	for _, c := range bf {
		if got := BF16(c.f); uint16(got) != c.bits {
			t.Errorf("BF16(%v) = %#x, want %#x", c.f, uint16(got), c.bits)
		}
	}
	f16 := []struct {
		f    float32
		bits uint16
	}{{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {6.103515625e-05, 0x0400}, {5.960464477539063e-08, 0x0001}, {2.98e-08, 0}, {1.0009765625, 0x3c01}, {1.00048828125, 0x3c00}}
	for _, c := range f16 {
		if got := F16(c.f); uint16(got) != c.bits {
			t.Errorf("F16(%v) = %#x, want %#x", c.f, uint16(got), c.bits)
		}
	}
	// Every binary16 value survives a round trip through float32.
	for h := range 1 << 16 {
		v := Float16Bits(h)
		f := v.Float32()
		if f != f { // NaN
			continue
		}
		if back := F16(f); back != v {
			t.Fatalf("F16(%v) = %#x, want %#x", f, uint16(back), h)
		}
	}
	for h := range 1 << 16 {
		v := BFloat16Bits(h)
		if f := v.Float32(); f == f && BF16(f) != v {
			t.Fatalf("BF16 round trip of %#x", h)
		}
	}
}

// treeReduce sums in the documented pairwise order for every group size.
// Float32 addition is not associative, so each order of the same values
// gives other bits: treeReduce itself runs on values chosen so that the
// documented tree and a plain left fold differ, and its result must be the
// tree's bit for bit.
func TestTreeReduceOrder(t *testing.T) {
	want := map[int]string{1: "0", 2: "(0+1)", 3: "((0+1)+2)", 4: "((0+1)+(2+3))", 5: "(((0+1)+(2+3))+4)",
		7: "(((0+1)+(2+3))+((4+5)+6))", 8: "(((0+1)+(2+3))+((4+5)+(6+7)))"}
	for n, expr := range want {
		// One float32 per slot and per trial; trials differ in their
		// values so that, for n ≥ 4, some trial tells the tree from a left
		// fold (for n ≤ 3 they are the same order).
		const trials = 64
		vals := make([][]float32, n)
		slots := make([][]byte, n)
		for r := range n {
			vals[r] = make([]float32, trials)
			for k := range trials {
				vals[r][k] = float32(math.Ldexp(1+float64((r*37+k*11)%97)/97, (r*7+k*3)%23-11)) * float32(1-2*((r+k)%2))
			}
			slots[r] = Float32s(append([]float32(nil), vals[r]...)).(hostBuffer).b
		}
		treeReduce(Sum, Float32, slots)
		got := castBytes[float32](slots[0])
		foldDiffers := false
		for k := range trials {
			pos := 0
			tree := evalSumTree(expr, &pos, func(r int) float32 { return vals[r][k] })
			fold := vals[0][k]
			for r := 1; r < n; r++ {
				fold += vals[r][k]
			}
			foldDiffers = foldDiffers || math.Float32bits(fold) != math.Float32bits(tree)
			if math.Float32bits(got[k]) != math.Float32bits(tree) {
				t.Errorf("n=%d trial %d: treeReduce gives %v, the tree %s gives %v (left fold %v)", n, k, got[k], expr, tree, fold)
			}
		}
		if n >= 4 && !foldDiffers {
			t.Errorf("n=%d: no trial tells the tree from a left fold; the check proves nothing", n)
		}
	}
}

// evalSumTree evaluates a parenthesized sum of slot numbers like
// "((0+1)+2)" in float32, in exactly the order it is written.
func evalSumTree(expr string, pos *int, val func(int) float32) float32 {
	if expr[*pos] == '(' {
		*pos++
		a := evalSumTree(expr, pos, val)
		*pos++ // '+'
		b := evalSumTree(expr, pos, val)
		*pos++ // ')'
		return a + b
	}
	start := *pos
	for *pos < len(expr) && expr[*pos] >= '0' && expr[*pos] <= '9' {
		*pos++
	}
	r, _ := strconv.Atoi(expr[start:*pos])
	return val(r)
}

// The vector sums give bitwise the results of the portable loop, for every
// length (vector body plus scalar tail) and for awkward values.
func TestVectorSumMatchesScalar(t *testing.T) {
	vals32 := []float32{1, -1, 0.1, 3e38, -3e38, 1e-45, float32(math.Inf(1)), float32(math.NaN()), -0.0, 0.3333333}
	vals64 := []float64{1, -1, 0.1, 1e308, -1e308, 5e-324, math.Inf(-1), math.NaN(), -0.0, 1.0 / 3}
	for n := range 200 {
		d, s := make([]float32, n), make([]float32, n)
		d2, s2 := make([]float64, n), make([]float64, n)
		for i := range n {
			d[i], s[i] = vals32[i%len(vals32)]*float32(i+1), vals32[(i*7)%len(vals32)]
			d2[i], s2[i] = vals64[i%len(vals64)]*float64(i+1), vals64[(i*3)%len(vals64)]
		}
		want, want2 := append([]float32(nil), d...), append([]float64(nil), d2...)
		reduce3T(Sum, want, want, s)
		reduce3T(Sum, want2, want2, s2)
		reduceInto(Sum, Float32, Float32s(d).(hostBuffer).b, Float32s(s).(hostBuffer).b)
		reduceInto(Sum, Float64, Float64s(d2).(hostBuffer).b, Float64s(s2).(hostBuffer).b)
		for i := range n {
			if math.Float32bits(d[i]) != math.Float32bits(want[i]) || math.Float64bits(d2[i]) != math.Float64bits(want2[i]) {
				t.Fatalf("n=%d i=%d: %v/%v vs %v/%v", n, i, d[i], d2[i], want[i], want2[i])
			}
		}
	}
}

// kernelLengths straddle the vector widths (16 and 32 elements, 128 bytes)
// and the unrolled loop.
var kernelLengths = []int{0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 1000, 4099}

// checkReduce3 compares reduce3 with a per-element scalar reference for one
// type, every op, at every length and at element offsets that misalign the
// operands, and with dst aliasing a or b.
func checkReduce3[T number](t *testing.T, dt DType, val func(i int) T) {
	es := dt.Size()
	asBytes := func(s []T) []byte {
		if len(s) == 0 {
			return []byte{}
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*es)
	}
	ref := func(op Op, x, y T) T {
		switch op {
		case Prod:
			return x * y
		case Min:
			return min(x, y)
		case Max:
			return max(x, y)
		}
		return x + y
	}
	for _, op := range Ops {
		for _, n := range kernelLengths {
			for _, skew := range []int{0, 1, 3, 5} {
				for _, alias := range []string{"none", "a", "b"} {
					// Three arrays with distinct skews so that no two
					// operands share an alignment.
					da := make([]T, n+skew+8)[skew : skew+n]
					xa := make([]T, n+8)[(skew+1)%4 : (skew+1)%4+n]
					ya := make([]T, n+8)[(skew+2)%4 : (skew+2)%4+n]
					for i := range n {
						xa[i], ya[i], da[i] = val(i), val(3*i+1), val(7*i+2)
					}
					want := make([]T, n)
					for i := range n {
						want[i] = ref(op, xa[i], ya[i])
					}
					d := da
					switch alias {
					case "a":
						copy(da, xa)
						xa = da
					case "b":
						copy(da, ya)
						ya = da
					}
					reduce3(op, dt, asBytes(d), asBytes(xa), asBytes(ya))
					if !bytes.Equal(asBytes(d), asBytes(want)) {
						t.Fatalf("%v %v n=%d skew=%d alias=%s: got %v, want %v", dt, op, n, skew, alias, d, want)
					}
				}
			}
		}
	}
}

// reduce3 (the vector kernels included) gives the bits of the
// portable per-element loop for every type, op, length, alignment and
// allowed aliasing.
func TestReduce3MatchesScalar(t *testing.T) {
	f32 := []float32{1, -1, 0.1, 3e38, -3e38, 1e-45, float32(math.Inf(1)), float32(math.NaN()), -0.0, 0.3333333, 7}
	f64 := []float64{1, -1, 0.1, 1e308, -1e308, 5e-324, math.Inf(-1), math.NaN(), -0.0, 1.0 / 3, 7}
	checkReduce3(t, Float32, func(i int) float32 { return f32[i%len(f32)] * float32(i%5+1) })
	checkReduce3(t, Float64, func(i int) float64 { return f64[i%len(f64)] * float64(i%5+1) })
	checkReduce3(t, Int32, func(i int) int32 { return int32(i*2654435761) ^ int32(i) })
	checkReduce3(t, Int64, func(i int) int64 { return int64(i) * -6364136223846793005 })
	checkReduce3(t, Uint8, func(i int) uint8 { return uint8(i*37 + 11) })

	// Byte buffers (comm.Bytes) need not align their elements: the vector
	// kernels load and store unaligned.
	for _, dt := range []DType{Float32, Float64} {
		for _, off := range []int{1, 2, 3, 5} {
			for _, n := range []int{33, 129, 1000} {
				bytesOf := func(seed int) []byte {
					b := make([]byte, n*dt.Size()+off)[off:]
					for i := range n {
						if dt == Float32 {
							castBytes[float32](b)[i] = float32(i*seed%17) - 8.5
						} else {
							castBytes[float64](b)[i] = float64(i*seed%17) - 8.5
						}
					}
					return b
				}
				d, a, b := bytesOf(1), bytesOf(3), bytesOf(7)
				want := make([]byte, len(d))
				copy(want, a)
				if dt == Float32 {
					sumT(castBytes[float32](want), castBytes[float32](a), castBytes[float32](b))
				} else {
					sumT(castBytes[float64](want), castBytes[float64](a), castBytes[float64](b))
				}
				reduce3(Sum, dt, d, a, b)
				if !bytes.Equal(d, want) {
					t.Fatalf("%v off=%d n=%d: unaligned sum differs", dt, off, n)
				}
			}
		}
	}
}
