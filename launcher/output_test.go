package launcher

import (
	"bytes"
	"io"
	"strings"
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
		{name: "a line beyond maxLine is split", in: strings.NewReader(long + "\n"), want: long[:maxLine] + "\n" + long[maxLine:] + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			s := &streamer{rank: 7, r: tc.in, term: &lineSink{w: &out}, tag: tc.tag}
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

// Every write to the terminal carries whole lines only, so two ranks'
// bytes can never share a line.
func TestStreamerWritesWholeLines(t *testing.T) {
	w := &lineCheckWriter{t: t}
	s := &streamer{rank: 1, r: iotest.HalfReader(strings.NewReader(strings.Repeat("abc\ndefgh\n", 1000) + "tail")), term: &lineSink{w: w}, tag: true}
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
	s := &streamer{rank: 0, r: strings.NewReader("x\n"), term: &lineSink{w: &term}, tag: true,
		file: &lineSink{w: &file}, now: func() time.Time { return at }}
	s.run()
	if got, want := term.String(), "[0] 2026-01-02T03:04:05.000006Z x\n"; got != want {
		t.Errorf("terminal %q, want %q", got, want)
	}
	if got, want := file.String(), "2026-01-02T03:04:05.000006Z x\n"; got != want {
		t.Errorf("file %q, want %q", got, want)
	}
}
