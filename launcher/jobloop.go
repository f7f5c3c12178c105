package launcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/rs/zerolog"
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
	events() <-chan supervisorEvent
	// supervisors is how many "done" or "lost" events end the job: one
	// per supervisor.
	supervisors() int
	// command delivers c to every supervisor. It does not block for long;
	// a supervisor that is gone drops it.
	command(c supervisorCmd)
	// commandNode delivers c to the supervisor of plan node node alone
	// (the one whose events carry it), as command does.
	commandNode(node int, c supervisorCmd)
	// killGroup SIGKILLs a rank's process group when its supervisor died
	// without reporting the end. A home that cannot reach the group (a
	// remote host: its host agent's supervisor does that) does nothing.
	killGroup(pgid int)
	// lostWhy says why events closed before every supervisor reported
	// "done"; nil when the home knows no more than that it closed.
	lostWhy() error
}

// jobLoop is the state of one job's event loop; owned by the goroutine
// that calls run.
type jobLoop struct {
	cfg  Config
	plan *Plan
	log  zerolog.Logger
	home rankHome
	// flight, when set, merges the ranks' flight records after SIGUSR2
	// and at --timeout (flight.go).
	flight *flightRecords
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
	mpi *MPIError
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
	// found it stopped past its lease (freeze.go); why says for how long.
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
// was lost.
func (r *jobLoop) run(ctx context.Context) error {
	ranks := make([]rankState, len(r.plan.Ranks))
	events := r.home.events()
	// left counts the supervisors that have not yet reported "done" or
	// been lost.
	left := r.home.supervisors()
	// supErr is set when the event stream ended before every "done".
	var supErr error
	// fences gathers the supervisors' PMI barriers (pmi.go).
	fences := pmiFences{hosts: left}
	if r.fenceHosts > 0 {
		fences.hosts = r.fenceHosts
	}
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

	// signalStop sends the teardown signal to every running rank's group,
	// SIGKILL after the grace period.
	signalStop := func(sig syscall.Signal, dumpFirst bool) {
		r.log.Debug().Stringer("signal", sig).Msg("stopping the job")
		r.home.command(supervisorCmd{Op: "signal", Signal: int(sig), DumpFirst: dumpFirst})
		graceTimer = time.NewTimer(r.cfg.Grace)
		grace = graceTimer.C
	}
	// A failed local job first has its ranks dump their flight records
	// (flightBeforeStop): dumpC ticks until dumpWant ranks wrote one since
	// dumpAsked, or until dumpUntil, then the signal goes out. A failed
	// multi-host job leaves that wait to each host's agent (DumpFirst).
	var (
		dumpTick             *time.Ticker
		dumpC                <-chan time.Time
		dumpAsked, dumpUntil time.Time
		dumpWant             int
	)
	defer func() {
		if dumpTick != nil {
			dumpTick.Stop()
		}
	}()
	// stop begins the teardown.
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
		if why == stopFailure && r.flight.isRemote() {
			signalStop(sig, true)
			return
		}
		if why == stopFailure && r.flight.active() {
			// Taken before the signals, as at --timeout.
			asked := time.Now()
			if n := r.flight.signalReady(); n > 0 {
				dumpAsked, dumpUntil, dumpWant = asked, asked.Add(flightBeforeStop), n
				dumpTick = time.NewTicker(5 * time.Millisecond)
				dumpC = dumpTick.C
				return
			}
		}
		signalStop(sig, false)
	}
	kill := func() {
		if !killed {
			killed = true
			r.home.command(supervisorCmd{Op: "kill"})
		}
	}
	// Injected faults (inject.go): the loop owns the clock and asks the
	// supervisors when one is due; the one that runs the target signals it.
	world := r.cfg.world
	var (
		injTimer *time.Timer
		injC     <-chan time.Time
		injNext  injection
		starts   int // ranks started or failed to start
	)
	armInjection := func() {
		injC = nil
		in, ok := world.next()
		if !ok || reason != notStopping {
			return
		}
		injNext = in
		if injTimer == nil {
			injTimer = time.NewTimer(world.due(in))
		} else {
			injTimer.Reset(world.due(in))
		}
		injC = injTimer.C
	}
	defer func() {
		if injTimer != nil {
			injTimer.Stop()
		}
	}()
	armInjection()
	// Checkpoint signals gorun owes the ranks (Job.CheckpointBefore).
	cues := world.checkpointCues(time.Now(), r.cfg.Timeout)
	var cueC <-chan time.Time
	armCue := func() {
		cueC = nil
		if len(cues) > 0 && reason == notStopping {
			cueC = time.After(time.Until(cues[0].at))
		}
	}
	armCue()
	ctxDone := ctx.Done()
	var flightTimer <-chan time.Time   // SIGUSR2: when to merge the ranks' dumps
	var timeoutFlight <-chan time.Time // --timeout: when to merge them and stop
	var flightAsked time.Time
	// A multi-host job collects the dumps from the host agents once the
	// ranks had time to write them: collect ends when every agent
	// answered or after flightWait, then prints (and, for --timeout,
	// stops the job).
	var collectC <-chan time.Time
	collecting, collectWhy, collectStop, answered := false, "", false, 0
	printFlight := func(why string, thenStop bool) {
		printed := r.flight.print(why, flightAsked)
		if thenStop {
			r.flight.printed = printed
			stop(stopTimeout, syscall.SIGTERM)
		} else if !printed {
			r.flight.stderr.write([]byte("gorun: SIGUSR2: no rank wrote flight records (no communicator open?)\n"))
		}
	}
	flightDue := func(why string, thenStop bool) {
		if !r.flight.isRemote() {
			printFlight(why, thenStop)
			return
		}
		r.home.command(supervisorCmd{Op: "flight"})
		collecting, collectWhy, collectStop, answered = true, why, thenStop, 0
		collectC = time.After(flightWait)
	}
	collected := func() {
		collecting, collectC = false, nil
		printFlight(collectWhy, collectStop)
	}

	for !done {
		nfail := len(failures)
		select {
		case ev, ok := <-events:
			if !ok {
				supErr = r.home.lostWhy()
				if supErr == nil {
					supErr = errors.New("supervisor exited before reporting the end of the job")
				}
				done = true
				break
			}
			if ev.Ev != "done" && ev.Ev != "lost" && (ev.Rank < 0 || ev.Rank >= len(ranks)) {
				r.log.Warn().Int("rank", ev.Rank).Str("ev", ev.Ev).Msg("supervisor reported an unknown rank; ignored")
				continue
			}
			switch ev.Ev {
			case "started":
				ranks[ev.Rank].pid = ev.PID
				r.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Msg("rank started")
				if starts++; starts == len(ranks) {
					world.ranksStarted(time.Now())
				}
			case "frozen":
				// Stopped past its lease, most often before the world
				// formed (freeze.go): a failure of its own. The teardown
				// that follows continues and ends it.
				st := &ranks[ev.Rank]
				st.frozen = ev.Frozen
				if st.exited || reason != notStopping {
					break
				}
				r.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Str("why", ev.Err).Msg("rank frozen")
				failures = append(failures, failure{rank: ev.Rank, pid: ev.PID, code: 1, frozen: ev.Frozen, why: ev.Err, blame: -1})
				stop(stopFailure, syscall.SIGTERM)
			case "step":
				world.firstStep(ev.Rank, ev.Step, time.Now())
			case "injected", "fault-cont":
				r.logInjection(world, ev)
			case "failed":
				if starts++; starts == len(ranks) {
					world.ranksStarted(time.Now())
				}
				ranks[ev.Rank].exited = true
				failures = append(failures, failure{rank: ev.Rank, startErr: errors.New(ev.Err)})
				r.log.Debug().Int("rank", ev.Rank).Str("err", ev.Err).Msg("rank could not start")
				stop(stopFailure, syscall.SIGTERM)
			case "exited":
				st := &ranks[ev.Rank]
				st.exited, st.frozen = true, ev.Frozen
				if i := slices.IndexFunc(failures, func(f failure) bool { return f.rank == ev.Rank && f.mpi != nil && f.mpi.Aborted }); i >= 0 {
					// Its MPI_Abort was told first and is the cause; the
					// exit that follows it is the same failure, now with
					// its reap time.
					failures[i].exitedAt = ev.At
					break
				}
				r.log.Debug().Int("rank", ev.Rank).Int("pid", ev.PID).Int("code", ev.Code).Int("signal", ev.Signal).Int64("reaped_at_ns", ev.At).Msg("rank exited")
				if ev.Collateral && (ev.Code != 0 || ev.Signal != 0) {
					// A consequence: counted apart, neither stopped by
					// gorun nor failed on its own.
					st.stopped = false
					failures = append(failures, failure{rank: ev.Rank, pid: ev.PID, code: ev.Code, signal: syscall.Signal(ev.Signal),
						collateral: true, blame: ev.Blame, why: ev.Err, relay: ev.Relay, desync: ev.Desync, exitedAt: ev.At})
					stop(stopFailure, syscall.SIGTERM)
				} else if (ev.Code != 0 || ev.Signal != 0) && !(st.stopped && causedByStop(ev, sentSig, killed)) {
					// Its own failure, even if the teardown had begun: it
					// does not count as one gorun stopped, or the final
					// line would claim to have stopped ranks that all
					// failed on their own.
					st.stopped = false
					failures = append(failures, failure{rank: ev.Rank, pid: ev.PID, code: ev.Code, signal: syscall.Signal(ev.Signal), exitedAt: ev.At})
					stop(stopFailure, syscall.SIGTERM)
				} else if ev.Unfinalized && !st.stopped {
					failures = append(failures, failure{rank: ev.Rank, pid: ev.PID, code: 1, mpi: &MPIError{Rank: ev.Rank, PID: ev.PID}})
					stop(stopFailure, syscall.SIGTERM)
				}
			case "pmi-fence":
				if cmd, ok, err := fences.add(ev); err != nil {
					r.log.Error().Err(err).Msg("PMI barrier")
					failures = append(failures, failure{rank: ev.Rank, startErr: fmt.Errorf("%w: %v", errPMIProtocol, err)})
					stop(stopFailure, syscall.SIGTERM)
				} else if ok {
					r.log.Debug().Int("epoch", cmd.Epoch).Int("keys", len(fences.kvs)).Msg("PMI barrier released")
					r.home.command(cmd)
				}
			case "pmi-get":
				r.home.commandNode(ev.node, fences.get(ev))
			case "pmi-abort":
				pid := ranks[ev.Rank].pid
				abort := &MPIError{Rank: ev.Rank, PID: pid, Aborted: true, Code: ev.Code, Message: ev.Err}
				if reason == notStopping {
					failures = append(failures, failure{rank: ev.Rank, pid: pid, code: ev.Code, mpi: abort})
					stop(stopFailure, syscall.SIGTERM)
				} else if i := slices.IndexFunc(failures, func(f failure) bool { return f.rank == ev.Rank }); i >= 0 && failures[i].mpi == nil && failures[i].signal == 0 {
					// A client that exits right after sending its abort
					// (Slurm's libpmi2 does) can be reaped before the
					// abort is read: the abort is the cause.
					failures[i].mpi = abort
				}
			case "lost":
				// A host agent is gone; its ranks are, or soon will be (its
				// host agent kills them when the lease runs out): count them
				// as failed.
				n := r.plan.Nodes[ev.node]
				r.log.Debug().Str("host", n.Name).Str("err", ev.Err).Msg("host lost")
				for rk := n.FirstRank; rk < n.FirstRank+n.Ranks; rk++ {
					ranks[rk].exited = true
					ranks[rk].stopped = false
				}
				failures = append(failures, failure{rank: n.FirstRank, lost: errors.New(ev.Err), lostRanks: n.Ranks})
				stop(stopFailure, syscall.SIGTERM)
				left--
				done = left <= 0
			case "flight":
				if ev.Flight != nil {
					r.flight.store(*ev.Flight)
				}
				if answered += btoi(ev.FlightEnd); collecting && answered >= r.home.supervisors() {
					collected()
				}
			case "done":
				if ev.Strays > 0 {
					r.log.Warn().Int("strays", ev.Strays).Msg("ranks left processes running; they were stopped")
				}
				left--
				done = left <= 0
			}
		case <-timeout:
			timeout = nil
			// Ranks that keep flight records dump them first (a job that
			// runs into --timeout is usually stuck), then the job stops.
			// The time is taken before the signals go out: a rank can
			// dump before signalReady returns, and print keeps only
			// dumps written at or after flightAsked.
			asked := time.Now()
			switch {
			case r.flight.isRemote():
				// Each agent signals its own ready ranks.
				r.flight.ask()
				r.home.command(supervisorCmd{Op: "flight-signal"})
				flightAsked = asked
				timeoutFlight = time.After(flightWait)
			case r.flight.signalReady() > 0:
				flightAsked = asked
				timeoutFlight = time.After(flightWait)
			default:
				stop(stopTimeout, syscall.SIGTERM)
			}
		case <-timeoutFlight:
			timeoutFlight = nil
			flightDue("--timeout", true)
		case <-collectC:
			collected() // an agent that did not answer in time is left out
		case <-injC:
			world.sent(injNext)
			r.home.command(supervisorCmd{Op: "inject", Ranks: injNext.ranks, Signal: int(injNext.sig), For: injNext.cont, Fault: injNext.id,
				Duty: injNext.duty, Period: injNext.period,
				KillHost: injNext.kind == FaultKillHost, AfterSteps: injNext.afterSteps})
			armInjection()
		case <-cueC:
			c := cues[0]
			cues = cues[1:]
			r.log.Warn().Str("why", c.why).Stringer("signal", world.rep.ckptSig).Msg("asking the ranks for a checkpoint")
			r.home.command(supervisorCmd{Op: "signal", Signal: int(world.rep.ckptSig)})
			world.checkpointSent(c, time.Now())
			armCue()
		case c := <-world.cues():
			if reason != notStopping {
				break // the world is ending anyway: no notice to act on
			}
			r.log.Warn().Str("why", c.why).Stringer("signal", world.rep.ckptSig).Msg("asking the ranks for a checkpoint")
			r.home.command(supervisorCmd{Op: "signal", Signal: int(world.rep.ckptSig)})
			world.checkpointSent(c, time.Now())
		case now := <-dumpC:
			if r.flight.dumpedSince(dumpAsked) >= dumpWant || now.After(dumpUntil) {
				dumpTick.Stop()
				dumpC = nil
				if !killed {
					signalStop(sentSig, false)
				}
			}
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
				asked := time.Now() // before any rank can dump (see <-timeout)
				if sig == syscall.SIGUSR2 && r.flight.active() {
					r.flight.ask()
				}
				r.home.command(supervisorCmd{Op: "signal", Signal: int(sig)})
				if sig == syscall.SIGUSR2 && r.flight.active() {
					// The ranks dump their flight records (comm); merge them
					// once they have had time to.
					flightAsked = asked
					flightTimer = time.After(flightWait)
				}
			}
		case <-flightTimer:
			flightTimer = nil
			flightDue("SIGUSR2", false)
		}
		if len(failures) > nfail {
			now := time.Now()
			for i := nfail; i < len(failures); i++ {
				failures[i].arrived = now
			}
			world.failed(failures[nfail].String(), now)
			world.saw(failures[nfail:], now)
			world.noticed(failures[nfail:], now)
		}
		if reason != notStopping {
			injC = nil // no fault goes into a world that is being stopped
			cueC = nil // nor a checkpoint signal
		}
	}

	// Counted at the end: a rank whose start failure was still in flight
	// when the teardown began was never running, so it was not stopped.
	for _, st := range ranks {
		if st.stopped && st.pid > 0 {
			stopped++
		}
	}
	lostRanks := 0
	if supErr != nil {
		// The ranks died with the supervisor (Pdeathsig); their process groups
		// may still hold children, which nobody else will stop now.
		for _, st := range ranks {
			if st.pid > 0 && !st.exited {
				lostRanks++
				r.home.killGroup(st.pid)
			}
		}
	}
	switch {
	case supErr != nil && reason != stopFailure:
		// Even when gorun was already stopping the job (a signal, the
		// timeout), losing the supervisor is the news: the ranks did not
		// end the way gorun asked.
		return &SupervisorError{Err: supErr, Ranks: lostRanks}
	case reason == stopTimeout:
		return &TimeoutError{After: r.cfg.Timeout, Stopped: stopped}
	case reason == stopSignal:
		return &InterruptedError{Signal: stopSig, Stopped: stopped}
	case reason == stopContext:
		return fmt.Errorf("launcher: job canceled; stopped %d %s: %w", stopped, plural(stopped, "rank", "ranks"), ctx.Err())
	case len(failures) > 0:
		collateral := 0
		own := make([]failure, 0, len(failures))
		for _, f := range failures {
			if f.collateral {
				collateral++
			} else {
				own = append(own, f)
			}
		}
		if len(own) == 0 {
			return r.blamed(failures, ranks, stopped)
		}
		f := pickFailure(own, r.cfg.ExitPolicy)
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
		if f.frozen != "" {
			e := &FrozenError{Rank: f.rank, Host: host, PID: f.pid, State: f.frozen, Why: f.why, Stopped: stopped, Collateral: collateral,
				AlsoFailed: alsoFailed(own, f)}
			if ranks[f.rank].stopped && ranks[f.rank].pid > 0 {
				e.Stopped-- // named, not one of the others
			}
			return e
		}
		if f.lost != nil {
			return &HostLostError{Host: host, FirstRank: f.rank, Ranks: f.lostRanks, Err: f.lost, Stopped: stopped, Collateral: collateral}
		}
		if f.startErr != nil {
			return &StartError{Rank: f.rank, Host: host, Err: f.startErr, Stopped: stopped}
		}
		return &RankExitError{Rank: f.rank, Host: host, PID: f.pid, Code: f.code, Signal: f.signal, Stopped: stopped,
			AlsoFailed: alsoFailed(own, f), Collateral: collateral}
	}
	return nil
}

// blamed names the cause when every failure was collateral: no rank died
// or failed on its own as far as gorun saw (a frozen rank, a cut link),
// yet the runtimes reported one lost. The cause is the rank the first
// first-hand report blames; without one (only relayed aborts reached
// gorun), the first rank that reported nothing itself, following each
// report's blame in arrival order (rank 0 blames rank 2, which relayed
// rank 3's abort). When that rank ran on, on another host than its
// reporter, the network between them is the cause (CollateralError.Link).
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
	e := &CollateralError{ReportedBy: reporter.rank, ReporterHost: r.plan.Ranks[reporter.rank].Host, Why: reporter.why, Blame: -1, Failed: len(fs),
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
	}
	return e
}

// desynced is the verdict when the runtimes reported a desync: a report's
// words (both calls, and both sides when a comparison of every rank's
// calls found them), blaming the rank it names (the smaller side's) or
// none. The report chosen is the first that knows the sides, else the
// first first-hand one. Nil when no report was of a desync.
func (r *jobLoop) desynced(fs []failure, ranks []rankState, stopped int) *CollateralError {
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
	e := &CollateralError{Desync: true, ReportedBy: rep.rank, ReporterHost: r.plan.Ranks[rep.rank].Host, Why: rep.why, Blame: -1,
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

// logInjection records a supervisor's answer to an injection and logs it
// (at warn, so that it shows by default: a fault in the output of a job
// must never be a mystery).
func (r *jobLoop) logInjection(world *worldRun, ev supervisorEvent) {
	if world == nil {
		return
	}
	f := world.injected(ev, time.Now())
	if f == nil {
		return
	}
	l := r.log.Warn().Str("kind", f.Kind).Str("spec", f.Spec).Int("rank", ev.Rank).Str("host", r.plan.Ranks[ev.Rank].Host).
		Int("pid", ev.PID).Int("restart", world.restart).Float64("at_s", world.rep.since(time.Now()))
	if ev.Step > 0 {
		l = l.Int64("step", ev.Step)
	}
	switch {
	case ev.Ev == "fault-cont":
		l.Msg("injected stop ended: SIGCONT sent")
	case ev.Err != "":
		l.Str("why", ev.Err).Msg("fault not injected")
	default:
		l.Str("signal", f.Signal).Msg("fault injected")
	}
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
//   - the time each process was reaped (supervisorEvent.At), which its
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
func causedByStop(ev supervisorEvent, sent syscall.Signal, killed bool) bool {
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
