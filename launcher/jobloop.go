package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/internal/plural"
	"github.com/gorun-hpc/gorun/launcher/fault"
	"github.com/gorun-hpc/gorun/launcher/flight"
	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// The job loop: one event loop for every job, whatever runs its ranks. It
// sees the ranks only through a rankHome — this machine's supervisor
// (localHome, runlocal.go), the supervisors of other hosts behind their
// host agents (hostsHome, remote.go), or a script in tests (fakeHome,
// loop_test.go) — and applies the failure rules: the first failure stops
// the others (SIGTERM to every rank's process group, SIGKILL after
// Config.Grace), signals are forwarded, --timeout and a canceled context
// end the job, and the error names what ended it.

// rankHome is where a job's ranks live, as the job loop sees it. The loop
// is its only user and calls every method from its own goroutine.
type rankHome interface {
	// events delivers the supervisors' events in the order each
	// supervisor sent them, plus "lost" for a host agent that is gone.
	// It is closed only when no event can come any more (the local
	// supervisor's event pipe ended).
	events() <-chan wire.Event
	// supervisors is how many "done" or "lost" events end the job: one
	// per supervisor.
	supervisors() int
	// command delivers c to every supervisor. It does not block for long;
	// a supervisor that is gone drops it.
	command(c wire.Cmd)
	// commandNode delivers c to the supervisor of plan node node alone
	// (the one whose events carry it), as command does.
	commandNode(node int, c wire.Cmd)
	// killGroup SIGKILLs a rank's process group when its supervisor died
	// without reporting the end. A home that cannot reach the group (a
	// remote host: its host agent's supervisor does that) does nothing.
	killGroup(pgid int)
	// lostWhy says why events closed before every supervisor reported
	// "done"; nil when the home knows no more than that it closed.
	lostWhy() error
}

// loopConfig is what the job loop reads of a job's Config, and no more:
// the teardown's timing, the exit policy, the signals gorun receives, and
// the hooks of the world and of a fault-tolerant job. Config.loop makes
// it.
type loopConfig struct {
	// Timeout ends the job after this long; 0 means never (Config.Timeout).
	Timeout time.Duration
	// Grace is the delay between SIGTERM and SIGKILL when the job is
	// stopped (Config.Grace).
	Grace time.Duration
	// ExitPolicy picks the failure the verdict names when several ranks
	// fail on their own (Config.ExitPolicy).
	ExitPolicy ExitPolicy
	// Signals delivers the signals gorun received; nil receives none
	// (Config.Signals).
	Signals <-chan os.Signal
	// world is the world LaunchReport runs (its injections, checkpoint
	// cues, first steps and fault report); a nil *worldRun outside
	// LaunchReport, never a nil interface.
	world worldHooks
	// ft is a fault-tolerant job's state (ft.go); nil otherwise.
	ft *ftRun
}

// loop is the part of c the job loop reads.
func (c Config) loop() loopConfig {
	return loopConfig{Timeout: c.Timeout, Grace: c.Grace, ExitPolicy: c.ExitPolicy, Signals: c.Signals, world: c.world, ft: c.ft}
}

// worldHooks is the world a job loop runs in, as the loop sees it: the
// faults to inject and the checkpoint signals owed, which the loop sends
// when they are due, and the world's fault report, which the loop tells
// what it saw. LaunchReport's worldRun (elastic.go) implements it; outside
// LaunchReport the world is a nil *worldRun, which has nothing to inject
// or cue and records nothing. The loop calls every method from its own
// goroutine; none blocks.
type worldHooks interface {
	// next returns the first injected fault not yet sent; false when
	// none is left. due says how long until in is due (0 when late).
	next() (in injection, ok bool)
	due(in injection) time.Duration
	// sent records that the loop asked the supervisors to inject in;
	// answered records and logs a supervisor's answer (ev) to one, from
	// a rank on host.
	sent(in injection)
	answered(log zerolog.Logger, host string, ev wire.Event)
	// checkpointCues returns, in time order, the checkpoint signals the
	// world owes from worldStart on (timeout: what is left of --timeout);
	// cues delivers those due at once (nil: none). checkpointSignal is the
	// signal that asks a rank to checkpoint; checkpointSent records one
	// sent at t.
	checkpointCues(worldStart time.Time, timeout time.Duration) []checkpointCue
	cues() <-chan checkpointCue
	checkpointSignal() syscall.Signal
	checkpointSent(c checkpointCue, t time.Time)
	// ranksStarted records that every rank started (or failed to) at t;
	// firstStep a rank's step report.
	ranksStarted(t time.Time)
	firstStep(rank int, step int64, t time.Time)
	// failed, saw and noticed record failures that reached the loop
	// together at t: failed the one that names a detection (detection),
	// saw all of them for the cause record, noticed the collateral ones
	// against the faults injected.
	failed(d failure, t time.Time)
	saw(fs []failure, t time.Time)
	noticed(fs []failure, t time.Time)
}

var _ worldHooks = (*worldRun)(nil)

// flightTable is the ranks' flight records as the job loop uses them:
// where a local job's ranks dump them, the dumps host agents send, and the
// merged table it prints after SIGUSR2, at --timeout and before a failed
// job's teardown. flight.go's flightRecords implements it; its nil pointer
// is a job that keeps none (inactive, no directory, prints nothing). The
// loop calls every method from its own goroutine; none blocks for long.
type flightTable interface {
	// active reports whether the ranks write records gorun can merge;
	// isRemote whether they come from host agents rather than a
	// directory on this machine, which flightDir is (nil: none).
	active() bool
	isRemote() bool
	flightDir() *flight.Dir
	// ask starts a new request for dumps from the host agents; store
	// keeps one that arrived.
	ask()
	store(d comm.FlightDump)
	// print prints the table of the dumps written since since (or asked
	// for since the last ask) and reports whether there was any;
	// markPrinted notes that the job's end need not print it again;
	// noneWritten says on gorun's stderr that a SIGUSR2 found none.
	print(why string, since time.Time) bool
	markPrinted()
	noneWritten()
}

var _ flightTable = (*flightRecords)(nil)

// jobLoop is the state of one job's event loop; owned by the goroutine
// that calls run.
type jobLoop struct {
	cfg  loopConfig
	plan *Plan
	log  zerolog.Logger
	home rankHome
	// flight, when set, merges the ranks' flight records after SIGUSR2
	// and at --timeout; a loop without it has the nil *flightRecords
	// (begin).
	flight flightTable
	// fenceHosts is how many supervisors a PMI barrier waits for; 0 means
	// every supervisor of home. An abandoned multi-host launch
	// (hostsRun.abandon) sets the whole world's host count, so that the
	// hosts it did start can never complete a barrier on their own.
	fenceHosts int
}

// rankState is what the job loop knows of one rank. A rank counts as live
// from the moment the spec is sent until its supervisor reports its exit: a
// supervisor starts every rank before it reads any command, so a signal
// sent to "all ranks" reaches ranks whose "started" event is still in
// flight.
type rankState struct {
	pid    int
	exited bool
	// stopped is set when gorun signaled the rank: its exit is then a
	// consequence of the teardown, not a failure of its own.
	stopped bool
	// frozen is the /proc state letter ("T", "t") its supervisor saw when
	// the teardown reached it; empty if it was running.
	frozen string
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
	mpi *outcome.MPIError
	// collateral is set when the rank's runtime reported, before it
	// exited, that it failed because another rank was lost or aborted:
	// blame is that rank (-1: unknown), why the runtime's words. A
	// collateral failure never names the job's cause while a failure of
	// its own exists, whatever arrived first.
	collateral bool
	// exitedAt is when the rank's supervisor reaped it (Unix ns; 0 when
	// it did not exit: a start error, a lost host), arrived when the
	// failure reached the job loop. They order the failures (earlier).
	exitedAt int64
	arrived  time.Time
	// relay: the collateral report was second-hand (collateral.Report.Relay).
	relay bool
	// desync: the collateral report was of a desync (collateral.Report.Desync).
	desync bool
	blame  int
	why    string
	// frozen is set (the /proc state letter) when the rank's supervisor
	// found it stopped past its lease (supervisor/freeze.go); why says for how
	// long.
	frozen string
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

// run handles the supervisors' events, signals and timers until every
// supervisor reported that its ranks and their descendants are gone, or
// was lost, and returns the job's verdict. It is the story of a job: the
// ranks start (the spec went out before run), the loop waits for one
// thing at a time and applies the failure rules to it, and once the last
// supervisor is done the verdict names what ended the job.
func (r *jobLoop) run(ctx context.Context) error {
	j := r.begin(ctx)
	defer j.stopTimers()
	for !j.done {
		j.next()
	}
	return j.verdict()
}

// liveJob is what the job loop knows while a job runs: the ranks, the
// failures so far, the teardown once it began, and the timers it owns.
// run creates it and every method runs on run's goroutine.
type liveJob struct {
	*jobLoop
	ctx   context.Context
	world worldHooks // a nil *worldRun outside LaunchReport (tests)
	ranks []rankState
	// events is home's event stream; left counts the supervisors that
	// have not yet reported "done" or been lost; supErr is set when the
	// stream ended before every "done".
	events <-chan wire.Event
	left   int
	supErr error
	// fences gathers the supervisors' PMI barriers (pmi.go).
	fences pmiFences
	// starts counts the ranks started or failed to start.
	starts   int
	failures []failure
	done     bool

	// The teardown: why it began, the signal gorun received (for
	// stopSignal), the signal it sent the ranks, and whether the SIGKILL
	// after the grace period went out.
	reason  stopReason
	stopSig syscall.Signal
	sentSig syscall.Signal
	killed  bool

	timeoutTimer *time.Timer
	timeout      <-chan time.Time // --timeout
	graceTimer   *time.Timer
	grace        <-chan time.Time // SIGKILL due
	ctxDone      <-chan struct{}

	// A failed local job first has its ranks dump their flight records
	// (flight.BeforeStop): dumpC ticks until dumpWant ranks wrote one since
	// dumpAsked, or until dumpUntil, then the signal goes out. A failed
	// multi-host job leaves that wait to each host's agent (DumpFirst).
	dumpTick             *time.Ticker
	dumpC                <-chan time.Time
	dumpAsked, dumpUntil time.Time
	dumpWant             int

	// Injected faults (inject.go): the loop owns the clock and asks the
	// supervisors when one is due; the one that runs the target signals it.
	injTimer *time.Timer
	injC     <-chan time.Time
	injNext  injection
	// Checkpoint signals gorun owes the ranks (Job.CheckpointBefore).
	cues []checkpointCue
	cueC <-chan time.Time

	flightTimer   <-chan time.Time // SIGUSR2: when to merge the ranks' dumps
	timeoutFlight <-chan time.Time // --timeout: when to merge them and stop
	flightAsked   time.Time
	// A multi-host job collects the dumps from the host agents once the
	// ranks had time to write them: collecting ends when every agent
	// answered or at collectC (flightWait), then prints (and, for
	// --timeout, stops the job).
	collectC    <-chan time.Time
	collecting  bool
	collectWhy  string
	collectStop bool
	answered    int
}

// begin sets up a job's run: every rank live, the --timeout running, the
// first injection and checkpoint cue armed.
func (r *jobLoop) begin(ctx context.Context) *liveJob {
	if r.flight == nil {
		r.flight = (*flightRecords)(nil) // keeps no records
	}
	j := &liveJob{
		jobLoop: r,
		ctx:     ctx,
		world:   r.cfg.world,
		ranks:   make([]rankState, len(r.plan.Ranks)),
		events:  r.home.events(),
		left:    r.home.supervisors(),
		ctxDone: ctx.Done(),
	}
	j.fences = pmiFences{hosts: j.left}
	if r.fenceHosts > 0 {
		j.fences.hosts = r.fenceHosts
	}
	if r.cfg.Timeout > 0 {
		j.timeoutTimer = time.NewTimer(r.cfg.Timeout)
		j.timeout = j.timeoutTimer.C
	}
	j.armInjection()
	j.cues = j.world.checkpointCues(time.Now(), r.cfg.Timeout)
	j.armCue()
	return j
}

// stopTimers releases the timers run owns.
func (j *liveJob) stopTimers() {
	for _, t := range []*time.Timer{j.timeoutTimer, j.graceTimer, j.injTimer} {
		if t != nil {
			t.Stop()
		}
	}
	if j.dumpTick != nil {
		j.dumpTick.Stop()
	}
}

// next waits for one thing to happen — an event, a timer, a signal, the
// context — and handles it.
func (j *liveJob) next() {
	nfail := len(j.failures)
	select {
	case ev, ok := <-j.events:
		j.onEvent(ev, ok)
	case <-j.timeout:
		j.onTimeout()
	case <-j.timeoutFlight:
		j.timeoutFlight = nil
		j.flightDue("--timeout", true)
	case <-j.collectC:
		j.collected() // an agent that did not answer in time is left out
	case <-j.injC:
		j.inject()
	case <-j.cueC:
		c := j.cues[0]
		j.cues = j.cues[1:]
		j.askCheckpoint(c)
		j.armCue()
	case c := <-j.world.cues():
		if j.reason == notStopping { // else the world is ending anyway: no notice to act on
			j.askCheckpoint(c)
		}
	case now := <-j.dumpC:
		j.dumpWait(now)
	case <-j.grace:
		j.grace = nil
		j.kill()
	case <-j.ctxDone:
		j.ctxDone = nil
		j.stop(stopContext, syscall.SIGTERM)
	case s := <-j.cfg.Signals:
		j.onSignal(s)
	case <-j.flightTimer:
		j.flightTimer = nil
		j.flightDue("SIGUSR2", false)
	}
	j.noteFailures(nfail)
	if j.reason != notStopping {
		j.injC = nil // no fault goes into a world that is being stopped
		j.cueC = nil // nor a checkpoint signal
	}
}

// noteFailures stamps the failures that arrived since the first nfail
// with their arrival and tells the world (the fault report).
func (j *liveJob) noteFailures(nfail int) {
	if len(j.failures) <= nfail {
		return
	}
	now := time.Now()
	for i := nfail; i < len(j.failures); i++ {
		j.failures[i].arrived = now
	}
	j.world.failed(detection(j.failures[nfail:]), now)
	j.world.saw(j.failures[nfail:], now)
	j.world.noticed(j.failures[nfail:], now)
}

// detection is the failure that names a detection, of failures that
// arrived together (one reaper batch shares one reap time, in no useful
// order): as the job's cause would be named, a failure of its own before
// a collateral one.
func detection(fs []failure) failure {
	for _, f := range fs {
		if !f.collateral {
			return f
		}
	}
	return fs[0]
}

// fail records a failure and begins the teardown.
func (j *liveJob) fail(f failure) {
	j.failures = append(j.failures, f)
	j.stop(stopFailure, syscall.SIGTERM)
}

// stop begins the teardown (once): every rank still running counts as
// stopped by gorun, and the signal goes out, after the ranks dumped their
// flight records when the job failed.
func (j *liveJob) stop(why stopReason, sig syscall.Signal) {
	if j.reason != notStopping {
		return
	}
	j.reason = why
	j.sentSig = sig
	for i := range j.ranks {
		if !j.ranks[i].exited {
			j.ranks[i].stopped = true
		}
	}
	if why == stopFailure && j.flight.isRemote() {
		j.signalStop(sig, true)
		return
	}
	if why == stopFailure && j.flight.active() {
		// Taken before the signals, as at --timeout.
		asked := time.Now()
		if n := j.flight.flightDir().SignalReady(); n > 0 {
			j.dumpAsked, j.dumpUntil, j.dumpWant = asked, asked.Add(flight.BeforeStop), n
			j.dumpTick = time.NewTicker(5 * time.Millisecond)
			j.dumpC = j.dumpTick.C
			return
		}
	}
	j.signalStop(sig, false)
}

// signalStop sends the teardown signal to every running rank's group,
// SIGKILL after the grace period.
func (j *liveJob) signalStop(sig syscall.Signal, dumpFirst bool) {
	j.log.Debug().Stringer("signal", sig).Msg("stopping the job")
	j.home.command(wire.Cmd{Op: "signal", Signal: int(sig), DumpFirst: dumpFirst})
	j.graceTimer = time.NewTimer(j.cfg.Grace)
	j.grace = j.graceTimer.C
}

// dumpWait sends the teardown signal once the ranks asked to dump their
// flight records before it did, or were given long enough.
func (j *liveJob) dumpWait(now time.Time) {
	if j.flight.flightDir().DumpedSince(j.dumpAsked) >= j.dumpWant || now.After(j.dumpUntil) {
		j.dumpTick.Stop()
		j.dumpC = nil
		if !j.killed {
			j.signalStop(j.sentSig, false)
		}
	}
}

// kill SIGKILLs every rank's group (once).
func (j *liveJob) kill() {
	if !j.killed {
		j.killed = true
		j.home.command(wire.Cmd{Op: "kill"})
	}
}

// armInjection sets the timer for the next injected fault, if any is left
// and the world is not being stopped.
func (j *liveJob) armInjection() {
	j.injC = nil
	in, ok := j.world.next()
	if !ok || j.reason != notStopping {
		return
	}
	j.injNext = in
	if j.injTimer == nil {
		j.injTimer = time.NewTimer(j.world.due(in))
	} else {
		j.injTimer.Reset(j.world.due(in))
	}
	j.injC = j.injTimer.C
}

// inject asks the supervisors to inject the fault that is due.
func (j *liveJob) inject() {
	in := j.injNext
	j.world.sent(in)
	j.home.command(wire.Cmd{Op: "inject", Ranks: in.ranks, Signal: int(in.sig), For: in.cont, Fault: in.id,
		Duty: in.duty, Period: in.period,
		KillHost: in.kind == fault.KillHost, AfterSteps: in.afterSteps})
	j.armInjection()
}

// armCue sets the timer for the next checkpoint cue.
func (j *liveJob) armCue() {
	j.cueC = nil
	if len(j.cues) > 0 && j.reason == notStopping {
		j.cueC = time.After(time.Until(j.cues[0].at))
	}
}

// askCheckpoint signals the ranks to checkpoint.
func (j *liveJob) askCheckpoint(c checkpointCue) {
	sig := j.world.checkpointSignal()
	j.log.Warn().Str("why", c.why).Stringer("signal", sig).Msg("asking the ranks for a checkpoint")
	j.home.command(wire.Cmd{Op: "signal", Signal: int(sig)})
	j.world.checkpointSent(c, time.Now())
}

// onTimeout handles --timeout: ranks that keep flight records dump them
// first (a job that runs into --timeout is usually stuck), then the job
// stops. The time is taken before the signals go out: a rank can dump
// before signalReady returns, and print keeps only dumps written at or
// after flightAsked.
func (j *liveJob) onTimeout() {
	j.timeout = nil
	asked := time.Now()
	switch {
	case j.flight.isRemote():
		// Each agent signals its own ready ranks.
		j.flight.ask()
		j.home.command(wire.Cmd{Op: "flight-signal"})
		j.flightAsked = asked
		j.timeoutFlight = time.After(flightWait)
	case j.flight.flightDir().SignalReady() > 0:
		j.flightAsked = asked
		j.timeoutFlight = time.After(flightWait)
	default:
		j.stop(stopTimeout, syscall.SIGTERM)
	}
}

// onSignal handles a signal gorun received: SIGINT, SIGTERM and SIGHUP
// stop the job (a second SIGINT kills it), any other is forwarded to the
// ranks, and SIGUSR2 then merges their flight records.
func (j *liveJob) onSignal(s os.Signal) {
	sig, _ := s.(syscall.Signal)
	switch sig {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP:
		if j.reason == notStopping {
			j.stopSig = sig
			j.stop(stopSignal, sig)
		} else if sig == syscall.SIGINT {
			// The user insists: no more grace.
			j.kill()
		}
	case 0:
	default:
		asked := time.Now() // before any rank can dump (see onTimeout)
		if sig == syscall.SIGUSR2 && j.flight.active() {
			j.flight.ask()
		}
		j.home.command(wire.Cmd{Op: "signal", Signal: int(sig)})
		if sig == syscall.SIGUSR2 && j.flight.active() {
			// The ranks dump their flight records (comm); merge them
			// once they have had time to.
			j.flightAsked = asked
			j.flightTimer = time.After(flightWait)
		}
	}
}

// flightDue merges and prints the ranks' flight records, after collecting
// them from the host agents for a multi-host job; thenStop stops the job
// after (--timeout).
func (j *liveJob) flightDue(why string, thenStop bool) {
	if !j.flight.isRemote() {
		j.printFlight(why, thenStop)
		return
	}
	j.home.command(wire.Cmd{Op: "flight"})
	j.collecting, j.collectWhy, j.collectStop, j.answered = true, why, thenStop, 0
	j.collectC = time.After(flightWait)
}

// collected ends a collection of the host agents' flight records.
func (j *liveJob) collected() {
	j.collecting, j.collectC = false, nil
	j.printFlight(j.collectWhy, j.collectStop)
}

// printFlight prints the merged flight records, or says that no rank
// wrote any after a SIGUSR2; thenStop stops the job after (--timeout).
func (j *liveJob) printFlight(why string, thenStop bool) {
	printed := j.flight.print(why, j.flightAsked)
	if thenStop {
		if printed {
			j.flight.markPrinted()
		}
		j.stop(stopTimeout, syscall.SIGTERM)
	} else if !printed {
		j.flight.noneWritten()
	}
}

// onEvent handles one supervisor event; !ok when the event stream ended.
func (j *liveJob) onEvent(ev wire.Event, ok bool) {
	if !ok {
		j.supErr = j.home.lostWhy()
		if j.supErr == nil {
			j.supErr = errors.New("supervisor exited before reporting the end of the job")
		}
		j.done = true
		return
	}
	if ev.Ev != "done" && ev.Ev != "lost" && ev.Ev != "spare-lost" && (ev.Rank < 0 || ev.Rank >= len(j.ranks)) {
		j.log.Warn().Int("rank", ev.Rank).Str("ev", ev.Ev).Msg("supervisor reported an unknown rank; ignored")
		return
	}
	switch ev.Ev {
	case "started":
		j.ranks[ev.Rank].pid = ev.PID
		j.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Msg("rank started")
		j.countStart()
		j.cfg.ft.started(ev)
	case "failed":
		j.countStart()
		j.ranks[ev.Rank].exited = true
		j.log.Debug().Int("rank", ev.Rank).Str("err", ev.Err).Msg("rank could not start")
		j.fail(failure{rank: ev.Rank, startErr: errors.New(ev.Err)})
	case "frozen":
		j.rankFrozen(ev)
	case "exited":
		j.rankExited(ev)
	case "step":
		j.world.firstStep(ev.Rank, ev.Step, time.Now())
	case "injected", "fault-cont":
		j.world.answered(j.log, j.plan.Ranks[ev.Rank].Host, ev)
	case "pmi-fence":
		j.pmiFence(ev)
	case "pmi-get":
		j.home.commandNode(ev.Node, j.fences.get(ev))
	case "pmi-abort":
		j.pmiAbort(ev)
	case "lost":
		j.hostLost(ev)
	case "spare-lost":
		j.cfg.ft.spareEvent(ev) // an idle spare host: the job goes on (ftspare.go)
	case "flight":
		if ev.Flight != nil {
			j.flight.store(*ev.Flight)
		}
		if j.answered += btoi(ev.FlightEnd); j.collecting && j.answered >= j.home.supervisors() {
			j.collected()
		}
	case "done":
		if ev.Strays > 0 {
			j.log.Warn().Int("strays", ev.Strays).Msg("ranks left processes running; they were stopped")
		}
		j.supervisorGone()
	}
}

// countStart counts a rank started or failed to start; the world's start
// time is when the last one did.
func (j *liveJob) countStart() {
	if j.starts++; j.starts == len(j.ranks) {
		j.world.ranksStarted(time.Now())
	}
}

// supervisorGone counts a supervisor done or lost; the job ends with the
// last.
func (j *liveJob) supervisorGone() {
	j.left--
	j.done = j.left <= 0
}

// rankFrozen handles a rank stopped past its lease, most often before the
// world formed (supervisor/freeze.go): a failure of its own. The teardown that
// follows continues and ends it.
func (j *liveJob) rankFrozen(ev wire.Event) {
	st := &j.ranks[ev.Rank]
	st.frozen = ev.Frozen
	if st.exited || j.reason != notStopping {
		return
	}
	j.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Str("why", ev.Err).Msg("rank frozen")
	if j.cfg.ft.frozen(j, ev) {
		return // killed, so that its exit replaces it (ft.go)
	}
	j.fail(failure{rank: ev.Rank, pid: ev.PID, code: 1, frozen: ev.Frozen, why: ev.Err, blame: -1})
}

// rankExited judges a rank's exit: the reap of a rank that told its
// MPI_Abort first, a collateral failure, a failure of its own, an exit 0
// without PMI finalize, or the teardown's doing (or success).
func (j *liveJob) rankExited(ev wire.Event) {
	st := &j.ranks[ev.Rank]
	st.exited, st.frozen = true, ev.Frozen
	if i := slices.IndexFunc(j.failures, func(f failure) bool { return f.rank == ev.Rank && f.mpi != nil && f.mpi.Aborted }); i >= 0 {
		// Its MPI_Abort was told first and is the cause; the exit that
		// follows it is the same failure, now with its reap time.
		j.failures[i].exitedAt = ev.At
		return
	}
	j.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Int("code", ev.Code).Int("signal", ev.Signal).Int64("reaped_at_ns", ev.At).Msg("rank exited")
	if j.cfg.ft.exited(j, ev) {
		return // a fault-tolerant job replaces the rank (ft.go)
	}
	failed := ev.Code != 0 || ev.Signal != 0
	switch {
	case ev.Collateral && failed:
		// A consequence: counted apart, neither stopped by gorun nor
		// failed on its own.
		st.stopped = false
		j.fail(failure{rank: ev.Rank, pid: ev.PID, code: ev.Code, signal: syscall.Signal(ev.Signal),
			collateral: true, blame: ev.Blame, why: ev.Err, relay: ev.Relay, desync: ev.Desync, exitedAt: ev.At})
	case failed && !(st.stopped && causedByStop(ev, j.sentSig, j.killed)):
		// Its own failure, even if the teardown had begun: it does not
		// count as one gorun stopped, or the final line would claim to
		// have stopped ranks that all failed on their own.
		st.stopped = false
		j.fail(failure{rank: ev.Rank, pid: ev.PID, code: ev.Code, signal: syscall.Signal(ev.Signal), exitedAt: ev.At})
	case ev.Unfinalized && !st.stopped:
		j.fail(failure{rank: ev.Rank, pid: ev.PID, code: 1, mpi: &outcome.MPIError{Rank: ev.Rank, PID: ev.PID}})
	}
}

// pmiFence adds a supervisor's PMI barrier and releases it once every
// supervisor reached it.
func (j *liveJob) pmiFence(ev wire.Event) {
	if cmd, ok, err := j.fences.add(ev); err != nil {
		j.log.Error().Err(err).Msg("PMI barrier")
		j.fail(failure{rank: ev.Rank, startErr: fmt.Errorf("%w: %v", errPMIProtocol, err)})
	} else if ok {
		j.log.Debug().Int("epoch", cmd.Epoch).Int("keys", j.fences.kvs.Len()).Msg("PMI barrier released")
		j.home.command(cmd)
	}
}

// pmiAbort handles a rank's MPI_Abort: the cause, unless the teardown had
// begun.
func (j *liveJob) pmiAbort(ev wire.Event) {
	pid := j.ranks[ev.Rank].pid
	abort := &outcome.MPIError{Rank: ev.Rank, PID: pid, Aborted: true, Code: ev.Code, Message: ev.Err}
	if j.reason == notStopping {
		j.fail(failure{rank: ev.Rank, pid: pid, code: ev.Code, mpi: abort})
	} else if i := slices.IndexFunc(j.failures, func(f failure) bool { return f.rank == ev.Rank }); i >= 0 && j.failures[i].mpi == nil && j.failures[i].signal == 0 {
		// A client that exits right after sending its abort (Slurm's
		// libpmi2 does) can be reaped before the abort is read: the
		// abort is the cause.
		j.failures[i].mpi = abort
	}
}

// hostLost handles a host agent that is gone: its ranks are, or soon will
// be (its host agent kills them when the lease runs out), so they count
// as failed.
func (j *liveJob) hostLost(ev wire.Event) {
	n := j.plan.Nodes[ev.Node]
	j.log.Debug().Str("host", n.Name).Str("err", ev.Err).Msg("host lost")
	if j.cfg.ft.hostLost(j, ev) {
		j.supervisorGone() // only its replica groups are out (fthost.go)
		return
	}
	for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
		j.ranks[rk].exited = true
		j.ranks[rk].stopped = false
	}
	j.fail(failure{rank: n.FirstRank, lost: errors.New(ev.Err), lostRanks: n.Ranks})
	j.supervisorGone()
}

// verdict is the job's error once the loop ended: nil when every rank
// exited 0 and no supervisor was lost.
func (j *liveJob) verdict() error {
	// Counted at the end: a rank whose start failure was still in flight
	// when the teardown began was never running, so it was not stopped.
	stopped := 0
	for _, st := range j.ranks {
		if st.stopped && st.pid > 0 {
			stopped++
		}
	}
	lostRanks := 0
	if j.supErr != nil {
		// The ranks died with the supervisor (Pdeathsig); their process groups
		// may still hold children, which nobody else will stop now.
		for _, st := range j.ranks {
			if st.pid > 0 && !st.exited {
				lostRanks++
				j.home.killGroup(st.pid)
			}
		}
	}
	switch {
	case j.supErr != nil && j.reason != stopFailure:
		// Even when gorun was already stopping the job (a signal, the
		// timeout), losing the supervisor is the news: the ranks did not
		// end the way gorun asked.
		return &outcome.SupervisorError{Err: j.supErr, Ranks: lostRanks}
	case j.reason == stopTimeout:
		return &outcome.TimeoutError{After: j.cfg.Timeout, Stopped: stopped}
	case j.reason == stopSignal:
		return &outcome.InterruptedError{Signal: j.stopSig, Stopped: stopped}
	case j.reason == stopContext:
		return fmt.Errorf("launcher: job canceled; stopped %d %s: %w", stopped, plural.Noun(stopped, "rank", "ranks"), j.ctx.Err())
	case len(j.failures) > 0:
		return j.failureError(stopped)
	}
	return nil
}

// failureError names the failure the exit policy picks among those of
// their own, or, when every failure was collateral, the rank they blame.
func (j *liveJob) failureError(stopped int) error {
	collateral := 0
	own := make([]failure, 0, len(j.failures))
	for _, f := range j.failures {
		if f.collateral {
			collateral++
		} else {
			own = append(own, f)
		}
	}
	if len(own) == 0 {
		return j.blamed(j.failures, j.ranks, stopped)
	}
	f := pickFailure(own, j.cfg.ExitPolicy)
	host := j.plan.Ranks[f.rank].Host
	// A named rank that the teardown stopped too (an aborting or frozen
	// rank waits to be ended) is not one of the "other" ranks.
	named := 0
	if j.ranks[f.rank].stopped && j.ranks[f.rank].pid > 0 {
		named = 1
	}
	switch {
	case f.mpi != nil:
		e := *f.mpi
		e.Host, e.Stopped = host, stopped-named
		return &e
	case f.frozen != "":
		return &outcome.FrozenError{Rank: f.rank, Host: host, PID: f.pid, State: f.frozen, Why: f.why, Stopped: stopped - named, Collateral: collateral,
			AlsoFailed: alsoFailed(own, f)}
	case f.lost != nil:
		return &outcome.HostLostError{Host: host, FirstRank: f.rank, Ranks: f.lostRanks, Err: f.lost, Stopped: stopped, Collateral: collateral}
	case f.startErr != nil:
		return &outcome.StartError{Rank: f.rank, Host: host, Err: f.startErr, Stopped: stopped}
	}
	return &outcome.RankExitError{Rank: f.rank, Host: host, PID: f.pid, Code: f.code, Signal: f.signal, Stopped: stopped,
		AlsoFailed: alsoFailed(own, f), Collateral: collateral}
}

// blamed names the cause when every failure was collateral: no rank died
// or failed on its own as far as gorun saw (a frozen rank, a cut link),
// yet the runtimes reported one lost. The cause is the rank the first
// first-hand report blames; without one (only relayed aborts reached
// gorun), the first rank that reported nothing itself, following each
// report's blame in arrival order (rank 0 blames rank 2, which relayed
// rank 3's abort). When that rank ran on, on another host than its
// reporter, the network between them is the cause (outcome.CollateralError.Link).
func (r *jobLoop) blamed(fs []failure, ranks []rankState, stopped int) error {
	if e := r.desynced(fs, ranks, stopped); e != nil {
		return e
	}
	byRank := map[int]failure{}
	for _, f := range fs {
		if _, dup := byRank[f.rank]; !dup {
			byRank[f.rank] = f
		}
	}
	first := fs[0]
	reporter, blame := first, -1
	// First-hand evidence first: a report (in arrival order) of a rank
	// that saw the loss itself (a connection closed or timed out, a lease
	// ran out), not one relaying a peer's abort: an abort travels from
	// peer to peer, so the relays of a ring blame each other in a cycle
	// that hides where it began. A first-hand report blaming a rank that
	// never reported (it died, froze or stopped answering) beats one
	// blaming a rank that failed only because of a peer itself (then the
	// two lost each other: a link).
	//
	// Among several such reports the earliest exit wins, not the first
	// arrival: reports from different hosts reach gorun through their
	// agents in no causal order. Measured in a partition between two
	// hosts (TestPartitionBetweenHosts): the rank across the cut reported
	// its peer's connection timed out, and the abort that followed went
	// round the ring until the peer's host leader exited, whereupon the
	// leader's other rank reported "connection to its host leader
	// closed"; that later report sometimes arrived first and named the
	// leader. Exit times come from the supervisors' reaps (exitedAt, 0
	// when unknown: then arrival order decides).
	firstHand := func(silent bool) {
		var at int64
		for _, f := range fs {
			if _, reported := byRank[f.blame]; !f.relay && f.blame >= 0 && f.blame < len(ranks) && f.blame != f.rank && reported != silent {
				if blame < 0 || (f.exitedAt > 0 && (at == 0 || f.exitedAt < at)) {
					reporter, blame, at = f, f.blame, f.exitedAt
				}
			}
		}
	}
	firstHand(true)
	if blame < 0 {
		firstHand(false)
	}
	// Only relays reached gorun (the first-hand reporter was stopped
	// before it could report): follow each report's blame to a rank that
	// reported nothing itself.
	for _, f := range fs {
		if blame >= 0 {
			break
		}
		seen := map[int]bool{}
		for b := f.blame; b >= 0 && b < len(ranks) && !seen[b]; {
			next, ok := byRank[b]
			if !ok {
				reporter, blame = f, b
				break
			}
			seen[b] = true
			f, b = next, next.blame
		}
	}
	e := &outcome.CollateralError{ReportedBy: reporter.rank, ReporterHost: r.plan.Ranks[reporter.rank].Host, Why: reporter.why, Blame: -1, Failed: len(fs),
		Stopped: stopped, Code: failure{code: first.code, signal: first.signal}.exitCode()}
	if blame >= 0 {
		e.Blame, e.BlameHost, e.BlamePID = blame, r.plan.Ranks[blame].Host, ranks[blame].pid
		e.Frozen = ranks[blame].frozen
		_, reported := byRank[blame]
		// The blamed rank ran on until gorun stopped it (not frozen) or
		// failed itself only because of a peer, its host's supervisor
		// answered throughout (else the host is the lost one), and its
		// reporter is on another host: what they lost was the network
		// between their hosts, not a process.
		e.Link = e.Frozen == "" && e.BlameHost != e.ReporterHost && (reported || (ranks[blame].stopped && ranks[blame].pid > 0))
		if ranks[blame].stopped && ranks[blame].pid > 0 {
			// The blamed rank is counted by name, not among the others.
			e.Stopped--
		}
		if reported && e.Frozen != "" {
			// A frozen rank resumed at the teardown (so that the stop
			// signal reaches it) may find its peers gone and report that
			// before the signal ends it: it is still the one blamed, not
			// one of the ranks that failed as a consequence.
			e.Failed--
		}
	}
	return e
}

// desynced is the verdict when the runtimes reported a desync: a report's
// words (both calls, and both sides when a comparison of every rank's
// calls found them), blaming the rank it names (the smaller side's) or
// none. The report chosen is the first that knows the sides, else the
// first first-hand one. Nil when no report was of a desync.
func (r *jobLoop) desynced(fs []failure, ranks []rankState, stopped int) *outcome.CollateralError {
	var rep *failure
	better := func(f *failure) bool {
		switch {
		case rep == nil:
			return true
		case (f.blame >= 0) != (rep.blame >= 0):
			return f.blame >= 0
		}
		return rep.relay && !f.relay
	}
	for i := range fs {
		if f := &fs[i]; f.desync && better(f) {
			rep = f
		}
	}
	if rep == nil {
		return nil
	}
	e := &outcome.CollateralError{Desync: true, ReportedBy: rep.rank, ReporterHost: r.plan.Ranks[rep.rank].Host, Why: rep.why, Blame: -1,
		Failed: len(fs), Stopped: stopped, Code: failure{code: fs[0].code, signal: fs[0].signal}.exitCode()}
	if b := rep.blame; b >= 0 && b < len(ranks) {
		e.Blame, e.BlameHost, e.BlamePID = b, r.plan.Ranks[b].Host, ranks[b].pid
	}
	return e
}

// String says what failed, for the fault report; a collateral failure
// says whom its runtime blamed, and a relayed one whose abort reached it
// (that rank did not fail: it passed on a loss it saw or heard of).
func (f failure) String() string {
	if f.collateral {
		g := f
		g.collateral = false
		switch {
		case f.blame < 0:
			return g.String() + " after its runtime lost a peer"
		case f.relay:
			return fmt.Sprintf("%s after rank %d's abort reached its runtime", g, f.blame)
		}
		return fmt.Sprintf("%s after its runtime lost rank %d", g, f.blame)
	}
	switch {
	case f.mpi != nil:
		return fmt.Sprintf("rank %d failed through MPI (exit %d)", f.rank, f.exitCode())
	case f.frozen != "":
		return fmt.Sprintf("rank %d frozen: %s", f.rank, f.why)
	case f.lost != nil:
		return fmt.Sprintf("host of ranks %d-%d lost: %v", f.rank, f.rank+f.lostRanks-1, f.lost)
	case f.startErr != nil:
		return fmt.Sprintf("rank %d could not start: %v", f.rank, f.startErr)
	case f.signal != 0:
		return fmt.Sprintf("rank %d killed by %s", f.rank, unixSignalName(f.signal))
	}
	return fmt.Sprintf("rank %d exited with code %d", f.rank, f.code)
}

// alsoFailed counts the ranks other than f's that failed on their own.
func alsoFailed(fs []failure, f failure) int {
	n := 0
	for _, o := range fs {
		if o.rank == f.rank {
			continue
		}
		if o.lost != nil {
			n += o.lostRanks
		} else {
			n++
		}
	}
	return n
}

// sameMoment is how close two failures' times must be for firstFailure to
// call them simultaneous. A reap time is not the moment of death: a killed
// multithreaded process is reapable only once every thread has died, which
// on a loaded host takes milliseconds, and its sockets close (and its peers
// react) before that. Measured here (TestCulpritByExitOrder, 2 cores, load
// ~20): peers that exit 1 on seeing a SIGKILLed rank gone were reaped up to
// 2.7 ms before it.
const sameMoment = 50 * time.Millisecond

// firstFailure is ExitFirst's verdict: the failure that happened first, by
// the best evidence there is, for failures in arrival order:
//   - the time each process was reaped (wire.Event.At), which its
//     supervisor does at each SIGCHLD; a failure with no exit (a start
//     error, a lost host) counts from its arrival at gorun;
//   - among the exits reaped within sameMoment of the earliest failure, a
//     death by a signal gorun did not send comes before an exit with a
//     code: a killed process did not choose to die, while a peer that
//     exits with an error at the same moment usually reacts to it;
//   - then the earlier time, then arrival order.
//
// Times of different hosts compare through their clocks: a skew between
// hosts larger than the gap between two exits can misorder them.
func firstFailure(fs []failure) failure {
	first := fs[0].when()
	for _, f := range fs[1:] {
		first = min(first, f.when())
	}
	best := -1
	for i, f := range fs {
		if f.when()-first > int64(sameMoment) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := fs[best]
		// Only between two reaped exits: without reap stamps (a start
		// error, a lost host, events without them) there is no evidence
		// that they were simultaneous.
		if sig, bsig := f.signal != 0, b.signal != 0; sig != bsig && f.exitedAt != 0 && b.exitedAt != 0 {
			if sig {
				best = i
			}
			continue
		}
		if f.when() < b.when() {
			best = i
		}
	}
	return fs[best]
}

// when is the failure's time for earlier: its exit, else its arrival.
func (f failure) when() int64 {
	if f.exitedAt != 0 {
		return f.exitedAt
	}
	return f.arrived.UnixNano()
}

// causedByStop reports whether a stopped rank's exit is the teardown's
// doing: death by the signal gorun sent or by SIGKILL, or the exit code
// 128+signal that shells and many handlers use. Any other failure of a rank
// that was being stopped is its own and competes under ExitLowest and
// ExitMax (under ExitFirst the first failure always wins anyway).
//
// SIGKILL counts only once gorun sent it (killed, after the grace period):
// a rank SIGKILLed from outside (the OOM killer, a user) while the
// teardown's SIGTERM was on its way is the job's cause, and often its
// peers' collateral exits arrive first and begin the teardown.
func causedByStop(ev wire.Event, sent syscall.Signal, killed bool) bool {
	return ev.Signal == int(sent) || (killed && ev.Signal == int(syscall.SIGKILL)) || (ev.Signal == 0 && ev.Code == 128+int(sent))
}

// pickFailure applies the exit policy to the failures of their own. Under
// ExitFirst "first" is by when each process exited, not by when its news
// arrived (earlier): for programs that do not use gorun's runtime, and so
// cannot report themselves collateral, the exit order is the causal
// evidence left, and arrival order is not it (two hosts' events race over
// the network; one supervisor's reap pass reports in wait4's order).
func pickFailure(fs []failure, policy ExitPolicy) failure {
	if policy == ExitFirst {
		return firstFailure(fs)
	}
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
