package launcher

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Job is what a user asks gorun for: a program and where to run it.
type Job struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH
	// unless it contains a slash.
	Argv []string
	// NP, Hosts, Oversubscribe, GPUsPerHost and Export are as in
	// PlanConfig, except that NP 0 without Hosts means one rank per CPU.
	NP            int
	Hosts         []Host
	Oversubscribe bool
	GPUsPerHost   int
	Export        []string
}

// Launch plans and runs a job. When every host is this machine it checks
// that the program can run, reserves ports, plans, and runs the plan under
// one local agent. When a host is another machine (or Config.Starter is
// StartSrun) it starts one host agent per host and runs the job through
// them (remote.go). The error is nil when every rank exited 0; otherwise it
// is one of *RankExitError, *StartError, *TimeoutError, *InterruptedError,
// *ProgramError, *SlotsError, *AgentError, *HostError, *VersionError,
// *AgentLostError, or a configuration or context error.
func Launch(ctx context.Context, cfg Config, job Job) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(job.Argv) == 0 {
		return errors.New("launcher: no program given")
	}
	id := DetectLocal()
	if isMulti(cfg, job.Hosts, id) {
		return launchMulti(ctx, cfg, job, id)
	}
	if len(job.Hosts) == 0 && job.NP == 0 {
		// No host list and no -np: one rank per CPU, as mpirun does on a
		// single machine.
		job.NP = runtime.NumCPU()
	}
	path, err := ResolveProgram(job.Argv[0], cfg.Dir)
	if err != nil {
		return err
	}
	if cfg.PMI != PMINone {
		// Open MPI would form one singleton per rank (mpilib.go).
		if err := checkMPILibrary(job.Argv[0], path); err != nil {
			return err
		}
	}
	jobID, secret, err := NewJobIdentity()
	if err != nil {
		return err
	}
	ports, err := ReservePorts()
	if err != nil {
		return err
	}
	defer ports.Release()
	plan, err := NewPlan(PlanConfig{
		NP: job.NP, Hosts: job.Hosts, Oversubscribe: job.Oversubscribe,
		GPUsPerHost: job.GPUsPerHost, Export: job.Export,
		JobID: jobID, Secret: secret,
		// Every host is this machine, so loopback reaches rank 0 whatever
		// name the user wrote.
		MasterAddr: "127.0.0.1",
		MasterPort: ports.MasterPort, RdzvPort: ports.RdzvPort,
		NoPMI: cfg.PMI == PMINone,
	})
	if err != nil {
		return err
	}
	cfg.Logger.Info().Str("job", plan.JobID).Int("world", plan.WorldSize).Int("nodes", len(plan.Nodes)).
		Str("master", joinHostPort(plan.MasterAddr, plan.MasterPort)).Str("rdzv", plan.RdzvEndpoint).
		Str("program", path).Msg("launching")
	return Run(ctx, cfg, plan, Program{Path: path, Argv: job.Argv}, ports)
}

// Program is the resolved program every rank runs.
type Program struct {
	// Path is the executable's path (see ResolveProgram).
	Path string
	// Argv is the argument list, Argv[0] as the user wrote it.
	Argv []string
}

// ResolveProgram finds the executable for name the way a shell does: a name
// with a slash is a path (relative to dir when dir is set), other names are
// looked up in PATH. Anything that could not be executed is a *ProgramError,
// found before any rank starts.
func ResolveProgram(name, dir string) (string, error) {
	if name == "" {
		return "", &ProgramError{Program: name, Err: errors.New("empty program name")}
	}
	if !containsSlash(name) {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", &ProgramError{Program: name, Err: errors.New("command not found in PATH")}
		}
		return p, nil
	}
	p := name
	if dir != "" && !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", &ProgramError{Program: name, Err: errors.New("no such file")}
	case err != nil:
		return "", &ProgramError{Program: name, Err: err}
	case st.IsDir():
		return "", &ProgramError{Program: name, Err: errors.New("is a directory")}
	case unix.Access(p, unix.X_OK) != nil || st.Mode()&0o111 == 0:
		return "", &ProgramError{Program: name, Err: errors.New("permission denied (not executable)")}
	}
	return p, nil
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return true
		}
	}
	return false
}

// Run executes a plan on this machine and returns when every rank and every
// process a rank started is gone. ports, when not nil, is released right
// before the ranks start, so the ports stay taken until rank 0 can bind
// them.
//
// Run starts one agent process (see agent.go for why) that is the parent of
// every rank; output flows through pipes straight from the ranks to Run's
// goroutines, and the agent reports starts and exits. The first failure
// ends the job: SIGTERM to every other rank's process group, SIGKILL after
// Grace.
func Run(ctx context.Context, cfg Config, plan *Plan, prog Program, ports *PortReservation) (err error) {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if IsAgent() {
		// The agent executable's main did not dispatch to AgentMain and is
		// now launching again: refuse, or every level would start another.
		return ErrAgentNotDispatched
	}
	r := &runner{cfg: cfg, plan: plan, log: cfg.Logger, fences: pmiFences{hosts: 1}}
	defer ports.Release()
	defer r.closeAll()
	defer r.removeFlight() // on every return, once prepareRanks made it

	if err := r.prepareOutput(); err != nil {
		return err
	}
	spec, err := r.prepareRanks(prog)
	if err != nil {
		return err
	}
	if err := r.startAgent(); err != nil {
		return err
	}
	r.startStreams()

	ports.Release()
	if err := r.send(spec); err != nil {
		r.agentErr = err
	}
	r.sendCmd = func(c agentCmd) { _ = r.send(c) }
	r.killGroup = func(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
	start := time.Now()
	err = r.loop(ctx)
	r.finish()
	if err != nil && !r.flightPrinted {
		r.printFlight("the job failed", start)
	}
	return err
}

// runner is the state of one Run. Fields are owned by Run's goroutine
// unless noted.
type runner struct {
	cfg  Config
	plan *Plan
	log  zerolog.Logger

	// files are closed by closeAll; childFiles are closed right after the
	// agent started (the agent holds its copies).
	files      []*os.File
	childFiles []*os.File
	extra      []*os.File // the agent's inherited descriptors, from fd 3

	logFiles []*lineSink
	stdout   *lineSink
	stderr   *lineSink
	streams  []*streamer

	stdinCopy   func() // starts the copy goroutine; nil when not copying
	stdinCancel func() // ends it

	agent   *exec.Cmd
	ctrl    *os.File // write end of the agent's stdin
	evR     *os.File
	events  chan agentEvent
	wg      sync.WaitGroup // streams, stdin copier, event reader
	agentWG sync.WaitGroup // the agent's Wait

	agentErr error
	// agentsLeft counts the agents that have not yet reported "done" or
	// been lost; the loop ends when it reaches 0 (one agent when 0 at
	// start, as in a single-host run).
	agentsLeft int
	// sendCmd delivers a command to the agent; loop's only way to act, so
	// tests can drive loop with a fake agent.
	sendCmd func(agentCmd)
	// killGroup SIGKILLs a rank's process group directly, for when the
	// agent is gone; a hook so fake-agent tests never signal real pids.
	killGroup func(pgid int)
	// fences gathers the supervisors' PMI barriers (pmi.go); hosts is
	// the number of supervisors.
	fences pmiFences
	// flightDir holds the ranks' flight records (flight.go); flightTemp
	// is the same directory when Run made it and removes it.
	flightDir, flightTemp string
	flightPrinted         bool // the --timeout table was printed
}

// prepareOutput opens the per-rank log files.
func (r *runner) prepareOutput() error {
	r.stdout = &lineSink{w: r.cfg.Stdout}
	r.stderr = &lineSink{w: r.cfg.Stderr}
	if r.cfg.OutputDir == "" {
		return nil
	}
	if err := os.MkdirAll(r.cfg.OutputDir, 0o755); err != nil {
		return fmt.Errorf("launcher: output dir: %w", err)
	}
	for _, rs := range r.plan.Ranks {
		f, err := os.Create(filepath.Join(r.cfg.OutputDir, "rank."+strconv.Itoa(rs.Rank)+".log"))
		if err != nil {
			return fmt.Errorf("launcher: output dir: %w", err)
		}
		r.files = append(r.files, f)
		r.logFiles = append(r.logFiles, &lineSink{w: f})
	}
	return nil
}

// addExtra registers f as inherited by the agent and returns its number
// there.
func (r *runner) addExtra(f *os.File) int {
	r.extra = append(r.extra, f)
	r.childFiles = append(r.childFiles, f)
	return 2 + len(r.extra)
}

// prepareRanks creates each rank's pipes and the agent's spec.
func (r *runner) prepareRanks(prog Program) (*agentSpec, error) {
	base := r.cfg.Env
	if base == nil {
		base = os.Environ()
	}
	base = scrubLaunchEnv(base)
	if v := r.prepareFlight(); v != "" {
		base = mergeEnv(base, []string{v})
	}
	spec := &agentSpec{Grace: r.cfg.Grace, LogLevel: r.log.GetLevel(), RemoveDir: r.flightTemp}
	pj, err := pmiJobFor(r.plan, r.cfg.PMI)
	if err != nil {
		return nil, err
	}
	spec.PMI = pj
	var now func() time.Time
	if r.cfg.TimestampOutput {
		now = time.Now
	}
	tag := r.cfg.TagOutput || r.cfg.OutputDir != ""
	for i, rs := range r.plan.Ranks {
		ar := agentRank{
			Rank: rs.Rank, Path: prog.Path, Argv: prog.Argv, Dir: r.cfg.Dir, Stdin: -1,
			Env: mergeEnv(base, rs.Env),
		}
		if rs.Rank == 0 && r.cfg.Stdin != nil {
			fd, err := r.prepareStdin()
			if err != nil {
				return nil, err
			}
			ar.Stdin = fd
		}
		for _, s := range []struct {
			fd   *int
			sink *lineSink
		}{{&ar.Stdout, r.stdout}, {&ar.Stderr, r.stderr}} {
			pr, pw, err := os.Pipe()
			if err != nil {
				return nil, fmt.Errorf("launcher: pipe: %w", err)
			}
			r.files = append(r.files, pr)
			growPipe(pr)
			*s.fd = r.addExtra(pw)
			st := &streamer{rank: rs.Rank, r: pr, term: s.sink, tag: tag, now: now}
			if r.logFiles != nil {
				st.file = r.logFiles[i]
			}
			r.streams = append(r.streams, st)
		}
		spec.Ranks = append(spec.Ranks, ar)
	}
	return spec, nil
}

// prepareStdin returns the agent descriptor that becomes rank 0's stdin.
func (r *runner) prepareStdin() (int, error) {
	src := r.cfg.Stdin
	if f, ok := src.(*os.File); ok {
		if !isTerminal(f) {
			// A file, pipe or /dev/null: hand it over, nothing to copy.
			r.extra = append(r.extra, f)
			return 2 + len(r.extra), nil
		}
		// A terminal: a rank in its own process group would be stopped
		// by SIGTTIN reading it, so gorun reads and forwards. Reopening
		// through /proc gives a separate open file description, so
		// O_NONBLOCK (which makes the read cancellable) does not leak to
		// the shell that shares the terminal.
		tf, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err == nil && tf.SetReadDeadline(time.Time{}) != nil {
			tf.Close()
			err = errors.New("terminal not pollable")
		}
		if err != nil {
			// A copy that cannot be interrupted would keep Run from
			// returning; hand the terminal over and accept that rank 0
			// may be stopped by SIGTTIN if it reads.
			r.log.Debug().Err(err).Msg("cannot forward the terminal; rank 0 gets it directly")
			r.extra = append(r.extra, f)
			return 2 + len(r.extra), nil
		}
		r.files = append(r.files, tf)
		src = tf
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("launcher: pipe: %w", err)
	}
	r.files = append(r.files, pw)
	fd := r.addExtra(pr)
	r.stdinCopy = func() {
		r.wg.Go(func() {
			_, _ = io.Copy(pw, src)
			pw.Close() // rank 0 sees EOF
		})
	}
	r.stdinCancel = func() {
		if d, ok := src.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = d.SetReadDeadline(time.Unix(1, 0))
		}
		pw.Close()
	}
	return fd, nil
}

func (r *runner) startAgent() error {
	cmd, ctrlW, evR, err := startSupervisor(r.cfg.AgentPath, r.extra, r.cfg.Stderr)
	if err != nil {
		return err
	}
	r.files = append(r.files, ctrlW, evR)
	r.ctrl, r.evR = ctrlW, evR
	r.agent = cmd
	for _, f := range r.childFiles {
		f.Close()
	}
	r.childFiles = nil
	r.agentWG.Go(func() { _ = cmd.Wait() })

	r.events = make(chan agentEvent, 4*len(r.plan.Ranks)+4)
	r.wg.Go(func() {
		defer close(r.events)
		readEvents(evR, func(ev agentEvent) { r.events <- ev })
	})
	return nil
}

// readEvents decodes the agent's event lines until EOF.
func readEvents(evR io.Reader, f func(agentEvent)) {
	sc := bufio.NewScanner(evR)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev agentEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		f(ev)
	}
}

// startSupervisor starts the per-job agent process (agentPath, "" for this
// executable) with extra as its descriptors from 3 on, and returns it with
// the write end of its command pipe and the read end of its event pipe.
// The caller waits for the process and closes both pipes.
func startSupervisor(agentPath string, extra []*os.File, stderr io.Writer) (*exec.Cmd, *os.File, *os.File, error) {
	// /proc/self/exe is the running binary even when its file was replaced
	// or deleted since (a `make build` during a long job).
	path, argv0 := agentPath, agentPath
	if path == "" {
		path, argv0 = "/proc/self/exe", os.Args[0]
	}
	ctrlR, ctrlW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("launcher: pipe: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		ctrlR.Close()
		ctrlW.Close()
		return nil, nil, nil, fmt.Errorf("launcher: pipe: %w", err)
	}
	defer ctrlR.Close()
	defer evW.Close()

	cmd := &exec.Cmd{
		Path:       path,
		Args:       []string{argv0},
		Env:        append(os.Environ(), agentEnv+"="+agentProtocol),
		Stdin:      ctrlR,
		Stdout:     evW,
		Stderr:     stderr,
		ExtraFiles: extra,
		// Its own process group: Ctrl-C at the terminal and a kill of
		// gorun's group must not take the agent down before it cleaned up.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		ctrlW.Close()
		evR.Close()
		return nil, nil, nil, &AgentError{Err: err}
	}
	return cmd, ctrlW, evR, nil
}

func (r *runner) startStreams() {
	for _, s := range r.streams {
		r.wg.Go(s.run)
	}
	if r.stdinCopy != nil {
		r.stdinCopy()
	}
}

// send writes one protocol message to the agent.
func (r *runner) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = r.ctrl.Write(append(b, '\n'))
	return err
}

// rankState is what Run knows of one rank. A rank counts as live from the
// moment the spec is sent until the agent reports its exit: the agent starts
// every rank before it reads any command, so a signal sent to "all ranks"
// reaches ranks whose "started" event is still in flight.
type rankState struct {
	pid    int
	exited bool
	// stopped is set when gorun signaled the rank: its exit is then a
	// consequence of the teardown, not a failure of its own.
	stopped bool
}

// failure is one rank that failed on its own.
type failure struct {
	rank, pid, code int
	signal          syscall.Signal
	startErr        error
	// lost is set when the rank's host agent was lost, with lostRanks
	// ranks from rank on.
	lost      error
	lostRanks int
	// mpi is set when the rank failed through PMI: MPI_Abort, or an exit
	// 0 without PMI finalize (pmi.go).
	mpi *MPIError
}

func (f failure) exitCode() int {
	if f.mpi != nil {
		return f.mpi.ExitCode()
	}
	if f.lost != nil {
		return 255
	}
	if f.startErr != nil {
		return 127
	}
	if f.signal != 0 {
		return 128 + int(f.signal)
	}
	return f.code
}

// stopReason says why the job is being torn down.
type stopReason int

const (
	notStopping stopReason = iota
	stopFailure
	stopTimeout
	stopSignal
	stopContext
)

// loop handles agent events, signals and timers until the agent reports
// that everything is gone.
func (r *runner) loop(ctx context.Context) error {
	ranks := make([]rankState, len(r.plan.Ranks))
	var (
		failures []failure
		reason   stopReason
		stopSig  syscall.Signal // the signal gorun received, for stopSignal
		sentSig  syscall.Signal // the signal the teardown sent the ranks
		stopped  int            // ranks gorun signaled that were running
		grace    <-chan time.Time
		timeout  <-chan time.Time
		killed   bool
		done     bool
	)
	if r.cfg.Timeout > 0 {
		t := time.NewTimer(r.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var graceTimer *time.Timer
	defer func() {
		if graceTimer != nil {
			graceTimer.Stop()
		}
	}()

	// stop begins the teardown: sig to every running rank's group, SIGKILL
	// after the grace period.
	stop := func(why stopReason, sig syscall.Signal) {
		if reason != notStopping {
			return
		}
		reason = why
		sentSig = sig
		for i := range ranks {
			if !ranks[i].exited {
				ranks[i].stopped = true
			}
		}
		r.log.Debug().Stringer("signal", sig).Msg("stopping the job")
		r.sendCmd(agentCmd{Op: "signal", Signal: int(sig)})
		graceTimer = time.NewTimer(r.cfg.Grace)
		grace = graceTimer.C
	}
	kill := func() {
		if !killed {
			killed = true
			r.sendCmd(agentCmd{Op: "kill"})
		}
	}
	ctxDone := ctx.Done()
	var flightTimer <-chan time.Time   // SIGUSR2: when to merge the ranks' dumps
	var timeoutFlight <-chan time.Time // --timeout: when to merge them and stop
	var flightAsked time.Time

	for !done {
		select {
		case ev, ok := <-r.events:
			if !ok {
				if r.agentErr == nil {
					r.agentErr = errors.New("agent exited before reporting the end of the job")
				}
				done = true
				break
			}
			if ev.Ev != "done" && ev.Ev != "lost" && (ev.Rank < 0 || ev.Rank >= len(ranks)) {
				r.log.Warn().Int("rank", ev.Rank).Str("ev", ev.Ev).Msg("agent reported an unknown rank; ignored")
				continue
			}
			switch ev.Ev {
			case "started":
				ranks[ev.Rank].pid = ev.PID
				r.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Msg("rank started")
			case "failed":
				ranks[ev.Rank].exited = true
				failures = append(failures, failure{rank: ev.Rank, startErr: errors.New(ev.Err)})
				r.log.Debug().Int("rank", ev.Rank).Str("err", ev.Err).Msg("rank could not start")
				stop(stopFailure, syscall.SIGTERM)
			case "exited":
				st := &ranks[ev.Rank]
				st.exited = true
				r.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Int("code", ev.Code).Int("signal", ev.Signal).Msg("rank exited")
				if (ev.Code != 0 || ev.Signal != 0) && !(st.stopped && causedByStop(ev, sentSig)) {
					failures = append(failures, failure{rank: ev.Rank, pid: ev.PID, code: ev.Code, signal: syscall.Signal(ev.Signal)})
					stop(stopFailure, syscall.SIGTERM)
				} else if ev.Unfinalized && !st.stopped {
					failures = append(failures, failure{rank: ev.Rank, pid: ev.PID, code: 1, mpi: &MPIError{Rank: ev.Rank, PID: ev.PID}})
					stop(stopFailure, syscall.SIGTERM)
				}
			case "pmi-fence":
				if cmd, ok, err := r.fences.add(ev); err != nil {
					r.log.Error().Err(err).Msg("PMI barrier")
					failures = append(failures, failure{rank: ev.Rank, startErr: fmt.Errorf("%w: %v", errPMIProtocol, err)})
					stop(stopFailure, syscall.SIGTERM)
				} else if ok {
					r.log.Debug().Int("epoch", cmd.Epoch).Int("keys", len(cmd.KVS)).Msg("PMI barrier released")
					r.sendCmd(cmd)
				}
			case "pmi-abort":
				if reason == notStopping {
					pid := ranks[ev.Rank].pid
					failures = append(failures, failure{rank: ev.Rank, pid: pid, code: ev.Code,
						mpi: &MPIError{Rank: ev.Rank, PID: pid, Aborted: true, Code: ev.Code, Message: ev.Err}})
					stop(stopFailure, syscall.SIGTERM)
				}
			case "lost":
				// A host agent is gone; its ranks are, or soon will be (the
				// agent kills them when the lease runs out): count them
				// as failed.
				n := r.plan.Nodes[ev.node]
				r.log.Debug().Str("host", n.Name).Str("err", ev.Err).Msg("host lost")
				for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
					ranks[rk].exited = true
					ranks[rk].stopped = false
				}
				failures = append(failures, failure{rank: n.FirstRank, lost: errors.New(ev.Err), lostRanks: n.Ranks})
				stop(stopFailure, syscall.SIGTERM)
				r.agentsLeft--
				done = r.agentsLeft <= 0
			case "done":
				if ev.Strays > 0 {
					r.log.Warn().Int("strays", ev.Strays).Msg("ranks left processes running; they were stopped")
				}
				r.agentsLeft--
				done = r.agentsLeft <= 0
			}
		case <-timeout:
			timeout = nil
			// Ranks that keep flight records dump them first (a job that
			// runs into --timeout is usually stuck), then the job stops.
			if r.signalFlightReady() > 0 {
				flightAsked = time.Now()
				timeoutFlight = time.After(flightWait)
			} else {
				stop(stopTimeout, syscall.SIGTERM)
			}
		case <-timeoutFlight:
			timeoutFlight = nil
			r.flightPrinted = r.printFlight("--timeout", flightAsked)
			stop(stopTimeout, syscall.SIGTERM)
		case <-grace:
			grace = nil
			kill()
		case <-ctxDone:
			ctxDone = nil
			stop(stopContext, syscall.SIGTERM)
		case s := <-r.cfg.Signals:
			sig, _ := s.(syscall.Signal)
			switch sig {
			case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP:
				if reason == notStopping {
					stopSig = sig
					stop(stopSignal, sig)
				} else if sig == syscall.SIGINT {
					// The user insists: no more grace.
					kill()
				}
			case 0:
			default:
				r.sendCmd(agentCmd{Op: "signal", Signal: int(sig)})
				if sig == syscall.SIGUSR2 && r.flightDir != "" {
					// The ranks dump their flight records (comm); merge them
					// once they have had time to.
					flightAsked = time.Now()
					flightTimer = time.After(flightWait)
				}
			}
		case <-flightTimer:
			flightTimer = nil
			if !r.printFlight("SIGUSR2", flightAsked) {
				r.stderr.write([]byte("gorun: SIGUSR2: no rank wrote flight records (no communicator open?)\n"))
			}
		}
	}

	// Counted at the end: a rank whose start failure was still in flight
	// when the teardown began was never running, so it was not stopped.
	for _, st := range ranks {
		if st.stopped && st.pid > 0 {
			stopped++
		}
	}
	if r.agentErr != nil {
		// The ranks died with the agent (Pdeathsig); their process groups
		// may still hold children, which nobody else will stop now.
		for _, st := range ranks {
			if st.pid > 0 && !st.exited {
				r.killGroup(st.pid)
			}
		}
	}
	switch {
	case r.agentErr != nil && reason == notStopping:
		return &AgentError{Err: r.agentErr}
	case reason == stopTimeout:
		return &TimeoutError{After: r.cfg.Timeout, Stopped: stopped}
	case reason == stopSignal:
		return &InterruptedError{Signal: stopSig, Stopped: stopped}
	case reason == stopContext:
		return fmt.Errorf("launcher: job canceled; stopped %d %s: %w", stopped, plural(stopped, "rank", "ranks"), ctx.Err())
	case len(failures) > 0:
		f := pickFailure(failures, r.cfg.ExitPolicy)
		host := r.plan.Ranks[f.rank].Host
		if f.mpi != nil {
			e := *f.mpi
			e.Host, e.Stopped = host, stopped
			if ranks[f.rank].stopped && ranks[f.rank].pid > 0 {
				// An aborting rank waits to be ended: the teardown
				// stops it too, but it is not one of the "other" ranks.
				e.Stopped--
			}
			return &e
		}
		if f.lost != nil {
			return &AgentLostError{Host: host, FirstRank: f.rank, Ranks: f.lostRanks, Err: f.lost, Stopped: stopped}
		}
		if f.startErr != nil {
			return &StartError{Rank: f.rank, Host: host, Err: f.startErr, Stopped: stopped}
		}
		return &RankExitError{Rank: f.rank, Host: host, PID: f.pid, Code: f.code, Signal: f.signal, Stopped: stopped}
	}
	return nil
}

// causedByStop reports whether a stopped rank's exit is the teardown's
// doing: death by the signal gorun sent or by SIGKILL, or the exit code
// 128+signal that shells and many handlers use. Any other failure of a rank
// that was being stopped is its own and competes under ExitLowest and
// ExitMax (under ExitFirst the first failure always wins anyway).
func causedByStop(ev agentEvent, sent syscall.Signal) bool {
	return ev.Signal == int(sent) || ev.Signal == int(syscall.SIGKILL) || (ev.Signal == 0 && ev.Code == 128+int(sent))
}

// pickFailure applies the exit policy to the failures in arrival order.
func pickFailure(fs []failure, policy ExitPolicy) failure {
	best := fs[0]
	for _, f := range fs[1:] {
		switch policy {
		case ExitLowest:
			if f.rank < best.rank {
				best = f
			}
		case ExitMax:
			if f.exitCode() > best.exitCode() {
				best = f
			}
		}
	}
	return best
}

// finish waits for the agent, the streams and the stdin copier. Once the
// agent reported "done" every writer of the rank pipes is dead and the
// streams end on EOF; if the agent died instead, a stray holding a pipe
// could keep a stream open, so the pipes are closed after the grace period.
func (r *runner) finish() {
	if r.ctrl != nil {
		r.ctrl.Close()
	}
	if r.stdinCancel != nil {
		r.stdinCancel()
	}
	r.agentWG.Wait()
	streamsDone := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(streamsDone)
	}()
	t := time.NewTimer(r.cfg.Grace + time.Second)
	defer t.Stop()
	select {
	case <-streamsDone:
	case <-t.C:
		r.closeAll()
		<-streamsDone
	}
}

// closeAll closes every descriptor Run opened; safe to call twice.
func (r *runner) closeAll() {
	for _, f := range r.files {
		f.Close()
	}
	for _, f := range r.childFiles {
		f.Close()
	}
}

// mergeEnv concatenates environment lists where a later NAME=VALUE replaces
// an earlier one. The agent starts ranks with os.StartProcess, which passes
// duplicates through, and C's getenv (like Go's) returns the first: without
// this, a RANK inherited from gorun's own environment would shadow the
// plan's.
func mergeEnv(lists ...[]string) []string {
	last := map[string]int{}
	n := 0
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			last[k] = n
			n++
		}
	}
	out := make([]string, 0, len(last))
	i := 0
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if last[k] == i {
				out = append(out, kv)
			}
			i++
		}
	}
	return out
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
