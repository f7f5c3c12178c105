package comm

import (
	"fmt"
	"testing"
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

// The fixed tree is the documented pairwise order for every group size.
func TestTreeReduceOrder(t *testing.T) {
	want := map[int]string{1: "0", 2: "(0+1)", 3: "((0+1)+2)", 4: "((0+1)+(2+3))", 5: "(((0+1)+(2+3))+4)", 7: "(((0+1)+(2+3))+((4+5)+6))"}
	for n, w := range want {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(i)
		}
		for stride := 1; stride < n; stride *= 2 { // mirrors treeReduce
			for i := 0; i+stride < n; i += 2 * stride {
				s[i] = "(" + s[i] + "+" + s[i+stride] + ")"
			}
		}
		if s[0] != w {
			t.Errorf("n=%d: %s, want %s", n, s[0], w)
		}
	}
}
