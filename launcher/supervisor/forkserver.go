package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// The fork server of a fault-tolerant job's Python ranks (opt-in:
// ForkServerEnv=1 in the ranks' environment). A replacement rank of a
// torch program spends seconds importing torch before it can join; a
// process that imported it already (python/gorun/_forkserver.py, one per
// host, started here in the ranks' interpreter, environment and
// directory) forks the replacement instead, in milliseconds.
//
// The supervisor still owns the replacement as it owns any rank: the
// server forks twice and the middle process exits, so the replacement is
// orphaned to this process (a child subreaper), which reaps it with
// wait4 like its other ranks and sees its real exit status. Nothing runs
// in the replacement before the supervisor has recorded its pid: it
// waits for a byte on a pipe whose write end only the supervisor holds
// (the "go"), and exits at once if that pipe ends empty (the supervisor
// gave up on the request, or died). Once going it takes its own session
// and a parent-death SIGKILL, as an exec'd replacement does. The server
// itself is a child of the supervisor in the job's cgroup, in its own
// process group; the supervisor kills and reaps it when no rank can be
// replaced any more (ftKeeper.release), and killAll's sweep of every
// descendant covers it, its middle processes and any replacement.
//
// Whenever the server cannot serve (not ready yet, refused, dead, slow),
// the replacement is started as a new process, as without the server,
// and the reason is logged; a dead server is started again for the next
// replacement, up to forkServerStarts times per job.

// ForkServerEnv, set to 1 in the ranks' environment of a fault-tolerant
// job, has each host's supervisor start a fork server for its Python
// ranks' replacements.
const ForkServerEnv = "GORUN_FT_FORK_SERVER"

// forkServerFDEnv names the server's end of its control socket.
const forkServerFDEnv = "GORUN_FT_FORK_FD"

// forkServerStarts bounds how often a job's server is started on a host
// (it died, or was killed): a server that cannot stay up is not retried
// for ever.
const forkServerStarts = 3

// forkServerWait bounds one request: a fork of a process holding torch
// takes milliseconds, and the supervisor's loop (its beat, within the
// client's lease) waits meanwhile.
const forkServerWait = 2 * time.Second

// forkServer is one host's server; owned by the supervisor's goroutine.
type forkServer struct {
	rank   wire.SupervisorRank // whose interpreter, environment and directory it runs
	pid    int
	conn   *net.UnixConn
	ready  bool
	starts int
	// off is why the server is not used any more (empty while it is).
	off string
	log zerolog.Logger
}

// forkServerRank returns the rank whose interpreter the job's fork server
// runs: the first that asks for one (ForkServerEnv=1) and runs Python.
func forkServerRank(ranks []wire.SupervisorRank) (wire.SupervisorRank, bool) {
	for _, r := range ranks {
		if envValue(r.Env, ForkServerEnv, "") == "1" && pythonProgram(r.Path) {
			return r, true
		}
	}
	return wire.SupervisorRank{}, false
}

// pythonProgram reports whether path names a Python interpreter
// (python, python3, python3.11, ...).
func pythonProgram(path string) bool {
	return strings.HasPrefix(filepath.Base(path), "python")
}

// newForkServer starts the server for rank r's interpreter.
func newForkServer(r wire.SupervisorRank, log zerolog.Logger) *forkServer {
	s := &forkServer{rank: r, log: log}
	s.start()
	return s
}

// start starts the server process; a failure turns the server off.
func (s *forkServer) start() {
	s.starts++
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		s.turnOff(fmt.Sprintf("socketpair: %v", err))
		return
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "forkserver"), os.NewFile(uintptr(fds[1]), "forkserver-child")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		s.turnOff(fmt.Sprintf("control socket: %v", err))
		return
	}
	c, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		s.turnOff(fmt.Sprintf("control socket: a %T, not a unix socket", fc))
		return
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		c.Close()
		s.turnOff(err.Error())
		return
	}
	defer devnull.Close()
	env := slices.DeleteFunc(slices.Clone(s.rank.Env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == ft.IncarnationEnv || name == rankenv.CollateralFD || name == forkServerFDEnv || strings.HasPrefix(name, "PMI_")
	})
	env = append(env, forkServerFDEnv+"=3")
	p, err := os.StartProcess(s.rank.Path, []string{s.rank.Path, "-c", "import sys; from gorun._forkserver import main; sys.exit(main())"},
		&os.ProcAttr{
			Dir: s.rank.Dir, Env: env, Files: []*os.File{devnull, devnull, os.Stderr, theirs},
			Sys: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
		})
	if err != nil {
		c.Close()
		s.turnOff(fmt.Sprintf("start %s: %v", s.rank.Path, err))
		return
	}
	s.pid, s.conn, s.ready = p.Pid, c, false
	p.Release() // reaped by the supervisor's wait4(-1), or by stop
	s.log.Debug().Int("pid", s.pid).Str("python", s.rank.Path).Msg("fork server started")
}

// turnOff stops using the server for the rest of the job, saying why.
func (s *forkServer) turnOff(why string) {
	if s.off == "" {
		s.off = why
		s.log.Warn().Str("why", why).Msg("fork server off: replacements start as new processes")
	}
	s.stop()
}

// stop kills and reaps the server process and closes its socket; it is
// idempotent.
func (s *forkServer) stop() {
	if s == nil {
		return
	}
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	if s.pid > 0 {
		_ = syscall.Kill(s.pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		for {
			// The server is our child; a wait4(-1) may have reaped it
			// already (ECHILD).
			if _, err := syscall.Wait4(s.pid, &ws, 0, nil); !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		s.pid = 0
	}
}

// forkReply is one message from the server.
type forkReply struct {
	Ready bool   `json:"ready"`
	PID   int    `json:"pid"`
	Error string `json:"error"`
	Fatal bool   `json:"fatal"`
}

// read reads one message, waiting until deadline.
func (s *forkServer) read(deadline time.Time) (forkReply, error) {
	var rep forkReply
	buf := make([]byte, 64<<10)
	_ = s.conn.SetReadDeadline(deadline)
	n, err := s.conn.Read(buf)
	if err != nil {
		return rep, err
	}
	if n == 0 {
		return rep, errors.New("the fork server closed its socket")
	}
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		return rep, fmt.Errorf("fork server: bad message %q: %w", buf[:n], err)
	}
	return rep, nil
}

// usable reports whether the server can take a request for a rank
// running path now, reading its ready message if it came; else why not.
func (s *forkServer) usable(path string) (bool, string) {
	if s == nil {
		return false, "no fork server"
	}
	if s.off != "" {
		return false, s.off
	}
	if path != s.rank.Path {
		return false, fmt.Sprintf("the rank runs %s, the fork server %s", path, s.rank.Path)
	}
	if s.poll(); s.ready {
		return true, ""
	}
	if s.off != "" {
		return false, s.off
	}
	return false, "the fork server is still importing"
}

// poll reads the server's ready message if it has come, without waiting;
// the supervisor calls it on its tick, so that the server's state is
// known (and logged) when it changes. A server that failed to preload is
// turned off.
func (s *forkServer) poll() {
	if s == nil || s.ready || s.conn == nil || s.off != "" {
		return
	}
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 64<<10)
	var n int
	var rerr error
	_ = rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT)
		return true // never wait
	})
	switch {
	case errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EINTR):
		return
	case rerr != nil:
		s.lost(rerr)
		return
	case n == 0:
		// EOF: the server ended; its reaping (died) starts it again.
		s.lost(errors.New("the fork server closed its socket"))
		return
	}
	var rep forkReply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		s.lost(fmt.Errorf("fork server: bad message %q: %w", buf[:n], err))
		return
	}
	if rep.Error != "" {
		s.turnOff(rep.Error)
		return
	}
	s.ready = true
	s.log.Debug().Int("pid", rep.PID).Msg("fork server ready")
}

func (s *forkServer) lostWhy(err error) string {
	return fmt.Sprintf("the fork server was lost: %v", err)
}

// died is told that the server process was reaped: it must not be
// killed or waited for by pid again.
func (s *forkServer) died() {
	s.pid = 0
	s.lost(errors.New("its process ended"))
}

// lost drops a server that died or broke the protocol, and starts it
// again at once (within forkServerStarts), so that it has imported what it
// preloads by the next failure.
func (s *forkServer) lost(err error) {
	s.stop()
	if s.off != "" {
		return
	}
	if s.starts >= forkServerStarts {
		s.turnOff(fmt.Sprintf("started %d times and lost each time (last: %v)", s.starts, err))
		return
	}
	s.log.Warn().Err(err).Msg("fork server lost; starting it again")
	s.start()
}

// spawn asks the server for a replacement running argv with env in dir,
// with files as its descriptors 0, 1, ... . It returns the replacement's
// pid and the write end of its go pipe: the caller records the pid, then
// writes "g" to it and closes it (closing it unwritten makes the
// replacement exit without running anything).
func (s *forkServer) spawn(argv, env []string, dir string, files []*os.File) (int, *os.File, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return 0, nil, err
	}
	goR, goW := os.NewFile(uintptr(p[0]), "go"), os.NewFile(uintptr(p[1]), "go")
	defer goR.Close()
	targets := make([]int, len(files))
	fds := make([]int, 0, len(files)+1)
	for i, f := range files {
		targets[i] = i
		fds = append(fds, int(f.Fd()))
	}
	fds = append(fds, int(goR.Fd()))
	msg, err := json.Marshal(struct {
		Argv []string `json:"argv"`
		Env  []string `json:"env"`
		Dir  string   `json:"dir"`
		FDs  []int    `json:"fds"`
	}{argv, env, dir, targets})
	if err != nil {
		goW.Close()
		return 0, nil, err
	}
	// One deadline for the whole request, write and answer: the
	// supervisor's loop waits meanwhile, and must beat within its lease.
	deadline := time.Now().Add(forkServerWait)
	_ = s.conn.SetWriteDeadline(deadline)
	if _, _, err := s.conn.WriteMsgUnix(msg, syscall.UnixRights(fds...), nil); err != nil {
		goW.Close()
		s.lost(err)
		return 0, nil, errors.New(s.lostWhy(err))
	}
	rep, err := s.read(deadline)
	if err != nil {
		// A late answer would be out of step with the next request: the
		// server goes, and a child it forks meanwhile finds its go pipe
		// closed.
		goW.Close()
		s.lost(err)
		return 0, nil, errors.New(s.lostWhy(err))
	}
	if rep.Error != "" {
		goW.Close()
		if rep.Fatal {
			s.turnOff(rep.Error)
		}
		return 0, nil, errors.New(rep.Error)
	}
	return rep.PID, goW, nil
}

// startForked starts kept rank kr's next incarnation through the fork
// server; ok is false when the server cannot (the caller starts it as a
// new process). register records the pid before the replacement runs.
func (a *supervisor) startForked(kr *keptRank, env []string, files []*os.File, register func(pid int)) (ok bool) {
	s := a.ft.fork
	if yes, why := s.usable(kr.spec.Path); !yes {
		if s != nil {
			s.log.Debug().Int("rank", kr.spec.Rank).Str("why", why).Msg("replacement not forked")
		}
		return false
	}
	dir := kr.spec.Dir
	if dir == "" {
		// As os.StartProcess would: the supervisor's own directory.
		dir, _ = os.Getwd()
	}
	t0 := time.Now()
	pid, goW, err := s.spawn(kr.spec.Argv, env, dir, files)
	if err != nil {
		s.log.Warn().Int("rank", kr.spec.Rank).Err(err).Msg("replacement not forked; starting it as a new process")
		return false
	}
	s.log.Debug().Int("rank", kr.spec.Rank).Int("pid", pid).Dur("took", time.Since(t0)).Msg("replacement forked")
	register(pid)
	_, werr := goW.Write([]byte("g"))
	goW.Close()
	if werr != nil {
		// It cannot have gone past its wait: it exits, and is reaped
		// as the rank's exit.
		s.log.Warn().Int("rank", kr.spec.Rank).Err(werr).Msg("forked replacement lost before it ran")
	}
	return true
}
