package comm

import "golang.org/x/sys/cpu"

// The float sums dominate all-reduce traffic, and the compiler does not
// vectorize; these kernels do 8 (4) lanes at a time with the same IEEE
// rounding per element as the scalar loop.

//go:noescape
func addF32x3AVX2(dst, a, b *float32, n int)

//go:noescape
func addF64x3AVX2(dst, a, b *float64, n int)

var haveAVX2 = cpu.X86.HasAVX2

// sumFloat32 computes d[i] = a[i] + b[i]; a and b are at least as long as
// d, and either may be d itself (not a partial overlap).
func sumFloat32(d, a, b []float32) {
	a, b = a[:len(d)], b[:len(d)]
	k := 0
	if haveAVX2 {
		if k = len(d) &^ 31; k > 0 {
			addF32x3AVX2(&d[0], &a[0], &b[0], k)
		}
	}
	sumT(d[k:], a[k:], b[k:])
}

func sumFloat64(d, a, b []float64) {
	a, b = a[:len(d)], b[:len(d)]
	k := 0
	if haveAVX2 {
		if k = len(d) &^ 15; k > 0 {
			addF64x3AVX2(&d[0], &a[0], &b[0], k)
		}
	}
	sumT(d[k:], a[k:], b[k:])
}
