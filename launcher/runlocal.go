package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/output"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/ports"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// ErrSupervisorNotDispatched is returned by RunLocal in a process that was
// started as a per-job supervisor but whose main did not call
// supervisor.Is/supervisor.Main first.
var ErrSupervisorNotDispatched = errors.New("launcher: started as the job supervisor, but main does not call supervisor.Is and supervisor.Main (package launcher/supervisor) first")

// RunLocal executes a plan on this machine and returns when every rank and
// every process a rank started is gone. reserved, when not nil, is released
// right before the ranks start, so the ports stay taken until rank 0 can
// bind them.
//
// RunLocal starts one supervisor process (see launcher/supervisor for why)
// that is the parent of every rank; output flows through pipes straight
// from the ranks to RunLocal's goroutines, and the supervisor reports
// starts and exits to the job loop (jobloop.go) through a localHome. Its
// steps: the spec and the ranks' pipes (addLocalRanks), the supervisor's
// start, the job loop, and the teardown (finishLocal).
func RunLocal(ctx context.Context, cfg Config, plan *Plan, prog Program, reserved *ports.Reservation) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if supervisor.Is() {
		// The supervisor executable's main did not dispatch to
		// supervisor.Main and is now launching again: refuse, or every
		// level would start another.
		return ErrSupervisorNotDispatched
	}
	defer reserved.Release()
	out, err := openJobOutput(cfg, plan)
	if err != nil {
		return err
	}
	defer out.Close()

	flight := prepareFlight(cfg, out.Stderr())
	defer flight.flightDir().Remove()
	pj, err := pmiJobFor(plan, cfg.PMI)
	if err != nil {
		return err
	}
	p := &supervisor.Pipes{Spec: wire.SupervisorSpec{Grace: cfg.Grace, LogLevel: cfg.Logger.GetLevel(), PMI: pj, RemoveDir: flight.flightDir().Temp(), Respawn: cfg.ft != nil}}
	defer p.CloseChildEnds()
	in := localStdin{src: cfg.Stdin}
	defer in.close()
	if err := addLocalRanks(p, &in, cfg, plan, prog, localBaseEnv(cfg, flight)); err != nil {
		p.CloseStreams()
		return err
	}
	// Before the supervisor starts: should it die, what its ranks left in
	// other sessions comes here rather than to init (KillLeftovers).
	supervisor.AdoptOrphans()
	sup, err := supervisor.Start(cfg.SupervisorPath, p.Extra, cfg.Stderr, plan.JobID)
	if err != nil {
		p.CloseStreams()
		return &outcome.SupervisorError{Err: err}
	}
	if p.Spec.Cgroup = sup.CgroupDir(); sup.CgroupErr() != nil {
		cfg.Logger.Debug().Err(sup.CgroupErr()).Msg("no job cgroup: a SIGKILLed supervisor's escaped descendants are found by their environment only")
	}
	p.CloseChildEnds()
	for _, s := range p.Streams {
		out.Add(s.Rank, "", s.Kind, s.R)
	}
	out.Start()
	in.start()

	reserved.Release()
	home := newLocalHome(sup, len(plan.Ranks), cfg.Lease)
	home.sendErr = sendSpec(sup.Send, &p.Spec)
	start := time.Now()
	err = (&jobLoop{cfg: cfg.loop(), plan: plan, log: cfg.Logger, home: home, flight: flight}).run(ctx)
	err = finishLocal(cfg, plan.JobID, sup, home, p, out, &in, err)
	if err != nil && !flight.printed {
		flight.print("the job failed", start)
	}
	return err
}

// localBaseEnv is the environment every local rank starts from, before
// its plan's variables: cfg.Env (this process's when nil) without another
// launcher's variables, with the flight recorder's.
func localBaseEnv(cfg Config, flight *flightRecords) []string {
	base := cfg.Env
	if base == nil {
		base = os.Environ()
	}
	base = rankenv.WithoutOtherLaunchers(base)
	if v := flight.flightDir().Env(); v != "" {
		base = mergeEnv(base, []string{v})
	}
	return base
}

// addLocalRanks adds every rank of the plan to the supervisor's spec with
// its pipes, and rank 0's stdin (in) where there is one. On an error the
// caller closes the streams made so far.
func addLocalRanks(p *supervisor.Pipes, in *localStdin, cfg Config, plan *Plan, prog Program, base []string) error {
	for _, rs := range plan.Ranks {
		stdinFD := -1
		if rs.Rank == 0 {
			var err error
			if stdinFD, err = in.prepare(p, cfg); err != nil {
				return err
			}
		}
		sr := wire.SupervisorRank{Rank: rs.Rank, Path: prog.Path, Argv: prog.Argv, Dir: cfg.Dir, Env: mergeEnv(base, rs.Env), GPU: gpuOf(rs)}
		if err := p.AddRank(sr, stdinFD); err != nil {
			return err
		}
	}
	return nil
}

// finishLocal tears a local job down once its loop returned err, and
// returns the job's error: the supervisor is told its client is done (it
// exits once its ranks are gone, which they are unless the loop failed),
// stdin stops, and the output streams drain. Once the supervisor reported
// "done" every writer of the rank pipes is dead and the streams end on
// EOF; if it died instead, a stray holding a pipe could keep a stream
// open, so the pipes are closed after the grace period.
func finishLocal(cfg Config, jobID string, sup *supervisor.Client, home *localHome, p *supervisor.Pipes, out *output.Job, in *localStdin, err error) error {
	// "bye" first: a pipe that ends without it tells the supervisor that
	// gorun died and the flight directory is left to it.
	_ = sup.Send(wire.Cmd{Op: "bye"})
	sup.CloseCommands()
	in.close()
	_ = sup.Wait()
	home.wg.Wait()
	sup.CloseEvents()
	// A supervisor that reported "done" left nothing; one that died did
	// not kill what the ranks started in other sessions (Pdeathsig ends
	// only the ranks). Those were adopted by this process: end them now,
	// before waiting on the output pipes they may hold.
	// The job's cgroup, where there is one, holds every process the job
	// started, whatever it did to its session and environment; the
	// environment scan then finds what a cgroup-less host leaves.
	n, cgErr := sup.ReleaseCgroup()
	if cgErr != nil {
		cfg.Logger.Warn().Err(cgErr).Msg("job cgroup")
	}
	if n += supervisor.KillLeftovers(jobID); n > 0 {
		cfg.Logger.Warn().Int("processes", n).Msg("killed processes the job left after its supervisor was lost")
		var se *outcome.SupervisorError
		if errors.As(err, &se) {
			se.Leftovers = n
		}
	}
	streamsDone := make(chan struct{})
	go func() {
		out.Wait()
		close(streamsDone)
	}()
	t := time.NewTimer(cfg.Grace + time.Second)
	defer t.Stop()
	select {
	case <-streamsDone:
	case <-t.C:
		out.Cut() // the pipes are the output Job's: it closes them
		<-streamsDone
	}
	p.CloseStreams()
	if lerr := out.Finish(); lerr != nil && err == nil {
		// The ranks succeeded but their record did not: the exit status
		// must say so (the line was printed when it happened).
		err = lerr
	}
	return err
}

// localHome is this machine's supervisor as the job loop's rankHome.
type localHome struct {
	sup *supervisor.Client
	ch  chan wire.Event
	// sendErr is set before the loop starts when the spec could not be
	// sent: the supervisor is gone, and this says how.
	sendErr error
	wg      sync.WaitGroup // the event reader and the lease watcher
	// silent is set by the lease watcher, before it kills a silent
	// supervisor, to how long it had been silent; read after the event
	// channel closed (the reader closes it after the kill's EOF).
	silent atomic.Int64
	lease  time.Duration
}

var _ rankHome = (*localHome)(nil)

func newLocalHome(sup *supervisor.Client, ranks int, lease time.Duration) *localHome {
	if lease <= 0 {
		lease = DefaultLease
	}
	h := &localHome{sup: sup, ch: make(chan wire.Event, 4*ranks+4), lease: lease}
	readerDone := make(chan struct{})
	h.wg.Go(func() {
		defer close(h.ch)
		defer close(readerDone)
		sup.ReadEvents(afterStarts(ranks, func(ev wire.Event) { h.ch <- ev }))
	})
	h.wg.Go(func() {
		sup.WatchLease(lease, readerDone, &h.silent)
	})
	return h
}

func (h *localHome) events() <-chan wire.Event { return h.ch }
func (h *localHome) supervisors() int          { return 1 }
func (h *localHome) command(c wire.Cmd)        { _ = h.sup.Send(c) }

// commandNode sends c to the one supervisor there is.
func (h *localHome) commandNode(_ int, c wire.Cmd) { _ = h.sup.Send(c) }

// lostWhy names how the supervisor was lost: the spec could not be sent,
// it was silent past its lease (stopped or hung) and gorun killed it, or
// it died on its own — by a signal, usually, since it never exits before
// reporting "done" otherwise.
func (h *localHome) lostWhy() error {
	if h.sendErr != nil {
		return h.sendErr
	}
	pid := h.sup.PID()
	if d := time.Duration(h.silent.Load()); d > 0 {
		return fmt.Errorf("supervisor (pid %d) was silent for %s, past its lease of %s (stopped or hung); gorun killed it and its ranks",
			pid, d.Round(time.Millisecond), h.lease)
	}
	// Its event pipe ended, so it exited or is about to: wait briefly
	// to learn how.
	waited := make(chan error, 1)
	h.wg.Go(func() { waited <- h.sup.Wait() })
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return fmt.Errorf("supervisor (pid %d) was killed by signal %d (%s); its ranks died with it", pid, int(ws.Signal()), ws.Signal())
			}
		}
		if err != nil {
			return fmt.Errorf("supervisor (pid %d) exited before reporting the end of the job: %v", pid, err)
		}
	case <-time.After(time.Second):
	}
	return fmt.Errorf("supervisor (pid %d) exited before reporting the end of the job", pid)
}

// killGroup SIGKILLs the group directly: the supervisor that would have
// is gone, and the group may still hold a rank's children.
func (h *localHome) killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }

// localStdin decides how rank 0 of a local job gets gorun's stdin.
type localStdin struct {
	src  interface{ Read([]byte) (int, error) }
	pump *stdinPump
	// pw is the write end of rank 0's stdin pipe while the pump feeds it.
	pw *os.File
	// reopened is the cancellable copy of a terminal, closed with the pump.
	reopened *os.File
	startFn  func()
}

// prepare returns the supervisor descriptor that becomes rank 0's stdin:
// -1 (/dev/null) without Config.Stdin; the file itself for a file, pipe or
// /dev/null (nothing to copy); otherwise a pipe that gorun feeds. A
// terminal is fed, not handed over: rank 0 runs in its own process group
// and would be stopped by SIGTTIN reading it.
func (s *localStdin) prepare(p *supervisor.Pipes, cfg Config) (int, error) {
	if cfg.Stdin == nil {
		return -1, nil
	}
	src := cfg.Stdin
	if f, ok := src.(*os.File); ok {
		if !isTerminal(f) {
			return p.Inherit(f, false), nil
		}
		tf, err := cancellableStdin(f)
		if err != nil {
			// A copy that cannot be interrupted would keep RunLocal from
			// returning; hand the terminal over and accept that rank 0
			// may be stopped by SIGTTIN if it reads.
			cfg.Logger.Debug().Err(err).Msg("cannot forward the terminal; rank 0 gets it directly")
			return p.Inherit(f, false), nil
		}
		s.reopened = tf
		src = tf
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	s.pw = pw
	s.startFn = func() {
		s.pump = startStdinPump(src, func(b []byte) error { _, err := pw.Write(b); return err },
			func(bool) { pw.Close() }) // rank 0 sees EOF
	}
	return p.Inherit(pr, true), nil
}

// start begins feeding rank 0, after the supervisor started.
func (s *localStdin) start() {
	if s.startFn != nil {
		s.startFn()
		s.startFn = nil
	}
}

// close stops the feed (closing the pipe ends a write rank 0 does not
// read) and releases what prepare opened. Idempotent.
func (s *localStdin) close() {
	if s.pump != nil {
		s.pump.stop(func() { s.pw.Close() })
		s.pump = nil
	}
	if s.pw != nil {
		s.pw.Close()
	}
	if s.reopened != nil {
		s.reopened.Close()
	}
}

// isTerminal reports whether f is a terminal (TCGETS succeeds).
func isTerminal(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	tty := false
	_ = rc.Control(func(fd uintptr) {
		_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		tty = err == nil
	})
	return tty
}

// mergeEnv is plan.MergeEnv (a later NAME=VALUE replaces an earlier one),
// under a name RunLocal can call: its plan parameter hides the package.
func mergeEnv(lists ...[]string) []string { return plan.MergeEnv(lists...) }
