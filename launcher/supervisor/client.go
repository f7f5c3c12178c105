package supervisor

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/internal/liveness"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// The client side of the per-job supervisor (supervisor.go), shared by the
// two places that start one: package launcher's RunLocal on the launching
// machine, and a host agent on every other host. Both build the ranks'
// pipes and the spec with Pipes, start the supervisor with Start, send the
// spec and later commands through it, and read its events until EOF.

// Client is one started supervisor process: the write end of its
// command pipe and the read end of its event pipe. Send and CloseCommands
// are safe for concurrent use (a host agent's connection reader sends
// commands while its main loop may close the pipe); ReadEvents and Wait
// are called by one goroutine each.
type Client struct {
	cmd *exec.Cmd
	evR *os.File

	// mu guards ctrl and closed: a command write and the final close
	// may race, and a write after the close must be dropped, not fail
	// on a reused descriptor.
	mu     sync.Mutex
	ctrl   *os.File
	closed bool

	waitOnce sync.Once
	waitErr  error

	// cg is the job cgroup the supervisor runs in (cgroup_linux.go); nil
	// where this host offers none, and cgWhy then says why.
	cg    *jobCgroup
	cgWhy error
	// reaper ends the cgroup should this client and the supervisor
	// die together (reaper_linux.go); nil without a cgroup, and
	// reaperWhy then says why there is none despite one.
	reaper    *reaperClient
	reaperWhy error

	// lastHeard is when the event reader last read a line (UnixNano);
	// delivering is set while it hands an event on, which a slow reader
	// may hold up: neither counts as the supervisor's silence.
	lastHeard  atomic.Int64
	delivering atomic.Bool
	// sample, when set, replaces the kernel as WatchLease's evidence
	// (tests).
	sample liveness.Sampler
}

// errSupervisorClosed is Send's answer after CloseCommands.
var errSupervisorClosed = errors.New("supervisor: command pipe closed")

// Start starts the per-job supervisor process (path, "" for this
// executable) with extra as its descriptors from 3 on, and, where this
// host allows, moves it into a new cgroup for job jobID before it can
// start anything (its spec is not sent yet). The caller closes its copies
// of the descriptors meant for the supervisor alone once this returns,
// puts CgroupDir in the spec, and eventually calls CloseCommands, Wait,
// ReleaseCgroup and CloseEvents. An error is exec.Cmd.Start's or a pipe's;
// nothing was started then.
func Start(path string, extra []*os.File, stderr io.Writer, jobID string) (*Client, error) {
	// /proc/self/exe is the running binary even when its file was replaced
	// or deleted since (a `make build` during a long job).
	argv0 := path
	if path == "" {
		path, argv0 = "/proc/self/exe", os.Args[0]
	}
	ctrlR, ctrlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("supervisor: pipe: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		ctrlR.Close()
		ctrlW.Close()
		return nil, fmt.Errorf("supervisor: pipe: %w", err)
	}
	// The supervisor holds its own copies; ours of its ends must go, or
	// EOF on either pipe would never come.
	defer ctrlR.Close()
	defer evW.Close()

	cmd := &exec.Cmd{
		Path:       path,
		Args:       []string{argv0},
		Env:        append(os.Environ(), supervisorEnv+"="+supervisorProtocol),
		Stdin:      ctrlR,
		Stdout:     evW,
		Stderr:     stderr,
		ExtraFiles: extra,
		// Its own process group: Ctrl-C at the terminal and a kill of
		// gorun's group must not take the supervisor down before it
		// cleaned up.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		ctrlW.Close()
		evR.Close()
		return nil, err // exec.Cmd.Start's: it names the path
	}
	s := &Client{cmd: cmd, ctrl: ctrlW, evR: evR}
	s.lastHeard.Store(time.Now().UnixNano())
	if jobID == "" {
		s.cgWhy = errors.New("no job id")
	} else if s.cg, s.cgWhy = newJobCgroup(jobID); s.cg != nil {
		if err := s.cg.add(cmd.Process.Pid); err != nil {
			dir := s.cg.dir
			_, _ = s.cg.remove()
			s.cg, s.cgWhy = nil, fmt.Errorf("moving the supervisor into %s: %w", dir, err)
		} else {
			s.reaper, s.reaperWhy = startReaper(path, s.cg, cmd.Process.Pid, stderr)
		}
	}
	return s, nil
}

// CgroupDir is the job cgroup's directory, "" without one.
func (s *Client) CgroupDir() string {
	if s.cg == nil {
		return ""
	}
	return s.cg.dir
}

// CgroupErr says why the supervisor runs in no job cgroup (nil when it
// does): a host that offers none, or a move into one that failed. Without
// one, escaped descendants of a killed supervisor are found by their
// environment only (KillLeftovers).
func (s *Client) CgroupErr() error { return s.cgWhy }

// PID is the supervisor process's id.
func (s *Client) PID() int { return s.cmd.Process.Pid }

// ReleaseCgroup is called once the supervisor has exited (Wait returned):
// it SIGKILLs whatever is left in the job's cgroup — nothing after a
// supervisor that finished its job; after one that was killed or stopped,
// every descendant of its ranks, whatever session and environment it gave
// itself — reaps those it adopted, removes the cgroup and returns how many
// it killed. A no-op without a cgroup.
func (s *Client) ReleaseCgroup() (int, error) {
	if s.cg == nil {
		return 0, nil
	}
	killed, err := s.cg.remove()
	s.cg = nil
	s.reaper.done()
	s.reaper = nil
	n := 0
	for _, p := range killed {
		if p != s.cmd.Process.Pid {
			n++
		}
	}
	reapPids(slices.DeleteFunc(killed, func(p int) bool { return p == s.cmd.Process.Pid }), time.Now().Add(2*time.Second))
	return n, err
}

// WatchLease SIGKILLs the supervisor once it has been silent — no event,
// not even its beat — for longer than lease and the kernel says it is
// stopped or neither ran nor waited to (internal/liveness: a supervisor
// starved of CPU on a loaded host is silent too, and alive), after storing
// how long it was silent in *silent; it stores nothing when done closes
// first. A supervisor that runs but stays silent for lease×StarvedLimitX
// is killed as hung. The store comes before the kill: the kill ends the
// event pipe, and whoever reads *silent after seeing that end must find
// it set. A supervisor that is stopped (SIGSTOP, a debugger) or hung
// would otherwise keep its ranks running and gorun waiting, deaf to the
// commands a second Ctrl-C sends: SIGKILL ends even a stopped process, its
// ranks follow (Pdeathsig), and its event pipe closes, which is how the
// client learns the end.
func (s *Client) WatchLease(lease time.Duration, done <-chan struct{}, silent *atomic.Int64) {
	t := time.NewTicker(lease / 8)
	defer t.Stop()
	judge := liveness.Judge{PID: s.cmd.Process.Pid, Sample: s.sample, Lease: lease, Recheck: lease / 4, Limit: StarvedLimitX * lease}
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if s.delivering.Load() {
			s.lastHeard.Store(time.Now().UnixNano())
			continue
		}
		d := time.Since(time.Unix(0, s.lastHeard.Load()))
		if d <= lease {
			judge.Heard()
			continue
		}
		switch v, _ := judge.Expired(d); v {
		case liveness.Wait:
			continue // starved, not stopped: its beat will come
		case liveness.Gone:
			return // exited: its event pipe ends, which says so
		}
		silent.Store(int64(d))
		_ = s.cmd.Process.Kill()
		return
	}
}

// StarvedLimitX is how many leases a process may stay silent while the
// kernel shows it alive before it is judged hung anyway: 15, a minute at
// the default 4 s lease (as rendezvous.Config.StarvedLimit).
const StarvedLimitX = 15

// Send writes one protocol message (the spec, then commands) as a JSON
// line. It blocks only while the pipe is full, which the supervisor's
// command reader keeps from lasting.
func (s *Client) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSupervisorClosed
	}
	_, err = s.ctrl.Write(append(b, '\n'))
	return err
}

// CloseCommands closes the command pipe. Before the supervisor reported
// "done" this tells it that its client is gone: it kills every rank and
// descendant, then exits. Idempotent.
func (s *Client) CloseCommands() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.ctrl.Close()
	}
}

// ReadEvents decodes the supervisor's event lines and hands each to f
// until the event pipe ends (the supervisor exited). Lines that do not
// decode are skipped: the supervisor writes nothing else on it.
// Beats only feed the lease (WatchLease); they are not handed on.
func (s *Client) ReadEvents(f func(wire.Event)) {
	readEvents(s.evR, func(ev wire.Event) {
		s.lastHeard.Store(time.Now().UnixNano())
		if ev.Ev == "beat" {
			return
		}
		s.delivering.Store(true)
		f(ev)
		s.lastHeard.Store(time.Now().UnixNano())
		s.delivering.Store(false)
	})
}

// readEvents decodes event lines from r until EOF.
func readEvents(r io.Reader, f func(wire.Event)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev wire.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		f(ev)
	}
}

// Wait reaps the supervisor; later calls return the first result.
func (s *Client) Wait() error {
	s.waitOnce.Do(func() { s.waitErr = s.cmd.Wait() })
	return s.waitErr
}

// CloseEvents closes the event pipe's read end (after ReadEvents ended, or
// to end it).
func (s *Client) CloseEvents() { s.evR.Close() }

// Pipes builds a supervisor's spec together with the descriptors it
// hands down: one pipe per output stream of every rank (the supervisor
// gets the write ends as inherited descriptors, the caller reads the other
// ends) and, for rank 0, a stdin descriptor when asked for.
type Pipes struct {
	// Spec is the spec to send once the supervisor started; AddRank
	// appends its ranks, the caller fills the rest.
	Spec wire.SupervisorSpec
	// Extra are the supervisor's descriptors from 3 on, in order (Start's
	// extra).
	Extra []*os.File
	// childEnds are the descriptors in Extra that this process opened for
	// the supervisor alone: closed once it started (or on failure).
	childEnds []*os.File
	// Streams are the read ends, one per rank stream, owned by the caller
	// once AddRank returned.
	Streams []Stream
}

// Stream is the read end of one rank's stdout or stderr.
type Stream struct {
	Rank int
	Kind byte     // 1 stdout, 2 stderr
	R    *os.File // the read end
}

// Inherit adds f to the supervisor's descriptors and returns its number
// there. owned marks a descriptor this process made for the supervisor
// alone (closed after start); a descriptor borrowed from the caller (a
// stdin file handed over) is not closed.
func (p *Pipes) Inherit(f *os.File, owned bool) int {
	p.Extra = append(p.Extra, f)
	if owned {
		p.childEnds = append(p.childEnds, f)
	}
	return 2 + len(p.Extra)
}

// AddRank appends one rank to the spec with fresh stdout and stderr pipes;
// stdin is the supervisor descriptor of its stdin, -1 for /dev/null.
func (p *Pipes) AddRank(r wire.SupervisorRank, stdin int) error {
	r.Stdin = stdin
	for _, s := range []struct {
		fd   *int
		kind byte
	}{{&r.Stdout, 1}, {&r.Stderr, 2}} {
		pr, pw, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("supervisor: pipe for rank %d: %w", r.Rank, err)
		}
		growPipe(pr)
		*s.fd = p.Inherit(pw, true)
		p.Streams = append(p.Streams, Stream{Rank: r.Rank, Kind: s.kind, R: pr})
	}
	p.Spec.Ranks = append(p.Spec.Ranks, r)
	return nil
}

// CloseChildEnds closes this process's copies of the supervisor's
// descriptors: after a start, so that EOF on a rank's pipe means that
// rank and its descendants are gone; after a failure, to leak nothing.
func (p *Pipes) CloseChildEnds() {
	for _, f := range p.childEnds {
		f.Close()
	}
	p.childEnds = nil
}

// CloseStreams closes the read ends (on a failure before they were handed
// to readers).
func (p *Pipes) CloseStreams() {
	for _, s := range p.Streams {
		s.R.Close()
	}
}

// pipeSize is the buffer asked for on each rank output pipe: a rank that
// floods output then writes up to 1 MiB ahead of gorun (Linux' default
// pipe-max-size for unprivileged users) and gorun reads it in a few large
// reads instead of many 64 KiB wake-ups. Failure leaves the default.
const pipeSize = 1 << 20

func growPipe(f *os.File) {
	// SyscallConn, not Fd: Fd would switch the pipe to blocking mode and
	// cost a thread per blocked read.
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize)
		})
	}
}
