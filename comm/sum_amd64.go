package comm

import "golang.org/x/sys/cpu"

// The float sums dominate all-reduce traffic, and the compiler does not
// vectorize; these kernels do 8 (4) lanes at a time with the same IEEE
// rounding per element as the scalar loop.

//go:noescape
func addF32AVX2(dst, src *float32, n int)

//go:noescape
func addF64AVX2(dst, src *float64, n int)

var haveAVX2 = cpu.X86.HasAVX2

// addFloat32 adds src into dst over the longest prefix the vector kernel
// takes and returns how many elements it did.
func addFloat32(d, s []float32) int {
	n := len(d) &^ 31
	if !haveAVX2 || n == 0 || len(s) < n {
		return 0
	}
	addF32AVX2(&d[0], &s[0], n)
	return n
}

func addFloat64(d, s []float64) int {
	n := len(d) &^ 15
	if !haveAVX2 || n == 0 || len(s) < n {
		return 0
	}
	addF64AVX2(&d[0], &s[0], n)
	return n
}
