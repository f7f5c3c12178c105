package comm

import (
	"fmt"
	"math"
)

// DType is the element type of a Buffer.
type DType uint8

// The element types every Communicator supports.
const (
	Float32 DType = iota + 1
	Float64
	BFloat16
	Float16
	Int32
	Int64
	Uint8
)

var dtypeNames = [...]string{
	Float32: "float32", Float64: "float64", BFloat16: "bfloat16",
	Float16: "float16", Int32: "int32", Int64: "int64", Uint8: "uint8",
}

var dtypeSizes = [...]int{
	Float32: 4, Float64: 8, BFloat16: 2, Float16: 2, Int32: 4, Int64: 8, Uint8: 1,
}

// DTypes lists every supported DType, for tests and benchmarks.
var DTypes = []DType{Float32, Float64, BFloat16, Float16, Int32, Int64, Uint8}

// Valid reports whether d is one of the supported types.
func (d DType) Valid() bool { return d >= Float32 && d <= Uint8 }

// Size is the number of bytes of one element, 0 for an invalid type.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeSizes[d]
}

func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeNames[d]
}

// ParseDType maps a name such as "float32" (or "bf16", "fp16") to its DType.
func ParseDType(s string) (DType, error) {
	switch s {
	case "float", "fp32":
		return Float32, nil
	case "double", "fp64":
		return Float64, nil
	case "bf16":
		return BFloat16, nil
	case "half", "fp16":
		return Float16, nil
	case "int":
		return Int32, nil
	case "byte", "u8":
		return Uint8, nil
	}
	for d, n := range dtypeNames {
		if n != "" && n == s {
			return DType(d), nil
		}
	}
	return 0, fmt.Errorf("comm: unknown dtype %q", s)
}

// isHalf reports whether reductions of d run widened to float32.
func (d DType) isHalf() bool { return d == BFloat16 || d == Float16 }

// BFloat16Bits is one bfloat16 value: the upper 16 bits of a float32.
type BFloat16Bits uint16

// Float16Bits is one IEEE 754 binary16 value.
type Float16Bits uint16

// BF16 rounds f to the nearest bfloat16 (ties to even); NaN stays NaN.
func BF16(f float32) BFloat16Bits {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return BFloat16Bits(b>>16 | 0x40) // quiet NaN, sign kept
	}
	b += 0x7fff + (b>>16)&1
	return BFloat16Bits(b >> 16)
}

// Float32 widens b exactly.
func (b BFloat16Bits) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// F16 rounds f to the nearest binary16 (ties to even), saturating to ±Inf.
func F16(f float32) Float16Bits {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return Float16Bits(sign | 0x7e00)
		}
		return Float16Bits(sign | 0x7c00)
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return Float16Bits(sign | 0x7c00)
	}
	if e <= 0 {
		if e < -10 {
			return Float16Bits(sign)
		}
		mant |= 0x800000
		shift := uint(14 - e)
		h := mant >> shift
		rem := mant & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return Float16Bits(sign | uint16(h))
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is the correct rounding, up to Inf
	}
	return Float16Bits(sign | uint16(h))
}

// Float32 widens h exactly.
func (h Float16Bits) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		e := uint32(113)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	default:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	}
}
