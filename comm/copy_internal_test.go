package comm

import (
	"bytes"
	"testing"
)

// copyData must equal copy for every length around its chunk size and for
// overlapping slices in both directions (the partly in-place calls).
func TestCopyData(t *testing.T) {
	pattern := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + i>>8)
		}
		return b
	}
	for _, n := range []int{0, 1, 4095, copyChunk - 1, copyChunk, copyChunk + 1, 3*copyChunk + 17} {
		src := pattern(n)
		dst := make([]byte, n)
		if got := copyData(dst, src); got != n || !bytes.Equal(dst, src) {
			t.Errorf("n=%d: copied %d, equal=%v", n, got, bytes.Equal(dst, src))
		}
		short := make([]byte, n/2)
		if got := copyData(short, src); got != n/2 || !bytes.Equal(short, src[:n/2]) {
			t.Errorf("n=%d into %d bytes: copied %d", n, n/2, got)
		}
	}
	for _, shift := range []int{1, 4096, copyChunk + 3} {
		n := 3*copyChunk + 5
		for _, forward := range []bool{true, false} {
			buf := pattern(n + shift)
			want := append([]byte(nil), buf...)
			var dst, src []byte
			if forward {
				dst, src = buf[shift:], buf[:n]
			} else {
				dst, src = buf[:n], buf[shift:]
			}
			wdst, wsrc := want[len(want)-len(dst):], want
			if !forward {
				wdst, wsrc = want[:n], want[shift:]
			}
			copy(wdst, wsrc)
			copyData(dst, src)
			if !bytes.Equal(buf, want) {
				t.Errorf("overlap shift %d forward=%v: result differs from copy", shift, forward)
			}
		}
	}
}
