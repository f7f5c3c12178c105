package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/collateral"
	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/internal/liveness"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// Why a separate per-job supervisor process sits between gorun and
// the ranks:
//
// The promise is that no process outlives the job, even when gorun itself is
// SIGKILLed. Pdeathsig only reaches a direct child, and process groups only
// reach processes that stay in them: a rank's grandchild that calls setsid,
// or double-forks, escapes both. The one kernel mechanism that keeps every
// descendant findable without privileges is the child subreaper
// (PR_SET_CHILD_SUBREAPER): orphans reparent to the nearest subreaper
// ancestor instead of init. But a subreaper that is SIGKILLed takes that
// property with it, so the subreaper must not be the process users kill.
//
// Hence: gorun starts one supervisor per job (the same executable, re-executed
// with supervisorEnv set), in its own process group so Ctrl-C and a kill of
// gorun's group do not reach it. The supervisor is a subreaper and the parent of
// every rank. It watches its stdin, a pipe from gorun: when gorun dies for
// any reason the kernel closes the pipe, and the supervisor SIGKILLs its whole
// subtree (found through /proc parent links, which cover setsid'd and
// reparented processes) until nothing is left, then exits. Ranks carry
// Pdeathsig=SIGKILL as a backstop should the supervisor itself be killed.
//
// Alternatives weighed: a PID namespace gives the same guarantee from the
// kernel but needs privileges; cgroup.kill needs a writable cgroup tree and
// still needs a survivor to trigger it; scanning /proc for a job env marker
// misses processes that clear their environment. So the subreaper design is
// the one that works everywhere, and a job cgroup is added where the host
// allows it (cgroup_linux.go): it covers the supervisor's own SIGKILL, with
// the supervisor's client as the survivor that triggers the kill, and
// the cgroup's reaper (reaper_linux.go) when both are killed at once. A host
// agent (package launcher/hostagent) runs the same supervisor on every
// other host of a multi-host job.
//
// The protocol is newline-delimited JSON: the client writes one
// wire.SupervisorSpec, then wire.Cmds; the supervisor writes wire.Events.
// Output does not go through the supervisor: each rank's stdout and stderr
// are pipes that the client created (Pipes) and passed down as inherited
// descriptors.

// beatEvery is how often a supervisor says it is alive (a "beat" event)
// when it has nothing else to say; clients kill a supervisor silent for
// their lease (launcher's Config.Lease, 4 s by default): a twentieth of
// the default.
const beatEvery = 200 * time.Millisecond

// supervisorEnv marks a process as the per-job supervisor. It is a
// gorun-internal name, not part of the rank environment contract.
const supervisorEnv = "GORUN_INTERNAL_SUPERVISOR"

// supervisorProtocol is the value of supervisorEnv; bumped on incompatible changes.
const supervisorProtocol = "1"

// Is reports whether this process was started as a per-job supervisor.
// Programs that embed the launcher (cmd/gorun, test binaries) check it
// first thing in main or TestMain and then call Main. A job reaper
// (reaper_linux.go) is dispatched the same way.
func Is() bool {
	v := os.Getenv(supervisorEnv)
	return v == supervisorProtocol || v == reaperProtocol
}

// Main runs the supervisor on stdin/stdout and returns the process exit
// code. Call it only when Is is true.
func Main() int {
	if os.Getenv(supervisorEnv) == reaperProtocol {
		return reaperMain()
	}
	// Pdeathsig fires when the thread that forked the child exits, not the
	// process. Locking main to its thread makes every rank's parent thread
	// live exactly as long as the supervisor.
	runtime.LockOSThread()
	log := consolelog.New(os.Stderr, zerolog.TraceLevel).With().Str("role", "supervisor").Logger()
	if err := runSupervisor(os.Stdin, os.Stdout, log); err != nil {
		log.Error().Err(err).Msg("supervisor failed")
		return 1
	}
	return 0
}

type supervisorRankState struct {
	rank    int
	pid     int
	running bool
	// frozen is the rank's /proc state ('T' stopped, 't' traced) when the
	// supervisor was told to end it, 0 if it was running: the evidence
	// that a rank its peers lost was frozen, not dead (noteFrozen).
	frozen byte
	// freezeAfter is how long the rank may stay stopped (state T) before
	// the supervisor reports it frozen (freeze.go); stoppedSince is when
	// a check first found it stopped (zero while it runs), frozenTold
	// that the report went out.
	freezeAfter  time.Duration
	stoppedSince time.Time
	frozenTold   bool
}

// supervisor is the state of one supervisor process; every field is owned by runSupervisor's
// goroutine (the main loop), so no lock is needed.
type supervisor struct {
	topo    *topologyShare // the hwloc topology shared with the ranks
	progs   programs       // what the ranks' executables are
	log     zerolog.Logger
	out     *bufio.Writer
	enc     *json.Encoder
	self    int
	ranks   []supervisorRankState
	byPID   map[int]int // pid → index in ranks
	running int
	// killing is set once everything must die now: gorun is gone, a "kill"
	// command arrived, or the supervisor was signaled.
	killing bool
	// gorunGone suppresses events: nobody reads them any more.
	gorunGone bool
	// bye: gorun said it closes the command pipe alive and removes the
	// spec's RemoveDir itself; without it, a closed pipe means gorun died.
	bye bool
	// strayDeadline is when strays get SIGKILL; zero until strays are seen.
	strayDeadline time.Time
	strays        int
	grace         time.Duration
	// pmi serves MPI's PMI to the ranks; nil when the job has none.
	pmi *PMI
	// collR is the read end of the collateral pipe (non-blocking; -1
	// when none), collBuf a partial line read from it, and coll the first
	// report of each rank (internal/collateral).
	collR   int
	collBuf []byte
	coll    map[int]collateral.Report
	// conts are the SIGCONTs owed to ranks stopped by an injected fault
	// with a duration; the ticker sends them when due.
	conts []faultCont
	// slows are the ranks an injected slow stops and continues in turn
	// (slow.go); the ticker toggles them.
	slows []slowing
	// steps is the last training step each rank reported
	// (collateral.Step), and armed the after-steps faults waiting for one
	// of their ranks to get there.
	steps map[int]int64
	armed []wire.Cmd
	// tearing is set once gorun sent the teardown signal: a rank stopped
	// then is no news (freeze.go); lastFreezeCheck paces the checks.
	tearing         bool
	lastFreezeCheck time.Time
	// lastBeat is when the last "beat" went out (the client's lease on
	// this process).
	lastBeat time.Time
	// ft keeps what a respawn needs (spec.Respawn); nil otherwise.
	ft *ftKeeper
}

// faultCont is one SIGCONT an injected stop owes a rank.
type faultCont struct {
	rank, pid, fault int
	due              time.Time
}

// runSupervisor is the supervisor process: it makes itself a subreaper,
// reads the spec from in, sets up what the ranks share (topology, the
// collateral pipe, PMI), starts every rank, then runs its loop (run),
// writing events to out, until no rank and no descendant is left.
func runSupervisor(in io.Reader, out io.Writer, log zerolog.Logger) error {
	// A write to a closed event pipe must return EPIPE, not kill the supervisor
	// before it cleaned up. Notify rather than Ignore: an ignored signal
	// stays ignored across exec, and ranks must start with SIGPIPE at its
	// default (`yes | head` relies on it).
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)
	// Descriptors passed to the supervisor (every rank's pipes) and any that
	// gorun itself inherited without close-on-exec must not reach the
	// ranks: a rank holding another rank's stdout would delay that
	// stream's EOF until the whole job ends, and user programs would see
	// stray descriptors. Each rank gets exactly its stdin, stdout, stderr.
	closeOnExecAbove(2)
	if err := setChildSubreaper(); err != nil {
		return fmt.Errorf("set child subreaper: %w", err)
	}
	sigs := make(chan os.Signal, 16)
	// SIGUSR1/2 are caught only so that they do not kill the supervisor (their
	// default action): under srun SLURM sends them to every process of the
	// step, and they are the ranks' business.
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	br := bufio.NewReader(in)
	spec, err := readSpec(br)
	if err != nil {
		return err
	}
	shareRankStrings(spec.Ranks)
	var a *supervisor
	if spec.RemoveDir != "" {
		// gorun removes it after reading the ranks' records; a gorun that
		// died first leaves it to us. Death is told by the command pipe
		// ending (or the event pipe breaking) without gorun's "bye", not
		// by our parent changing: the kernel closes a dying process's
		// descriptors before it reparents its children, so a supervisor
		// that saw the EOF and finished at once could still read the dead
		// gorun as its parent and leave the directory behind.
		parent := os.Getppid()
		defer func() {
			if (a != nil && a.gorunGone && !a.bye) || os.Getppid() != parent {
				_ = os.RemoveAll(spec.RemoveDir)
			}
		}()
	}
	if spec.Cgroup != "" {
		defer func() {
			if a != nil && a.gorunGone && !a.bye {
				if err := removeOwnCgroup(spec.Cgroup); err != nil {
					log.Warn().Err(err).Msg("could not remove the job's cgroup")
				}
			}
		}()
	}
	a = &supervisor{
		log:   log.Level(spec.LogLevel),
		out:   bufio.NewWriter(out),
		self:  os.Getpid(),
		byPID: map[int]int{},
		grace: spec.Grace,
		steps: map[int]int64{},
		progs: programs{},
	}
	a.enc = json.NewEncoder(a.out)
	a.collR = -1
	// First, so that hwloc's discovery overlaps the rest of the set-up.
	a.topo = &topologyShare{}
	a.topo.start(a.progs, spec.Ranks)
	var collW *os.File
	if len(spec.Ranks) > 0 {
		// One pipe for the whole job; every rank gets the write end.
		// Without it the job still runs: only the culprit's naming loses
		// its certainty.
		var p [2]int
		if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
			a.log.Warn().Err(err).Msg("no collateral pipe; failures are judged by exit order alone")
		} else {
			a.collR, a.coll = p[0], map[int]collateral.Report{}
			collW = os.NewFile(uintptr(p[1]), "collateral")
			defer syscall.Close(a.collR)
		}
	}
	if spec.PMI != nil && len(spec.Ranks) > 0 {
		if a.pmi, err = NewPMI(*spec.PMI, spec.Ranks, a.log); err != nil {
			return err
		}
		// After the last rank is reaped: a rank still in a barrier is
		// let go, and every connection server has ended when runSupervisor
		// returns.
		defer a.pmi.Close()
	}

	// The command reader ends when gorun closes the pipe or dies.
	cmds := make(chan wire.Cmd, 16)
	var lastCmd atomic.Int64 // UnixNano of the last line read (ClientLease)
	lastCmd.Store(time.Now().UnixNano())
	go readCommands(br, cmds, &lastCmd)

	if spec.Respawn {
		a.ft = newFTKeeper(collW)
	}
	a.startAll(spec.Ranks, collW)
	if r, ok := forkServerRank(spec.Ranks); ok && a.ft != nil {
		// After the ranks: their start comes first.
		a.ft.fork = newForkServer(r, a.log)
	}
	ReturnStartupMemory()
	if collW != nil {
		// os.StartProcess made the shared description blocking (File.Fd
		// does); a rank must never block reporting, so make it
		// non-blocking again for every holder, then drop our copy.
		_ = syscall.SetNonblock(int(collW.Fd()), true)
		collW.Close()
	}
	a.reap()
	a.flush()

	return a.run(spec, cmds, sigs, &lastCmd)
}

// readSpec reads the job's spec, the first line gorun sends.
func readSpec(br *bufio.Reader) (wire.SupervisorSpec, error) {
	var spec wire.SupervisorSpec
	line, err := br.ReadBytes('\n')
	if err != nil {
		return spec, fmt.Errorf("read spec: %w", err)
	}
	if err := json.Unmarshal(line, &spec); err != nil {
		return spec, fmt.Errorf("decode spec: %w", err)
	}
	return spec, nil
}

// readCommands reads gorun's commands, one JSON line each, into cmds and
// stamps lastCmd (ClientLease) at every line; it closes cmds when gorun
// closes the pipe or dies. The supervisor exits right after, so this
// goroutine's lifetime is the process's.
func readCommands(br *bufio.Reader, cmds chan<- wire.Cmd, lastCmd *atomic.Int64) {
	defer close(cmds)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		lastCmd.Store(time.Now().UnixNano())
		var c wire.Cmd
		if json.Unmarshal(line, &c) == nil {
			cmds <- c
		}
	}
}

// run is the supervisor's loop once its ranks started: commands, PMI
// requests, signals and its 20 ms tick, until no rank and no stray is
// left; then it reports "done".
func (a *supervisor) run(spec wire.SupervisorSpec, cmds chan wire.Cmd, sigs <-chan os.Signal, lastCmd *atomic.Int64) error {
	// The ticker drives stray scanning and is a backstop for a coalesced
	// SIGCHLD; it costs nothing measurable at this rate.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	// The lease: a "beat" at least every beatEvery, so that a client
	// that hears nothing for its lease knows this process is stopped or
	// hung, not merely quiet (Client.WatchLease).
	a.lastBeat = time.Now()
	clientJudge := liveness.Judge{PID: os.Getppid(), Lease: spec.ClientLease, Recheck: spec.ClientLease / 4, Limit: StarvedLimitX * spec.ClientLease}
	for {
		if a.running == 0 && a.ft.idle() && a.finishStrays() {
			a.finish(spec)
			return nil
		}
		select {
		case c, ok := <-cmds:
			if !ok {
				cmds = nil
				a.gorunGone = true
				a.log.Debug().Msg("gorun is gone; killing the job")
				a.killAll()
				continue
			}
			a.command(c)
		case req, ok := <-a.pmi.Requests():
			if ok {
				a.emit(a.pmi.Event(req))
			}
		case s := <-sigs:
			if s == syscall.SIGCHLD {
				a.reap()
			} else if spec.KeepOnSignal || s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
				a.log.Debug().Stringer("signal", s).Msg("supervisor signaled; gorun decides")
			} else {
				a.log.Debug().Stringer("signal", s).Msg("supervisor signaled; killing the job")
				a.killAll()
			}
		case <-tick.C:
			a.tick(spec.ClientLease, &clientJudge, time.Since(time.Unix(0, lastCmd.Load())))
		}
		a.flush()
	}
}

// tick is the supervisor's periodic work: the host agent's lease on
// gorun's side (silent: since its last command), the beat, reaping,
// step reports, due faults and SIGCONTs, and the freeze check.
func (a *supervisor) tick(clientLease time.Duration, clientJudge *liveness.Judge, silent time.Duration) {
	if clientLease > 0 && !a.killing && silent > clientLease {
		// The agent is this process's parent, on this host: the kernel
		// tells a stopped or hung one from a starved one
		// (internal/liveness); a starved one's ping will come.
		if v, why := clientJudge.Expired(silent); v != liveness.Wait {
			a.log.Warn().Dur("silent", silent).Str("evidence", why).Msg("no word from the host agent past its lease; killing the job")
			a.killAll()
		}
	} else {
		clientJudge.Heard()
	}
	if now := time.Now(); now.Sub(a.lastBeat) >= beatEvery {
		a.lastBeat = now
		a.emit(wire.Event{Ev: "beat"})
	}
	a.reap()
	// Step reports arrive at the ranks' pace; reading them on the tick
	// bounds an after-steps fault's lateness by one tick (the pipe holds
	// 64 KiB, a thousand steps' lines).
	a.readCollateral()
	a.fireArmed()
	a.sendConts(time.Now())
	a.tickSlows(time.Now())
	a.watchFrozen(time.Now())
	a.ft.pollFork()
	if a.killing {
		a.killAll()
	}
}

// finish reports the end once every rank and stray is gone, after
// removing what dead ranks can leave behind.
func (a *supervisor) finish(spec wire.SupervisorSpec) {
	// A rank killed between creating a shared-memory segment and its
	// peer's mapping it leaves the segment named; every rank is gone
	// now, so remove what dead processes left (comm names each segment
	// after its creator's pid).
	if n := comm.SweepShm(comm.DefaultEndpointConfig().ShmDir); n > 0 {
		a.log.Debug().Int("segments", n).Msg("removed shared memory left by dead ranks")
	}
	// Likewise the scheduling cgroup crowded ranks on libgorun join
	// (comm.JoinSchedGroup), if the last one out died in it.
	if len(spec.Ranks) > 0 {
		if job := envValue(spec.Ranks[0].Env, rankenv.JobID, ""); job != "" {
			if err := comm.RemoveSchedGroup(job); err != nil {
				a.log.Warn().Err(err).Msg("could not remove the job's scheduling cgroup")
			}
		}
	}
	a.emit(wire.Event{Ev: "done", Strays: a.strays})
	a.flush()
}

func (a *supervisor) startAll(ranks []wire.SupervisorRank, collW *os.File) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		devnull = nil
	}
	fileFor := func(fd int) *os.File {
		if fd < 0 {
			return devnull
		}
		return os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", fd))
	}
	// One hwloc topology for the host's ranks (topology.go), made while
	// the supervisor set up; the ranks keep their copies of its
	// descriptor, ours goes when all started.
	topo := a.topo
	defer topo.close()
	topoDeadline := time.Now().Add(topologyWait)
	lastFlush := time.Now()
	// Every rank this agent starts runs on its host: local rank i of
	// len(ranks) (see bind.go).
	shares := CPUShares(len(ranks))
	crowded := shares == nil && oversubscribed(len(ranks))
	for i, r := range ranks {
		var cpus []int
		if shares != nil && bindPolicy(r.Env) == BindAuto {
			cpus = shares[i]
		}
		stdin, stdout, stderr := fileFor(r.Stdin), fileFor(r.Stdout), fileFor(r.Stderr)
		files, env := []*os.File{stdin, stdout, stderr}, r.Env
		if r.GPU != nil {
			env = visibleDevice(env, *r.GPU, os.Getenv(rankenv.CUDAVisibleDevices))
		}
		// Oversubscribed ranks on gorun's runtime (or all, or none, as
		// GORUN_SESSION says) share this process's session (bind.go).
		own := ownSession(crowded, r.Env, func() bool { return a.progs.of(r.Path).onRuntime() })
		if crowded {
			env = goMaxProcsEnv(env)
		}
		if a.pmi != nil {
			var pmiEnd *os.File
			pmiEnd, env = a.pmi.RankSetup(r.Rank, env)
			if pmiEnd != nil {
				files = append(files, pmiEnd) // descriptor pmiRankFD
			}
		}
		// An inherited value (gorun run from a rank of another gorun)
		// names a descriptor this rank does not have; C's getenv and Go's
		// return the first of duplicates, so it is removed, not shadowed.
		env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
			return strings.HasPrefix(kv, rankenv.CollateralFD+"=")
		})
		if collW != nil {
			env = append(env, rankenv.CollateralFD+"="+strconv.Itoa(len(files)))
			files = append(files, collW)
		}
		files, env = a.topologyFor(topo, topoDeadline, r, files, env)
		p, err := startBound(cpus, func() (*os.Process, error) {
			return os.StartProcess(r.Path, r.Argv, &os.ProcAttr{
				Dir:   r.Dir,
				Env:   env,
				Files: files,
				Sys: &syscall.SysProcAttr{
					// Own session, and so its own process group: SIGTERM and
					// SIGKILL to the group reach the rank and the children it
					// did not move elsewhere. A session rather than only a
					// group (as Hydra does): with the kernel's autogroup
					// scheduling (sched_autogroup_enabled, on by default in
					// desktop and Debian kernels) each session is scheduled
					// as one unit, so ranks sharing gorun's session would
					// share one CPU share against every other session on a
					// busy machine — measured here: 16 MPICH ranks took
					// 1.1-2.4 s to start under gorun against 0.75 s under
					// Hydra, the same CPU time. No controlling terminal
					// either: a rank that opens /dev/tty fails at once
					// instead of stopping on SIGTTIN. Except when the host
					// is oversubscribed: then the ranks lead their own
					// process groups in one session (see bind.go).
					Setsid:    own,
					Setpgid:   !own,
					Pdeathsig: syscall.SIGKILL,
				},
			})
		})
		if err == nil {
			a.ft.keep(r, stdout, stderr)
		}
		// The rank holds its own copies now; ours would keep gorun's
		// readers from seeing EOF.
		for _, f := range []*os.File{stdin, stdout, stderr} {
			if f != devnull && f != nil {
				f.Close()
			}
		}
		if a.pmi != nil {
			a.pmi.Started(r.Rank)
		}
		if err != nil {
			a.emit(wire.Event{Ev: "failed", Rank: r.Rank, Err: err.Error()})
			continue
		}
		a.byPID[p.Pid] = len(a.ranks)
		a.ranks = append(a.ranks, supervisorRankState{rank: r.Rank, pid: p.Pid, running: true, freezeAfter: freezeAfter(r.Env)})
		a.running++
		a.emit(wire.Event{Ev: "started", Rank: r.Rank, PID: p.Pid})
		if len(a.ranks)%32 == 0 || time.Since(lastFlush) >= beatEvery {
			// Large jobs, and any job on a loaded machine, take a while
			// to start: let gorun learn pids as they come rather than all
			// at the end, and hear from us within its lease.
			a.flush()
			lastFlush = time.Now()
		}
		// Reaping goes through wait4(-1), which also collects adopted
		// orphans; the pidfd that os keeps is not needed.
		p.Release()
	}
	if devnull != nil {
		devnull.Close()
	}
}

// topologyFor hands rank r the host's hwloc topology (topology.go) when
// its program wants one and it is ready by deadline; it says once, at
// debug level, whether the ranks read it from gorun or discover it
// themselves.
func (a *supervisor) topologyFor(topo *topologyShare, deadline time.Time, r wire.SupervisorRank, files []*os.File, env []string) ([]*os.File, []string) {
	if !topo.wants(a.progs.of(r.Path), r.Env) {
		return files, env
	}
	f, took, err := topo.get(deadline)
	if !topo.reported {
		topo.reported = true
		if err != nil {
			a.log.Debug().Err(err).Msg("ranks discover the hardware topology themselves")
		} else {
			a.log.Debug().Dur("took", took).Msg("ranks read the hardware topology from gorun")
		}
	}
	if err != nil {
		return files, env
	}
	return topologyForRank(f, files, env)
}

func (a *supervisor) command(c wire.Cmd) {
	switch c.Op {
	case "signal":
		if Stopping(syscall.Signal(c.Signal)) {
			a.endSlows() // the job is being stopped: no more SIGSTOPs
		}
		want := map[int]bool{}
		for _, r := range c.Ranks {
			want[r] = true
		}
		if Stopping(syscall.Signal(c.Signal)) {
			a.noteFrozen()
			a.tearing = true
			a.ft.release(nil)
		}
		for _, r := range a.ranks {
			if r.running && (len(want) == 0 || want[r.rank]) {
				// Negative pid: the whole process group.
				_ = syscall.Kill(-r.pid, syscall.Signal(c.Signal))
				if Stopping(syscall.Signal(c.Signal)) {
					// A stopped rank (Ctrl-Z, a debugger) would hold
					// SIGTERM pending until the grace period ran out.
					_ = syscall.Kill(-r.pid, syscall.SIGCONT)
				}
			}
		}
	case "kill":
		a.killAll()
	case "ping": // the client's lease (ClientLease); reading it was enough
	case "bye":
		a.bye = true
	case "inject":
		a.inject(c)
	case "pmi-release":
		a.pmi.Release(c, a.log)
	case "pmi-value":
		a.pmi.Answer(c, a.log)
	case "respawn":
		a.respawn(c)
	case "release":
		a.ft.release(c.Ranks)
	default:
		a.log.Warn().Str("op", c.Op).Msg("unknown command")
	}
}

// inject sends an injected fault's signal to the process group of each
// rank of c.Ranks that this supervisor runs: the group, as a real crash
// of a rank takes its helpers (data loaders, compilers) with it. A rank
// of another host is not this supervisor's and is skipped without an
// answer; one of ours that already exited is answered with Err.
func (a *supervisor) inject(c wire.Cmd) {
	if c.AfterSteps > 0 {
		// Kept until one of its ranks (ours) reports the step; a fault
		// whose ranks are all elsewhere is another supervisor's.
		for _, r := range a.ranks {
			if slices.Contains(c.Ranks, r.rank) {
				a.armed = append(a.armed, c)
				a.fireArmed()
				return
			}
		}
		return
	}
	for _, want := range c.Ranks {
		for _, r := range a.ranks {
			if r.rank != want {
				continue
			}
			ev := wire.Event{Ev: "injected", Rank: r.rank, PID: r.pid, Signal: c.Signal, Fault: c.Fault, KillHost: c.KillHost, Step: a.steps[r.rank]}
			if !r.running {
				ev.Err = "rank " + strconv.Itoa(r.rank) + " had already exited"
				a.emit(ev)
				continue
			}
			if err := syscall.Kill(-r.pid, syscall.Signal(c.Signal)); err != nil {
				ev.Err = err.Error()
			} else if c.Period > 0 {
				a.startSlow(c, r.rank, r.pid, time.Now())
			} else if c.For > 0 {
				a.conts = append(a.conts, faultCont{rank: r.rank, pid: r.pid, fault: c.Fault, due: time.Now().Add(c.For)})
			}
			a.log.Debug().Int("rank", r.rank).Int("pid", r.pid).Int("signal", c.Signal).Msg("fault injected")
			a.emit(ev)
		}
	}
}

// fireArmed injects every armed after-steps fault one of whose ranks has
// reported its step.
func (a *supervisor) fireArmed() {
	kept := a.armed[:0]
	for _, c := range a.armed {
		reached := false
		for _, r := range c.Ranks {
			if a.steps[r] >= c.AfterSteps {
				reached = true
			}
		}
		if !reached {
			kept = append(kept, c)
			continue
		}
		c.AfterSteps = 0
		a.inject(c)
	}
	a.armed = kept
}

// sendConts sends the SIGCONTs that are due, to ranks still running.
func (a *supervisor) sendConts(now time.Time) {
	kept := a.conts[:0]
	for _, c := range a.conts {
		if now.Before(c.due) {
			kept = append(kept, c)
			continue
		}
		if i, ok := a.byPID[c.pid]; ok && a.ranks[i].running {
			_ = syscall.Kill(-c.pid, syscall.SIGCONT)
			a.emit(wire.Event{Ev: "fault-cont", Rank: c.rank, PID: c.pid, Fault: c.fault})
		}
	}
	a.conts = kept
}

// killAll SIGKILLs every rank's process group and every descendant. It is
// repeated (on each tick) while anything is left, because a process can
// fork between the scan and the kill.
func (a *supervisor) killAll() {
	if !a.killing {
		a.noteFrozen()
	}
	a.killing = true
	a.ft.release(nil)
	for _, r := range a.ranks {
		if r.running {
			_ = syscall.Kill(-r.pid, syscall.SIGKILL)
		}
	}
	for _, pid := range descendants(a.self) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// noteFrozen records which running ranks are stopped right now, before the
// teardown's SIGCONT or SIGKILL changes that. It reads the state the
// kernel keeps for every process: a rank that its peers found silent (the
// rendezvous lease) and that sits in state T was frozen, and that is the
// cause gorun's final line gives. One read of /proc/PID/stat per rank, only
// at the teardown.
func (a *supervisor) noteFrozen() {
	for i := range a.ranks {
		r := &a.ranks[i]
		if !r.running || r.frozen != 0 {
			continue
		}
		if st := procState(r.pid); st == 'T' || st == 't' {
			r.frozen = st
			a.log.Debug().Int("rank", r.rank).Int("pid", r.pid).Str("state", string(st)).Msg("rank is stopped at the teardown")
		}
	}
}

// reap collects every exited child: ranks and adopted orphans alike.
// drainPMI emits the PMI requests already queued.
func (a *supervisor) drainPMI() {
	for {
		select {
		case req, ok := <-a.pmi.Requests():
			if !ok {
				return
			}
			a.emit(a.pmi.Event(req))
		default:
			return
		}
	}
}

func (a *supervisor) reap() {
	at := time.Now().UnixNano()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		i, ok := a.byPID[pid]
		if !ok {
			a.ft.forkReaped(pid)
			continue
		}
		delete(a.byPID, pid)
		a.ranks[i].running = false
		a.running--
		ev := wire.Event{Ev: "exited", Rank: a.ranks[i].rank, PID: pid, At: at}
		if a.pmi != nil {
			// What the rank told PMI before it exited (an abort) is told
			// before its exit (pmi.go, settle).
			a.pmi.settle(ev.Rank, 100*time.Millisecond)
			a.drainPMI()
		}
		// A report is written before the failing call returns, so before
		// the exit just reaped: reading now finds it if there is one.
		a.readCollateral()
		if c, ok := a.coll[ev.Rank]; ok {
			ev.Collateral, ev.Blame, ev.Err, ev.Relay, ev.Desync = true, c.Blame, c.Why, c.Relay, c.Desync
		}
		if f := a.ranks[i].frozen; f != 0 {
			ev.Frozen = string(f)
		}
		if ws.Signaled() {
			ev.Signal = int(ws.Signal())
		} else {
			ev.Code = ws.ExitStatus()
			// Its finalize was answered before it could exit, so the
			// server's state is final here.
			ev.Unfinalized = ev.Code == 0 && a.pmi.unfinalized(ev.Rank)
		}
		a.emit(ev)
	}
}

// readCollateral reads every report waiting on the collateral pipe and
// keeps each rank's first. It never blocks.
func (a *supervisor) readCollateral() {
	if a.collR < 0 {
		return
	}
	var buf [16 << 10]byte
	for {
		n, err := syscall.Read(a.collR, buf[:])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if n <= 0 {
			return
		}
		a.collBuf = append(a.collBuf, buf[:n]...)
		for {
			i := bytes.IndexByte(a.collBuf, '\n')
			if i < 0 {
				break
			}
			if st, ok := collateral.DecodeStep(a.collBuf[:i]); ok {
				if _, seen := a.steps[st.Rank]; !seen {
					// A rank's first step: gorun's report times the
					// recovery of a restarted world by it.
					a.emit(wire.Event{Ev: "step", Rank: st.Rank, Step: st.Step})
				}
				a.steps[st.Rank] = max(a.steps[st.Rank], st.Step)
			} else if r, ok := collateral.Decode(a.collBuf[:i]); ok {
				if _, seen := a.coll[r.Rank]; !seen {
					a.coll[r.Rank] = r
				}
			}
			a.collBuf = a.collBuf[i+1:]
		}
		if len(a.collBuf) > 64<<10 {
			// Not a reporter's output (lines are < 4 KiB): drop it.
			a.collBuf = nil
		}
	}
}

// finishStrays is called once every rank has exited. Processes the ranks
// left behind get SIGTERM, then SIGKILL after the grace period (at once when
// killing). It returns true when nothing is left.
func (a *supervisor) finishStrays() bool {
	a.reap()
	left := descendants(a.self)
	if len(left) == 0 {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		return pid <= 0 && errors.Is(err, syscall.ECHILD)
	}
	now := time.Now()
	switch {
	case a.killing || (!a.strayDeadline.IsZero() && now.After(a.strayDeadline)):
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	case a.strayDeadline.IsZero():
		a.strays = len(left)
		a.log.Warn().Int("strays", len(left)).Msg("ranks exited but left processes running; stopping them")
		a.strayDeadline = now.Add(a.grace)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	return false
}

func (a *supervisor) emit(ev wire.Event) {
	if a.gorunGone {
		return
	}
	_ = a.enc.Encode(ev)
}

func (a *supervisor) flush() {
	if a.gorunGone {
		return
	}
	if err := a.out.Flush(); err != nil {
		a.gorunGone = true
	}
}

// Stopping reports whether sig asks a process to end.
func Stopping(sig syscall.Signal) bool {
	return sig == syscall.SIGTERM || sig == syscall.SIGINT || sig == syscall.SIGHUP
}
