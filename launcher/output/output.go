package output

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun-hpc/gorun/internal/plural"
)

// maxLine bounds how much of one unterminated line is held back to keep it
// whole in one write. A longer line is written in pieces as it comes, with
// no newline added: its streamer holds the sink until the line's newline
// (Sink.holder), so the line stays whole on the terminal while memory
// stays bounded. Other ranks' lines wait meanwhile, at most holdStall
// without a new piece: a rank that stops mid-line (a prompt, a blob and a
// long pause) then has its line ended for them, and its next piece starts
// a tagged line of its own.
const maxLine = 1 << 20

// holdStall is how long other writers wait for the newline of a long line
// whose rank has gone quiet mid-line.
const holdStall = time.Second

// readChunk is the size of one read from a rank's pipe; it matches the
// pipe buffer the launcher asks for (pipeSize, launcher/runlocal.go), so
// one read drains a full pipe.
const readChunk = 1 << 20

// minChunk is the first buffer size and the least room left for a read.
const minChunk = 16 << 10

// Sink serializes writes of whole lines to one destination: a terminal
// stream or one rank's log. Each write carries only complete lines, so holding mu for one Write is what
// keeps two ranks' bytes out of one line.
type Sink struct {
	mu sync.Mutex
	w  io.Writer
	// name and failed are set for a per-rank log file: its first write
	// error is handed to failed (once), and nothing more is written to it.
	name   string
	failed func(name string, err error)
	err    error // guarded by mu: the first write error
	// holder is the streamer in the middle of a line longer than maxLine
	// (nil when none); other writers wait for it (see maxLine). lastPiece
	// is when it last wrote; moved is closed and replaced whenever the
	// holder writes or lets go, to wake the waiters. Guarded by mu.
	holder    *streamer
	lastPiece time.Time
	moved     chan struct{}
}

// WriteLines writes complete lines (gorun's own, or a rank's) whole,
// between other writers' lines. It is safe for concurrent use and blocks
// while a rank's overlong line holds the sink (at most holdStall after
// that rank's last piece). A write error is not returned: the sink's first
// one is reported once (to the Job's stderr for a log) and later writes
// are dropped.
func (s *Sink) WriteLines(b []byte) { s.put(nil, nil, nil, b, false) }

// put writes for streamer who: cont, the rest of who's open long line
// (prefixed with contPrefix if who lost its hold meanwhile), then lines;
// open says that lines (or cont) ends in the middle of a long line, which
// who then holds. It waits while another streamer holds the sink (see
// maxLine).
func (s *Sink) put(who *streamer, cont, contPrefix, lines []byte, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.holder != nil && s.holder != who {
		wait := holdStall - time.Since(s.lastPiece)
		if wait <= 0 {
			// The holder went quiet mid-line: end its line for the
			// others; its next piece starts a line of its own.
			s.writeLocked([]byte{'\n'})
			s.release()
			break
		}
		moved := s.moved
		s.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-moved:
		case <-t.C:
		}
		t.Stop()
		s.mu.Lock()
	}
	if cont != nil {
		if s.holder != who {
			s.writeLocked(contPrefix)
		}
		s.writeLocked(cont)
	}
	s.writeLocked(lines)
	switch {
	case open:
		s.holder, s.lastPiece = who, time.Now()
		if s.moved == nil {
			s.moved = make(chan struct{})
		}
		close(s.moved)
		s.moved = make(chan struct{})
	case s.holder == who && who != nil:
		s.release()
	}
}

// release ends the hold and wakes the waiters; mu is held.
func (s *Sink) release() {
	s.holder = nil
	if s.moved != nil {
		close(s.moved)
		s.moved = nil
	}
}

func (s *Sink) writeLocked(b []byte) {
	if s.err != nil || len(b) == 0 {
		return
	}
	// A write error must not stop draining the rank: it would block on a
	// full pipe. The rank keeps running; a log file's loss is reported.
	if _, err := s.w.Write(b); err != nil && s.failed != nil {
		s.err = err
		s.failed(s.name, err)
	}
}

// LostError reports that output meant for a file could not be
// written (a full or failing file system): the job may have succeeded,
// but its record did not.
type LostError struct {
	// File is the per-rank log that lost output; Err the write's error.
	File string
	Err  error
	// Files counts the logs that lost output, File's included.
	Files int
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("launcher: output lost: writing %s: %v", e.File, e.Err)
	if e.Files > 1 {
		s += fmt.Sprintf(" (and %d more %s)", e.Files-1, plural.Noun(e.Files-1, "log", "logs"))
	}
	return s
}

func (e *LostError) Unwrap() error { return e.Err }

// ExitCode is 74, sysexits' EX_IOERR: the job's own exit status was 0, so
// only gorun's can say that its output is incomplete.
func (e *LostError) ExitCode() int { return 74 }

// streamer copies one stream (stdout or stderr) of one rank to its sinks.
// Its bytes come either from its own goroutine reading r (run) or from the
// Job's poller reading file (poller.go); both hand them to feed, and
// end the stream with end.
type streamer struct {
	rank int
	// host, when set, is added to the tag: [rank,host]. Job.Moved
	// changes it while the stream is read.
	host atomic.Pointer[string]
	r    io.Reader
	// term receives the terminal copy; tag adds "[rank] " there.
	term *Sink
	tag  bool
	// file, when set, receives the per-rank log copy (untagged).
	file *Sink
	// now, when set, prefixes each line with a timestamp.
	now func() time.Time
	// midLine is set while a line longer than maxLine is being written
	// in pieces. pending is the last line read, not yet ended; nil when
	// there is none (an idle rank holds no buffer). Only the one
	// goroutine that feeds the stream touches them.
	midLine bool
	pending []byte
}

// run copies r until EOF or a read error (the pipe closed under it),
// reading straight after the pending line's start, so a long line costs
// no copies.
//
// The buffer starts small (most ranks print little) and doubles, up to
// readChunk plus one held-back line, whenever a read fills it.
func (s *streamer) run() {
	buf := make([]byte, 0, minChunk)
	for {
		if cap(buf)-len(buf) < minChunk {
			buf = grow(buf)
		}
		n, err := s.r.Read(buf[len(buf):cap(buf)])
		full := len(buf)+n == cap(buf)
		rest := s.lines(buf[:len(buf)+n])
		buf = buf[:copy(buf[:cap(buf)], rest)]
		if full && cap(buf) < readChunk+maxLine {
			// The rank writes faster than one buffer per read: grow.
			buf = grow(buf)
		}
		if err != nil {
			s.pending = buf
			s.end()
			return
		}
	}
}

// grow doubles buf's capacity, up to readChunk plus one held-back line.
func grow(buf []byte) []byte {
	nb := make([]byte, len(buf), min(2*cap(buf), readChunk+maxLine))
	copy(nb, buf)
	return nb
}

// feed takes the bytes of one read for a stream whose reads go into a
// shared buffer (the poller's): b is not kept, the caller reuses it once
// feed returns; only an unfinished last line is copied, into pending.
func (s *streamer) feed(b []byte) {
	if len(b) == 0 {
		return
	}
	data := b
	if len(s.pending) > 0 {
		s.pending = append(s.pending, b...)
		data = s.pending
	}
	s.keep(s.lines(data))
}

// lines writes what data holds of whole lines in one batch (one Write for
// everything a read brought), which keeps a rank flooding megabytes fast,
// and returns the last partial line, kept until its newline arrives or the
// stream ends; unless it grew to maxLine, when it is written as the open
// start (or more) of a long line and nothing is returned.
func (s *streamer) lines(data []byte) (rest []byte) {
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		s.emit(data[:i+1])
		data = data[i+1:]
	}
	if len(data) >= maxLine {
		s.emitOpen(data)
		return nil
	}
	return data
}

// keep makes rest, a line's start not yet written, the stream's pending
// bytes; rest may alias pending. An idle stream holds no buffer of more
// than minChunk.
func (s *streamer) keep(rest []byte) {
	switch {
	case len(rest) == 0 && cap(s.pending) > minChunk:
		s.pending = nil
	case len(rest) == 0:
		s.pending = s.pending[:0]
	default:
		s.pending = append(s.pending[:0], rest...)
	}
}

// end writes what is left of the stream at its end: a last line without
// its newline gets one, and so does an open long line.
func (s *streamer) end() {
	if len(s.pending) > 0 || s.midLine {
		s.emit(append(s.pending, '\n'))
	}
	s.pending = nil
}

// emit writes complete lines (lines ends in '\n') to every sink; while a
// long line is open, the first of them is its end.
func (s *streamer) emit(lines []byte) {
	var cont []byte
	if s.midLine {
		i := bytes.IndexByte(lines, '\n')
		cont, lines = lines[:i+1], lines[i+1:]
		s.midLine = false
	}
	s.put(cont, lines, false)
}

// emitOpen writes piece, a part of a line longer than maxLine, without a
// newline; the sinks are held for this rank until the line ends.
func (s *streamer) emitOpen(piece []byte) {
	if s.midLine {
		s.put(piece, nil, true)
		return
	}
	s.midLine = true
	s.put(nil, piece, true)
}

// put writes cont (the end of, or more of, the open long line) and lines
// (whole lines, or with open the start of a long line) to every sink.
func (s *streamer) put(cont, lines []byte, open bool) {
	var ts []byte
	if s.now != nil {
		ts = s.now().UTC().AppendFormat(nil, "2006-01-02T15:04:05.000000Z07:00 ")
	}
	if s.file != nil {
		s.file.put(s, cont, ts, prefixLines(lines, ts, open), open)
	}
	if s.tag {
		tag := append([]byte{'['}, strconv.Itoa(s.rank)...)
		if h := s.host.Load(); h != nil && *h != "" {
			tag = append(append(tag, ','), *h...)
		}
		ts = append(append(tag, "] "...), ts...)
	}
	s.term.put(s, cont, ts, prefixLines(lines, ts, open), open)
}

// prefixLines returns lines with prefix before each line; lines itself when
// there is no prefix. With open, the last line has no newline (the start
// of a long line).
func prefixLines(lines, prefix []byte, open bool) []byte {
	if len(prefix) == 0 || len(lines) == 0 {
		return lines
	}
	n := bytes.Count(lines, []byte{'\n'})
	out := make([]byte, 0, len(lines)+(n+1)*len(prefix))
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		if i < 0 && open {
			i = len(lines) - 1
		}
		out = append(out, prefix...)
		out = append(out, lines[:i+1]...)
		lines = lines[i+1:]
	}
	return out
}

// Config says where one world's output goes. The zero value of a field
// is "off".
type Config struct {
	// Stdout and Stderr receive the ranks' streams, line-whole across
	// ranks, and gorun's own lines (Job.Stderr).
	Stdout, Stderr io.Writer
	// Tag prefixes each terminal line with "[rank] " ("[rank,host] " for a
	// stream added with a host). Dir implies it.
	Tag bool
	// Timestamp prefixes each line with the time it was read.
	Timestamp bool
	// Dir, when set, receives one log per rank, rank.N.log for N below
	// Ranks; it is made if missing and refused (a *DirError) when another
	// user could redirect or replace the logs (dir.go).
	Dir   string
	Ranks int
	// Restart is the world's number: a restarted world (above 0) appends
	// to the logs of the worlds before it, after a line that names the
	// restart and JobID.
	Restart int
	JobID   string
}

// Job is where a job's output goes: the terminal (Config.Stdout and
// Stderr, line-whole across ranks) and, with Config.Dir, one log per rank.
// Local and multi-host jobs share it; only the readers differ (the ranks'
// pipes in a local job, a host agent's frames in a multi-host one).
//
// Its life is Open, Add for every stream, Start, Wait, then Finish (or
// Close when the job did not get that far). Add and Start are called from
// one goroutine; Wait, Finish and Close from the one that called Start;
// Stderr's Sink is safe for concurrent use throughout.
type Job struct {
	stdout, stderr *Sink
	// logs holds one sink per rank, by rank; nil without Dir.
	logs  []*Sink
	files []*os.File // the log files, closed by Close or Finish
	tag   bool
	now   func() time.Time

	// streams are read by a goroutine each, polled by the poller.
	streams []*streamer
	polled  []*polled
	wg      sync.WaitGroup // the streamers' goroutines and the poller's
	mu      sync.Mutex
	poller  *poller // guarded by mu: set by Start, read by Cut
	// unpolled are the Job's files read by goroutines after the poller
	// could not start, closed by Cut; guarded by mu.
	unpolled []*os.File
}

// Open creates the sinks and, with Dir, the per-rank logs.
func Open(cfg Config) (*Job, error) {
	o := &Job{tag: cfg.Tag || cfg.Dir != ""}
	// A terminal stream that fails (its reader exited: `gorun ... | head`)
	// is given up on, not retried per line; the job runs on. Ending it
	// instead would cost a long job its work for a pager the user closed,
	// and the ranks' exit status stays gorun's (mpirun and srun likewise
	// keep the job running). A failed stdout is said once on stderr; a
	// failed stderr has nowhere to say it.
	o.stdout = &Sink{w: cfg.Stdout, name: "stdout", failed: o.terminalFailed}
	o.stderr = &Sink{w: cfg.Stderr, name: "stderr", failed: o.terminalFailed}
	if cfg.Timestamp {
		o.now = time.Now
	}
	if cfg.Dir == "" {
		return o, nil
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("launcher: output dir: %w", err)
	}
	if err := checkDir(cfg.Dir); err != nil {
		return nil, err
	}
	// A restarted world (--max-restarts) appends to the logs of the worlds
	// before it, after a line saying where it begins: the output of the
	// world that failed is what a user reads to learn why.
	restart := max(cfg.Restart, 0)
	for rank := range cfg.Ranks {
		f, err := openRankLog(filepath.Join(cfg.Dir, "rank."+strconv.Itoa(rank)+".log"), restart > 0)
		if err == nil && restart > 0 {
			if _, err = fmt.Fprintf(f, "--- gorun: restart %d (job %s) ---\n", restart, cfg.JobID); err != nil {
				f.Close()
				err = fmt.Errorf("launcher: output dir: %w", err)
			}
		}
		if err != nil {
			o.Close()
			return nil, err
		}
		o.files = append(o.files, f)
		o.logs = append(o.logs, &Sink{w: f, name: f.Name(), failed: o.fileFailed})
	}
	return o, nil
}

// Stderr is the terminal's stderr sink, for gorun's own lines (flight
// records, warnings) between the ranks' lines.
func (o *Job) Stderr() *Sink { return o.stderr }

// terminalFailed reports gorun's stdout failing, once, on its stderr.
func (o *Job) terminalFailed(name string, err error) {
	if name == "stdout" {
		o.stderr.WriteLines(fmt.Appendf(nil, "gorun: writing stdout: %v (its reader exited?); the job runs on and its stdout is discarded\n", err))
	}
}

// fileFailed reports a log file's first write error, once, on gorun's
// stderr as it happens: the job goes on, and the user learns at once which
// record is incomplete.
func (o *Job) fileFailed(name string, err error) {
	o.stderr.WriteLines(fmt.Appendf(nil, "gorun: writing %s: %v; the rest of that rank's log is lost\n", name, err))
}

// Finish closes the log files and returns a *LostError when any write or
// close of one failed. Call after Wait.
func (o *Job) Finish() error {
	var lost *LostError
	note := func(name string, err error) {
		if lost == nil {
			lost = &LostError{File: name, Err: err}
		}
		lost.Files++
	}
	for i, f := range o.files {
		s := o.logs[i]
		s.mu.Lock()
		werr := s.err
		s.mu.Unlock()
		// A file system that defers errors (NFS, a full disk with
		// delayed allocation) may report them only at close.
		cerr := f.Close()
		switch {
		case werr != nil:
			note(s.name, werr)
		case cerr != nil:
			o.fileFailed(s.name, cerr)
			note(s.name, cerr)
		}
	}
	o.files = nil
	if lost == nil {
		return nil
	}
	return lost
}

// Add registers a reader of one rank's stdout (kind 1) or stderr (kind 2,
// the numbering of the launcher's wire frames); host, when set, goes into
// the tag. Call before Start.
//
// A reader that is a non-blocking *os.File (a pipe from os.Pipe) is read
// by the Job's one poller (poller.go) and becomes the Job's: it is closed
// when its stream ends, and the caller must not close it (Cut ends it
// early). Any other reader gets a goroutine of its own.
func (o *Job) Add(rank int, host string, kind byte, r io.Reader) {
	term := o.stdout
	if kind == 2 {
		term = o.stderr
	}
	st := &streamer{rank: rank, r: r, term: term, tag: o.tag, now: o.now}
	st.host.Store(&host)
	if o.logs != nil {
		st.file = o.logs[rank]
	}
	if f, rc, fd, ok := pollable(r); ok {
		o.polled = append(o.polled, &polled{s: st, f: f, rc: rc, fd: fd})
		return
	}
	o.streams = append(o.streams, st)
}

// Moved says that rank's process runs on host from now on (a
// fault-tolerant rank started again on a spare host): its terminal lines
// are tagged with host, and note, a whole line, goes to its log with
// Config.Dir (the log is the rank's, whatever host it runs on). Call after
// Add; safe for concurrent use with the streams being read.
func (o *Job) Moved(rank int, host, note string) {
	o.mu.Lock() // Start may move polled streams to streams
	for _, st := range o.streams {
		if st.rank == rank {
			st.host.Store(&host)
		}
	}
	for _, ps := range o.polled {
		if ps.s.rank == rank {
			ps.s.host.Store(&host)
		}
	}
	o.mu.Unlock()
	if o.logs != nil && rank < len(o.logs) {
		o.logs[rank].WriteLines([]byte(note))
	}
}

// Start starts reading: the poller over the polled streams, and one
// goroutine per other stream, until each reader ends; Wait waits for them.
func (o *Job) Start() {
	if len(o.polled) > 0 {
		p, err := newPoller(o.polled)
		if err != nil {
			// No epoll set (descriptors exhausted): read them the
			// old way rather than not at all.
			o.mu.Lock()
			for _, ps := range o.polled {
				o.streams = append(o.streams, ps.s)
				o.unpolled = append(o.unpolled, ps.f)
			}
			o.mu.Unlock()
		} else {
			o.mu.Lock()
			o.poller = p
			o.mu.Unlock()
			o.wg.Go(p.run)
		}
	}
	for _, s := range o.streams {
		o.wg.Go(s.run)
	}
}

// Cut ends every stream still being read as if its pipe had been closed
// under it: what each holds of a line is written, and the polled files are
// closed. It is for a job whose pipes some stray process keeps open past
// the job's end; it does not wait (Wait does). Readers read by a goroutine
// of their own are ended by closing them, the caller's business.
func (o *Job) Cut() {
	o.mu.Lock()
	p := o.poller
	o.mu.Unlock()
	if p != nil {
		p.stop()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range o.unpolled {
		f.Close() // its goroutine's Read fails: the stream ends
	}
}

// Wait returns once every stream reached EOF or a read error.
func (o *Job) Wait() {
	o.wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range o.unpolled {
		f.Close()
	}
}

// Close closes the log files, without reporting their errors; call after
// Wait. After Finish it does nothing.
func (o *Job) Close() {
	for _, f := range o.files {
		f.Close()
	}
}
