package output

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pipeJob opens a Job on cfg with one os.Pipe per stream of ranks ranks
// (stdout, stderr), starts it, and checks that the poller reads them all.
// It returns the write ends, by rank: [rank][0] stdout, [rank][1] stderr.
func pipeJob(t *testing.T, cfg Config, ranks int) (*Job, [][2]*os.File) {
	t.Helper()
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ws := make([][2]*os.File, ranks)
	for r := range ranks {
		for k := range 2 {
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			ws[r][k] = pw
			j.Add(r, "", byte(k+1), pr)
		}
	}
	if len(j.streams) != 0 || len(j.polled) != 2*ranks {
		t.Fatalf("%d streams polled and %d in goroutines, want %d polled", len(j.polled), len(j.streams), 2*ranks)
	}
	j.Start()
	if j.poller == nil {
		t.Fatal("the poller did not start")
	}
	t.Cleanup(func() {
		for _, w := range ws {
			w[0].Close()
			w[1].Close()
		}
	})
	return j, ws
}

// openFDs counts this process's descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// Many ranks, each writing lines in pieces that split lines anywhere, on
// both streams and into per-rank logs: every line arrives whole, tagged,
// in its stream's order, in its rank's log; no descriptor is left.
func TestPollerManyRanksPartialLines(t *testing.T) {
	const ranks, lines = 150, 40
	before := openFDs(t)
	dir := t.TempDir()
	var out, errOut lockedBuffer
	j, ws := pipeJob(t, Config{Stdout: &out, Stderr: &errOut, Dir: dir, Ranks: ranks}, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		for k := range 2 {
			wg.Go(func() {
				var text strings.Builder
				for i := range lines {
					fmt.Fprintf(&text, "r%d k%d line %d %s\n", r, k, i, strings.Repeat("x", (r*7+i)%300))
				}
				b := []byte(text.String())
				for step := 1 + r%13; len(b) > 0; step = step*3%97 + 1 {
					n := min(step, len(b))
					if _, err := ws[r][k].Write(b[:n]); err != nil {
						t.Error(err)
						return
					}
					b = b[n:]
				}
				ws[r][k].Close()
			})
		}
	}
	wg.Wait()
	j.Wait()
	if err := j.Finish(); err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^\[(\d+)\] r(\d+) k(\d) line (\d+) x*$`)
	for k, term := range []*lockedBuffer{&out, &errOut} {
		next := make([]int, ranks)
		for _, l := range strings.Split(strings.TrimSuffix(term.String(), "\n"), "\n") {
			m := line.FindStringSubmatch(l)
			if m == nil || m[1] != m[2] || m[3] != fmt.Sprint(k) {
				t.Fatalf("stream %d: a line not whole or not its rank's: %.80q", k+1, l)
			}
			var r, i int
			fmt.Sscan(m[1], &r)
			fmt.Sscan(m[4], &i)
			if i != next[r] {
				t.Fatalf("stream %d rank %d: line %d after %d", k+1, r, i, next[r]-1)
			}
			next[r]++
		}
		for r, n := range next {
			if n != lines {
				t.Errorf("stream %d rank %d: %d lines, want %d", k+1, r, n, lines)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "rank.42.log"))
	if err != nil || bytes.Count(b, []byte("\n")) != 2*lines || !bytes.HasPrefix(b, []byte("r42 k")) {
		t.Errorf("rank.42.log: %d lines (want %d), %v: %.40q", bytes.Count(b, []byte("\n")), 2*lines, err, b)
	}
	for _, w := range ws {
		w[0].Close()
		w[1].Close()
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open before the job and %d after", before, after)
	}
}

// A rank that floods its stdout does not hold back a rank that trickles:
// the trickling rank's lines appear while the flood goes on, and the
// flood arrives whole.
func TestPollerFloodDoesNotStarveTrickle(t *testing.T) {
	var out lockedBuffer
	j, ws := pipeJob(t, Config{Stdout: &out, Stderr: &out, Tag: true}, 2)
	stop := make(chan struct{})
	var flooded atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		line := []byte(strings.Repeat("f", 1023) + "\n")
		chunk := bytes.Repeat(line, 64)
		for {
			select {
			case <-stop:
				ws[0][0].Close()
				return
			default:
			}
			if _, err := ws[0][0].Write(chunk); err != nil {
				return
			}
			flooded.Add(int64(len(chunk)))
		}
	})
	for flooded.Load() < 4<<20 {
		time.Sleep(time.Millisecond)
	}
	for i := range 5 {
		fmt.Fprintf(ws[1][0], "trickle %d\n", i)
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(out.String(), fmt.Sprintf("[1] trickle %d\n", i)) {
			if time.Now().After(deadline) {
				t.Fatalf("rank 1's line %d not out 5 s after it was written, behind rank 0's flood", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	ws[1][0].Close()
	ws[0][1].Close()
	ws[1][1].Close()
	j.Wait()
	got := out.String()
	if n := strings.Count(got, "[0] "+strings.Repeat("f", 1023)+"\n"); int64(n)*1024 != flooded.Load() {
		t.Errorf("%d whole flood lines, %d bytes flooded", n, flooded.Load())
	}
	if n := strings.Count(got, "\n"); n != int(flooded.Load()/1024)+5 {
		t.Errorf("%d lines in all, want the flood's and 5", n)
	}
}

// A stream that ends in the middle of a line (its rank exited) gets the
// line ended, whether the EOF comes with the bytes or after them, and at
// the same moment as other ranks' EOFs.
func TestPollerEOFMidLine(t *testing.T) {
	const ranks = 64
	var out lockedBuffer
	j, ws := pipeJob(t, Config{Stdout: &out, Stderr: &out, Tag: true}, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			fmt.Fprintf(ws[r][0], "whole %d\npart", r)
			if r%2 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			fmt.Fprintf(ws[r][0], "ial %d", r)
			ws[r][0].Close()
			ws[r][1].Close()
		})
	}
	wg.Wait()
	j.Wait()
	got := out.String()
	for r := range ranks {
		for _, l := range []string{fmt.Sprintf("[%d] whole %d\n", r, r), fmt.Sprintf("[%d] partial %d\n", r, r)} {
			if !strings.Contains(got, l) {
				t.Errorf("output lacks %q", l)
			}
		}
	}
	if n := strings.Count(got, "\n"); n != 2*ranks {
		t.Errorf("%d lines, want %d", n, 2*ranks)
	}
}

// Long lines stay whole between polled streams too: rank 0 writes three
// lines of 3 MiB while rank 1 prints short ones, and the poller, which
// must not wait in a sink rank 0 holds (rank 0's next piece needs it),
// sets rank 1 aside until each long line ends.
func TestPollerLongLinesStayWhole(t *testing.T) {
	var out lockedBuffer
	j, ws := pipeJob(t, Config{Stdout: &out, Stderr: &out, Tag: true}, 2)
	long := strings.Repeat("y", 3<<20)
	var wg sync.WaitGroup
	longDone := make(chan struct{})
	wg.Go(func() {
		defer close(longDone)
		for range 3 {
			b := []byte(long + "\n")
			for len(b) > 0 {
				n := min(len(b), 64<<10)
				_, _ = ws[0][0].Write(b[:n])
				b = b[n:]
				time.Sleep(time.Millisecond) // pieces, with others' lines between
			}
		}
		ws[0][0].Close()
	})
	written := 0
	wg.Go(func() {
		for {
			select {
			case <-longDone:
				ws[1][0].Close()
				return
			default:
			}
			fmt.Fprintf(ws[1][0], "short %d\n", written)
			written++
			time.Sleep(100 * time.Microsecond)
		}
	})
	wg.Wait()
	for _, w := range ws {
		w[1].Close()
	}
	j.Wait()
	longs, shorts := 0, 0
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		switch {
		case l == "[0] "+long:
			longs++
		case strings.HasPrefix(l, "[1] short ") && len(l) < 20:
			shorts++
		default:
			t.Fatalf("a line that is neither rank's whole line: %d bytes, %.40q...", len(l), l)
		}
	}
	if longs != 3 || shorts != written || written < 100 {
		t.Errorf("%d whole long lines and %d short ones, want 3 and %d (at least 100)", longs, shorts, written)
	}
}

// A rank that stops mid-way through a long line holds the others for
// holdStall at most under the poller too.
func TestPollerLongLineStall(t *testing.T) {
	var out lockedBuffer
	j, ws := pipeJob(t, Config{Stdout: &out, Stderr: &out, Tag: true}, 2)
	long := strings.Repeat("y", maxLine+100)
	// The hold runs from rank 0's last piece, read after this write: timed
	// from here, the wait is never below holdStall, however late the sleep
	// below wakes on a loaded machine (timed from after it, an oversleep of
	// half a second would read as a hold released early).
	start := time.Now()
	_, _ = ws[0][0].Write([]byte(long)) // then silence, pipe open
	time.Sleep(50 * time.Millisecond)
	_, _ = ws[1][0].Write([]byte("short\n"))
	for !strings.Contains(out.String(), "[1] short\n") {
		if time.Since(start) > 5*time.Second {
			t.Fatal("rank 1's line is still held back 5 s after rank 0 went quiet mid-line")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waited := time.Since(start)
	_, _ = ws[0][0].Write([]byte("tail\n"))
	for _, w := range ws {
		w[0].Close()
		w[1].Close()
	}
	j.Wait()
	got := out.String()
	m := regexp.MustCompile(`^\[0\] (y+)\n\[1\] short\n\[0\] (y*)tail\n$`).FindStringSubmatch(got)
	if m == nil || len(m[1]) < maxLine || len(m[1])+len(m[2]) != len(long) {
		t.Errorf("got %d bytes: %.30q ... %q", len(got), got, got[max(0, len(got)-40):])
	}
	if waited < holdStall/2 || waited > 3*holdStall {
		t.Errorf("rank 1's line came %v after rank 0 went quiet, want about holdStall (%v)", waited, holdStall)
	}
}

// Cut ends streams whose pipes a stray process keeps open: their partial
// lines are written and their descriptors closed, and Wait returns.
func TestPollerCut(t *testing.T) {
	before := openFDs(t)
	var out lockedBuffer
	j, ws := pipeJob(t, Config{Stdout: &out, Stderr: &out, Tag: true}, 3)
	fmt.Fprint(ws[1][0], "half a line")
	ws[0][0].Close() // one stream ended already
	time.Sleep(20 * time.Millisecond)
	j.Cut()
	done := make(chan struct{})
	go func() { j.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return 5 s after Cut")
	}
	j.Cut() // after the poller ended: nothing
	if got := out.String(); got != "[1] half a line\n" {
		t.Errorf("got %q", got)
	}
	for _, w := range ws {
		w[0].Close()
		w[1].Close()
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open before the job and %d after", before, after)
	}
}

// lockedBuffer is a terminal that the test reads while the job writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// A poller that comes late (gorun starved past holdStall) must not read
// a rank's hold as stalled while the holder's next piece waits unread in
// its pipe: the other rank's line waits, and the long line stays whole.
func TestPollerLateIsNotAStalledHolder(t *testing.T) {
	var out lockedBuffer
	j, err := Open(Config{Stdout: &out, Stderr: &out, Tag: true})
	if err != nil {
		t.Fatal(err)
	}
	var ws [2]*os.File
	for r := range 2 {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		ws[r] = pw
		j.Add(r, "", 1, pr)
	}
	// Driven by hand, not started: each step is this test's choice.
	p, err := newPoller(j.polled)
	if err != nil {
		t.Skip("no epoll here:", err)
	}
	defer p.closeSet()
	holder, other := p.streams[0], p.streams[1]
	first := strings.Repeat("x", maxLine+1)
	wrote := make(chan error, 1)
	go func() { _, err := ws[0].WriteString(first); wrote <- err }() // more than a pipe holds
	for holder.s.term.holderIs(nil) {
		p.read(holder) // until the long line's first piece holds the sink
	}
	for len(wrote) == 0 {
		p.read(holder)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// The holder's next piece is in its pipe, the other rank's line in
	// its own, and the last piece was written longer ago than holdStall.
	if _, err := ws[0].WriteString("y\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := ws[1].WriteString("short\n"); err != nil {
		t.Fatal(err)
	}
	sink := holder.s.term
	sink.mu.Lock()
	sink.lastPiece = time.Now().Add(-2 * holdStall)
	sink.mu.Unlock()
	p.read(other)
	if !other.blocked {
		t.Fatal("the other rank was read while the holder's next piece waited in its pipe")
	}
	for !holder.s.term.holderIs(nil) {
		p.read(holder)
	}
	p.unblock()
	if other.blocked {
		t.Fatal("the other rank stays set aside after the long line ended")
	}
	p.read(other)
	want := "[0] " + first + "y\n[1] short\n"
	if got := out.String(); got != want {
		t.Errorf("output %d bytes, want %d: the long line split (%.60q...)", len(got), len(want), got[min(len(got), len(first)):])
	}
}

// holderIs reports whether h holds s (nil: nobody).
func (s *Sink) holderIs(h *streamer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holder == h
}
