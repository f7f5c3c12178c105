#include "textflag.h"

// The kernels do 128 bytes (four YMM registers) per iteration; the Go
// wrappers in sum_amd64.go handle tails. VADDPS/VADDPD round each lane
// exactly as the scalar ADDSS/ADDSD the Go compiler emits, and the left
// operand a is the first source, so results are bitwise the same as the
// portable loop.

// ADD3 is the body both kernels share: dst (DI) = a (SI) + b (DX) for CX
// elements, 128 bytes (PER elements) at a time, with MOVU to load and
// store and VADD to add; CX is a multiple of PER.
#define ADD3(MOVU, VADD, PER, loop, done) \
	MOVQ dst+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ n+24(FP), CX; \
loop: \
	CMPQ CX, $0; \
	JLE  done; \
	MOVU 0(SI), Y0; \
	MOVU 32(SI), Y1; \
	MOVU 64(SI), Y2; \
	MOVU 96(SI), Y3; \
	VADD 0(DX), Y0, Y0; \
	VADD 32(DX), Y1, Y1; \
	VADD 64(DX), Y2, Y2; \
	VADD 96(DX), Y3, Y3; \
	MOVU Y0, 0(DI); \
	MOVU Y1, 32(DI); \
	MOVU Y2, 64(DI); \
	MOVU Y3, 96(DI); \
	ADDQ $128, DI; \
	ADDQ $128, SI; \
	ADDQ $128, DX; \
	SUBQ $PER, CX; \
	JMP  loop; \
done: \
	VZEROUPPER; \
	RET

// func addF32x3AVX2(dst, a, b *float32, n int)
// dst[i] = a[i] + b[i] for i < n; n is a multiple of 32. dst may be a or b.
TEXT ·addF32x3AVX2(SB), NOSPLIT, $0-32
	ADD3(VMOVUPS, VADDPS, 32, f32loop, f32done)

// func addF64x3AVX2(dst, a, b *float64, n int)
// Same for float64; n is a multiple of 16.
TEXT ·addF64x3AVX2(SB), NOSPLIT, $0-32
	ADD3(VMOVUPD, VADDPD, 16, f64loop, f64done)
