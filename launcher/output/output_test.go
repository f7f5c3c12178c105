package output

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

func TestStreamer(t *testing.T) {
	long := strings.Repeat("y", maxLine+10)
	tests := []struct {
		name string
		in   io.Reader
		tag  bool
		want string
	}{
		{name: "plain", in: strings.NewReader("a\nb\n"), want: "a\nb\n"},
		{name: "tagged", in: strings.NewReader("a\nb\n"), tag: true, want: "[7] a\n[7] b\n"},
		{name: "final partial line", in: strings.NewReader("a\nb"), tag: true, want: "[7] a\n[7] b\n"},
		{name: "one byte at a time", in: iotest.OneByteReader(strings.NewReader("ab\ncd\n")), tag: true, want: "[7] ab\n[7] cd\n"},
		{name: "empty lines", in: strings.NewReader("\n\n"), tag: true, want: "[7] \n[7] \n"},
		{name: "nothing", in: strings.NewReader(""), tag: true, want: ""},
		{name: "read error ends the stream", in: iotest.TimeoutReader(strings.NewReader("a\nb")), want: "a\nb\n"},
		{name: "a line beyond maxLine stays whole", in: strings.NewReader(long + "\n"), tag: true, want: "[7] " + long + "\n"},
		{name: "a final line beyond maxLine", in: strings.NewReader(long), want: long + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			s := &streamer{rank: 7, r: tc.in, term: &Sink{w: &out}, tag: tc.tag}
			s.run()
			if got := out.String(); got != tc.want {
				if len(got) > 100 || len(tc.want) > 100 {
					t.Fatalf("got %d bytes (%d newlines), want %d (%d)", len(got), strings.Count(got, "\n"), len(tc.want), strings.Count(tc.want, "\n"))
				}
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Lines longer than maxLine are never split, however they arrive and
// whatever other ranks print meanwhile: rank 1 writes three 3 MiB lines in
// 64 KiB pieces while rank 2 prints 2000 short lines; every line on the
// terminal is one rank's, whole.
func TestLongLinesStayWhole(t *testing.T) {
	var out bytes.Buffer
	term := &Sink{w: &out}
	long := strings.Repeat("y", 3<<20)
	r1, w1 := io.Pipe()
	r2, w2 := io.Pipe()
	var wg sync.WaitGroup
	for i, r := range []io.Reader{r1, r2} {
		s := &streamer{rank: i + 1, r: r, term: term, tag: true}
		wg.Go(s.run)
	}
	wg.Go(func() {
		for range 3 {
			b := []byte(long + "\n")
			for len(b) > 0 {
				n := min(len(b), 64<<10)
				_, _ = w1.Write(b[:n])
				b = b[n:]
			}
		}
		w1.Close()
	})
	wg.Go(func() {
		for i := range 2000 {
			fmt.Fprintf(w2, "short %d\n", i)
		}
		w2.Close()
	})
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	longs, shorts := 0, 0
	for _, l := range lines {
		switch {
		case l == "[1] "+long:
			longs++
		case strings.HasPrefix(l, "[2] short ") && len(l) < 20:
			shorts++
		default:
			t.Fatalf("a line that is neither rank's whole line: %d bytes, %.40q...", len(l), l)
		}
	}
	if longs != 3 || shorts != 2000 {
		t.Errorf("%d whole long lines and %d short ones, want 3 and 2000", longs, shorts)
	}
}

// A rank that goes quiet in the middle of a long line holds the others
// back for holdStall at most: rank 2's line appears within about a second,
// rank 1's line is ended for it, and rank 1's rest starts a tagged line.
func TestLongLineStallLetsOthersThrough(t *testing.T) {
	var mu sync.Mutex
	var out bytes.Buffer
	term := &Sink{w: writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })}
	r1, w1 := io.Pipe()
	r2, w2 := io.Pipe()
	var wg sync.WaitGroup
	for i, r := range []io.Reader{r1, r2} {
		s := &streamer{rank: i + 1, r: r, term: term, tag: true}
		wg.Go(s.run)
	}
	long := strings.Repeat("y", maxLine+100)
	_, _ = w1.Write([]byte(long)) // then silence, pipe open
	start := time.Now()
	_, _ = w2.Write([]byte("short\n"))
	for {
		mu.Lock()
		got := strings.Contains(out.String(), "[2] short\n")
		mu.Unlock()
		if got {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("rank 2's line is still held back 5 s after rank 1 went quiet mid-line")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waited := time.Since(start)
	_, _ = w1.Write([]byte("tail\n"))
	w1.Close()
	w2.Close()
	wg.Wait()
	// What rank 1 had sent when it went quiet was written; the rest of
	// its line follows under its own tag.
	got := out.String()
	m := regexp.MustCompile(`^\[1\] (y+)\n\[2\] short\n\[1\] (y*)tail\n$`).FindStringSubmatch(got)
	if m == nil || len(m[1]) < maxLine || len(m[1])+len(m[2]) != len(long) {
		t.Errorf("got %d bytes: %.30q ... %q", len(got), got, got[max(0, len(got)-40):])
	}
	t.Logf("rank 2's line waited %v", waited)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Every write to the terminal carries whole lines only, so two ranks'
// bytes can never share a line.
func TestStreamerWritesWholeLines(t *testing.T) {
	w := &lineCheckWriter{t: t}
	s := &streamer{rank: 1, r: iotest.HalfReader(strings.NewReader(strings.Repeat("abc\ndefgh\n", 1000) + "tail")), term: &Sink{w: w}, tag: true}
	s.run()
	if w.lines != 2001 {
		t.Fatalf("%d lines, want 2001", w.lines)
	}
}

type lineCheckWriter struct {
	t     *testing.T
	lines int
}

func (w *lineCheckWriter) Write(p []byte) (int, error) {
	if len(p) == 0 || p[len(p)-1] != '\n' || !bytes.HasPrefix(p, []byte("[1] ")) {
		w.t.Fatalf("write of a partial line: %q", p)
	}
	w.lines += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

func TestStreamerTimestampsAndFile(t *testing.T) {
	var term, file bytes.Buffer
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	s := &streamer{rank: 0, r: strings.NewReader("x\n"), term: &Sink{w: &term}, tag: true,
		file: &Sink{w: &file}, now: func() time.Time { return at }}
	s.run()
	if got, want := term.String(), "[0] 2026-01-02T03:04:05.000006Z x\n"; got != want {
		t.Errorf("terminal %q, want %q", got, want)
	}
	if got, want := file.String(), "2026-01-02T03:04:05.000006Z x\n"; got != want {
		t.Errorf("file %q, want %q", got, want)
	}
}
