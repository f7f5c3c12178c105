package tailbuf

import (
	"strings"
	"sync"
	"testing"
)

// A Buffer keeps exactly the last Size bytes, trimmed, however they were
// split into writes.
func TestTail(t *testing.T) {
	var b Buffer
	if got := b.Tail(); got != "" {
		t.Fatalf("empty buffer's tail = %q", got)
	}
	head := strings.Repeat("h", 3*Size)
	end := strings.Repeat("e", Size-2) + "!\n"
	for _, part := range []string{head[:10], head[10:], end[:7], end[7:]} {
		if n, err := b.Write([]byte(part)); n != len(part) || err != nil {
			t.Fatalf("Write(%d bytes) = %d, %v", len(part), n, err)
		}
	}
	if got, want := b.Tail(), strings.TrimSpace(end); got != want {
		t.Fatalf("tail is %d bytes ending %q; want the last %d bytes written (%d, trimmed)", len(got), got[max(0, len(got)-8):], Size, len(want))
	}
	if _, err := b.Write([]byte(" short\n")); err != nil {
		t.Fatal(err)
	}
	if got := b.Tail(); len(got) != Size-1 || !strings.HasSuffix(got, "!\n short") {
		t.Fatalf("after a short write the tail is %d bytes ending %q; want %d ending %q", len(got), got[len(got)-8:], Size-1, "!\n short")
	}
}

// Writers and readers at once, as a command's stdout and stderr and the
// launcher reading the tail (run under -race).
func TestConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				b.Write([]byte("0123456789abcdef"))
				_ = b.Tail()
			}
		})
	}
	wg.Wait()
	if got := b.Tail(); len(got) != Size {
		t.Fatalf("tail is %d bytes, want %d", len(got), Size)
	}
}
