#include "textflag.h"

// The kernels do 128 bytes (four YMM registers) per iteration; the Go
// wrappers in sum_amd64.go handle tails. VADDPS/VADDPD round each lane
// exactly as the scalar ADDSS/ADDSD the Go compiler emits, and the left
// operand a is the first source, so results are bitwise the same as the
// portable loop.

// func addF32x3AVX2(dst, a, b *float32, n int)
// dst[i] = a[i] + b[i] for i < n; n is a multiple of 32. dst may be a or b.
TEXT ·addF32x3AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
f32loop:
	CMPQ CX, $0
	JLE  f32done
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  0(DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	ADDQ $128, DX
	SUBQ $32, CX
	JMP  f32loop
f32done:
	VZEROUPPER
	RET

// func addF64x3AVX2(dst, a, b *float64, n int)
// Same for float64; n is a multiple of 16.
TEXT ·addF64x3AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
f64loop:
	CMPQ CX, $0
	JLE  f64done
	VMOVUPD 0(SI), Y0
	VMOVUPD 32(SI), Y1
	VMOVUPD 64(SI), Y2
	VMOVUPD 96(SI), Y3
	VADDPD  0(DX), Y0, Y0
	VADDPD  32(DX), Y1, Y1
	VADDPD  64(DX), Y2, Y2
	VADDPD  96(DX), Y3, Y3
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	ADDQ $128, DX
	SUBQ $16, CX
	JMP  f64loop
f64done:
	VZEROUPPER
	RET
