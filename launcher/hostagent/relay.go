package hostagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/liveness"
	"github.com/gorun-hpc/gorun/launcher/flight"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// relay runs the ranks through a supervisor and forwards everything until
// the supervisor reports the end (then "done" goes to gorun after the last
// output) or gorun is gone (then the supervisor is told to kill it all).
//
// Goroutines, all waited for before relay returns:
//   - one per rank stream (outWG, pumpOutput): pipe → output frames.
//     They never stop reading, even when the connection is dead, so a
//     rank never blocks on a full pipe before the supervisor kills it.
//   - the connection reader (readCommands): frames from gorun → commands
//     to the supervisor, stdin chunks to rank 0's queue; every frame
//     (pings included) renews lastHeard, the lease's clock.
//   - the event reader (forwardEvents): supervisor events → event frames,
//     holding back "done" (doneEv) until every output stream reached EOF.
//   - the pinger: a ping every lease/4 so gorun's lease stays alive while
//     nothing else flows; it is separate so a write stuck on a dead link
//     cannot delay the lease check below.
//   - pingSupervisor: a ping to the supervisor every lease/4, its lease on
//     this agent; and the supervisor's lease on its events (supervisor.Client.WatchLease).
//   - stdin's queue writer, when rank 0 reads gorun's stdin.
//
// relay's own loop (watch) decides the end: "done" (finish), or the
// connection closing or falling silent for the lease (gorun is gone or
// cut off: close the supervisor's command pipe, which kills every rank and
// descendant on this host, and return the reason).
func relay(w *wire.Conn, job *wire.Job, hello wire.Hello, ranks []wire.HostRank, pj *wire.PMIJob, log zerolog.Logger, stderr io.Writer) error {
	lease := job.Lease // > 0: serve refuses a job without one
	r := &agentRelay{w: w, job: job, ranks: ranks, log: log, lease: lease,
		gone: make(chan error, 1), doneEv: make(chan wire.Event, 1), readerDone: make(chan struct{}), stopPing: make(chan struct{})}
	r.p = &supervisor.Pipes{Spec: wire.SupervisorSpec{Grace: job.Grace, LogLevel: log.GetLevel(), KeepOnSignal: os.Getenv("SLURM_STEP_ID") != "", PMI: pj,
		ClientLease: lease, Respawn: job.Respawn}}
	defer r.p.CloseChildEnds()
	// The ranks' flight records: written here (launcher/flight), sent to
	// gorun (sendFlight). Removed at the end; should this agent die
	// first, by its supervisor.
	var flightEnv []string
	if job.Flight {
		d, err := flight.MakeTemp()
		if err != nil {
			log.Warn().Err(err).Msg("no flight-record directory; records go to the ranks' logs only")
		} else {
			r.flight = d
			defer d.Remove()
			r.p.Spec.RemoveDir = d.Temp()
			flightEnv = []string{d.Env()}
		}
	}
	if len(ranks) > 0 {
		r.firstRank = ranks[0].Rank
	}
	if err := r.addRanks(hello, flightEnv); err != nil {
		return err
	}
	// What the ranks leave in other sessions when the supervisor dies
	// comes to this agent, not init; supervisor.KillLeftovers ends it in finish.
	supervisor.AdoptOrphans()
	sup, err := supervisor.Start("", r.p.Extra, stderr, jobIDOf(ranks))
	r.p.CloseChildEnds()
	if err != nil {
		if r.stdin != nil {
			r.stdin.w.Close()
		}
		r.p.CloseStreams()
		return fmt.Errorf("job supervisor failed: %w", err)
	}
	r.sup = sup
	if r.p.Spec.Cgroup = sup.CgroupDir(); sup.CgroupErr() != nil {
		log.Debug().Err(sup.CgroupErr()).Msg("no job cgroup: a SIGKILLed supervisor's escaped descendants are found by their environment only")
	}
	defer r.p.CloseStreams()
	defer sup.CloseEvents()
	// After closeCommands (defers run last first): the supervisor exits
	// once its command pipe is closed, and only then is its cgroup
	// emptied and removed, on every way out of this function.
	defer func() {
		_ = sup.Wait()
		r.releaseCgroup()
	}()
	defer sup.CloseCommands()
	_ = sup.Send(r.p.Spec)

	// Before any goroutine below writes to the connection (wire.Conn:
	// set before concurrent use): a write stuck on a dead link gives up.
	w.SetWriteTimeout(lease)
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.stdin != nil {
		wg.Go(r.stdin.run)
		defer r.stdin.close()
	}
	for _, s := range r.p.Streams {
		r.outWG.Go(func() { r.pumpOutput(s) })
	}
	r.lastHeard.Store(time.Now().UnixNano())
	wg.Go(r.readCommands)
	// The supervisor's lease: silent (stopped, hung) past it, it is
	// killed, its event pipe ends and the loop below sees it lost.
	wg.Go(func() { sup.WatchLease(lease, r.readerDone, &r.supSilent) })
	wg.Go(r.forwardEvents)
	defer close(r.stopPing)
	wg.Go(func() { w.PingEvery(lease/4, r.stopPing) })
	wg.Go(r.pingSupervisor)

	lost, ev, ok := r.watch()
	if lost == nil {
		return r.finish(ev, ok)
	}
	// gorun is gone: the supervisor kills every rank and descendant when
	// its command pipe closes.
	log.Warn().Err(lost).Msg("lost gorun; killing this host's ranks")
	sup.CloseCommands()
	_ = sup.Wait()
	r.releaseCgroup()
	w.Close()
	r.outWG.Wait()
	return lost
}

// agentRelay is what relay shares with the goroutines it starts and the
// steps it takes; relay owns it and waits for every goroutine before it
// returns.
type agentRelay struct {
	w         *wire.Conn
	job       *wire.Job
	ranks     []wire.HostRank
	log       zerolog.Logger
	lease     time.Duration
	p         *supervisor.Pipes
	sup       *supervisor.Client
	flight    *flight.Dir // nil without flight records
	firstRank int
	stdin     *stdinQueue // nil unless rank 0 is here and reads gorun's stdin

	// outWG counts the rank streams still being read (pumpOutput).
	outWG sync.WaitGroup
	// gone receives why the connection failed (gorun hung up or broke
	// the protocol; readCommands); lastHeard is when any frame last came from
	// gorun (Unix ns).
	gone      chan error
	lastHeard atomic.Int64
	// doneEv carries the supervisor's "done", held back until every output
	// stream reached EOF, and closes after it (or without it, when the
	// supervisor's events ended first); readerDone closes when the
	// supervisor's events end; supSilent is how long the supervisor was
	// silent when its lease killed it.
	doneEv     chan wire.Event
	readerDone chan struct{}
	supSilent  atomic.Int64
	stopPing   chan struct{}
}

// addRanks adds every rank to the supervisor's spec, with a pipe for
// rank 0's stdin when gorun forwards it.
func (r *agentRelay) addRanks(hello wire.Hello, flightEnv []string) error {
	base := rankenv.WithoutOtherLaunchers(filterEnv(os.Environ()))
	for _, rr := range r.ranks {
		stdinFD := -1
		if rr.Rank == 0 && r.job.Stdin {
			pr, pw, err := os.Pipe()
			if err != nil {
				r.p.CloseStreams()
				return fmt.Errorf("pipe: %w", err)
			}
			stdinFD = r.p.Inherit(pr, true)
			r.stdin = newStdinQueue(pw)
		}
		sr := wire.SupervisorRank{Rank: rr.Rank, Path: hello.Program, Argv: r.job.Argv, Dir: rankDir(r.job.Dir), Env: plan.MergeEnv(base, rr.Env, flightEnv), GPU: rr.GPU}
		if err := r.p.AddRank(sr, stdinFD); err != nil {
			if r.stdin != nil {
				r.stdin.w.Close()
			}
			r.p.CloseStreams()
			return err
		}
	}
	return nil
}

// releaseCgroup empties and removes the job cgroup, if there is one.
func (r *agentRelay) releaseCgroup() {
	if _, err := r.sup.ReleaseCgroup(); err != nil {
		r.log.Warn().Err(err).Msg("job cgroup")
	}
}

// pumpOutput sends one rank stream to gorun as output frames until EOF.
func (r *agentRelay) pumpOutput(s supervisor.Stream) {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.R.Read(buf)
		if n > 0 {
			// A failed write means gorun is gone; keep draining so the
			// ranks never block on a full pipe before the supervisor
			// kills them.
			_ = r.w.SendOutput(s.Rank, s.Kind, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// readCommands reads gorun's frames until the connection fails: commands
// go to the supervisor, stdin chunks to rank 0's queue, and every frame
// (pings included) renews lastHeard.
func (r *agentRelay) readCommands() {
	var buf []byte
	// asked is when this agent last told its ranks to dump their
	// flight records (its own clock, the ranks' clock).
	var asked time.Time
	for {
		typ, p, err := r.w.ReadFrame(buf)
		if err != nil {
			r.gone <- err
			return
		}
		buf = p[:0]
		r.lastHeard.Store(time.Now().UnixNano())
		if typ == wire.FrameStdin && r.stdin != nil {
			r.stdin.push(p)
			continue
		}
		if typ != wire.FrameMsg {
			continue
		}
		var m wire.Msg
		if json.Unmarshal(p, &m) != nil || m.T != "cmd" || m.Cmd == nil {
			continue
		}
		switch {
		case m.Cmd.Op == "flight":
			r.sendFlight(asked, true)
		case m.Cmd.Op == "flight-signal":
			asked = time.Now()
			r.flight.SignalReady()
		default:
			if m.Cmd.Op == "signal" && m.Cmd.DumpFirst {
				// Blocks this reader for at most flight.BeforeStop;
				// gorun's grace runs meanwhile and its kill queues
				// behind.
				r.flight.DumpBeforeStop()
			}
			if m.Cmd.Op == "signal" && m.Cmd.Signal == int(syscall.SIGUSR2) {
				asked = time.Now()
			}
			_ = r.sup.Send(m.Cmd)
		}
	}
}

// forwardEvents sends the supervisor's events to gorun as they come,
// except "done", which goes to doneEv to wait for the last output so that
// gorun has it all when it sees the host finish.
func (r *agentRelay) forwardEvents() {
	defer close(r.readerDone)
	var last *wire.Event
	r.sup.ReadEvents(func(ev wire.Event) {
		if ev.Ev == "done" {
			last = &ev
			return
		}
		_ = r.w.Send(wire.Msg{T: "event", Event: &ev})
		if ev.Ev == "injected" && ev.KillHost && ev.Err == "" {
			// An injected kill-host (launcher's inject.go): the ranks are signaled
			// and gorun has the event; now this host's agent dies as a
			// crashed machine's would, without a word. Its supervisor
			// sees its command pipe end and kills what is left; gorun
			// sees the connection drop: "host lost".
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	})
	if last != nil {
		r.doneEv <- *last
	}
	close(r.doneEv)
}

// pingSupervisor renews the supervisor's lease on this agent
// (ClientLease): a stopped agent stops pinging, and its ranks die
// without it.
func (r *agentRelay) pingSupervisor() {
	t := time.NewTicker(r.lease / 4)
	defer t.Stop()
	for {
		select {
		case <-r.stopPing:
			return
		case <-t.C:
			_ = r.sup.Send(wire.Cmd{Op: "ping"})
		}
	}
}

// watch waits for the end: the supervisor's "done" (or its event stream
// ending: ok false), or gorun lost — the connection closed or silent past
// the lease — with the reason.
func (r *agentRelay) watch() (lost error, ev wire.Event, ok bool) {
	check := time.NewTicker(r.lease / 8)
	defer check.Stop()
	// gorun is on another host: no process of its to read. What this
	// agent knows is its own lateness: time it could not run (its check
	// ticks came late) is not gorun's silence (internal/liveness,
	// notes/verdicts.md).
	stalls := liveness.StallMeter{Period: r.lease / 8, Slack: r.lease / 16}
	stalls.Tick(time.Now())
	for {
		select {
		case err := <-r.gone:
			return fmt.Errorf("connection to gorun closed: %w", err), ev, false
		case <-check.C:
			now := time.Now()
			stalls.Tick(now)
			heard := time.Unix(0, r.lastHeard.Load())
			if silent := now.Sub(heard); silent-stalls.Since(heard) > r.lease {
				return fmt.Errorf("no word from gorun for %s (lease %s)", silent.Round(time.Millisecond), r.lease), ev, false
			}
		case ev, ok = <-r.doneEv:
			return nil, ev, ok
		}
	}
}

// finish ends a job whose ranks are all gone: their flight records and
// then "done" go to gorun after the last output — or, when the supervisor
// was lost (!ok), what is left is killed and gorun is told why — and the
// connection is closed once gorun hung up.
func (r *agentRelay) finish(ev wire.Event, ok bool) error {
	// Every rank is gone: what they dumped goes to gorun before "done"
	// (ranks dump when their communicator fails), and the directory stays
	// this agent's to remove.
	r.sendFlight(time.Time{}, false)
	_ = r.sup.Send(wire.Cmd{Op: "bye"})
	r.sup.CloseCommands()
	supErr := r.sup.Wait()
	var supLost error
	if !ok {
		supLost = errors.New("its job supervisor exited without reporting the end of the job")
		if supErr != nil {
			supLost = fmt.Errorf("its job supervisor died (%v) without reporting the end of the job", supErr)
		}
		if d := time.Duration(r.supSilent.Load()); d > 0 {
			supLost = fmt.Errorf("its job supervisor was silent for %s, past the lease of %s (stopped or hung), and was killed", d.Round(time.Millisecond), r.lease)
		}
		// The supervisor died without killing what the ranks started in
		// other sessions, which may hold output pipes open: end it, and
		// stop waiting for those pipes after the grace period rather
		// than forever.
		n, cgErr := r.sup.ReleaseCgroup()
		if cgErr != nil {
			r.log.Warn().Err(cgErr).Msg("job cgroup")
		}
		if n += supervisor.KillLeftovers(jobIDOf(r.ranks)); n > 0 {
			r.log.Warn().Int("processes", n).Msg("killed processes the job left after its supervisor was lost")
		}
		drainOutput(&r.outWG, r.p, r.job.Grace+time.Second)
	}
	r.outWG.Wait()
	if ok {
		_ = r.w.Send(wire.Msg{T: "event", Event: &ev})
	} else {
		// Say why before hanging up: gorun would otherwise see only a
		// closed connection, which reads as a killed agent or a
		// rebooted host.
		_ = r.w.Send(wire.Msg{T: "supervisor-lost", Err: supLost.Error() + "; the host agent ended its ranks"})
	}
	// Half-close and wait for gorun to hang up (it does once every host
	// is done): closing outright while gorun's pings sit unread would
	// reset the connection, and a reset discards whatever of ours was
	// still in flight — "done" included.
	if tc, isTCP := r.w.NetConn().(*net.TCPConn); isTCP {
		_ = tc.CloseWrite()
		select {
		case <-r.gone:
		case <-time.After(2 * r.lease):
		}
	}
	r.w.Close()
	return supLost
}

// sendFlight sends gorun, as "flight" events under this host's first
// rank, every dump in the agent's flight directory written at or after
// since, then, when end is set, an event that says the answer is complete.
func (r *agentRelay) sendFlight(since time.Time, end bool) {
	dumps, err := r.flight.Read()
	if err != nil {
		r.log.Warn().Err(err).Msg("reading the ranks' flight records")
	}
	for i := range dumps {
		if !dumps[i].Time.Before(since) {
			_ = r.w.Send(wire.Msg{T: "event", Event: &wire.Event{Ev: "flight", Rank: r.firstRank, Flight: &dumps[i]}})
		}
	}
	if end {
		_ = r.w.Send(wire.Msg{T: "event", Event: &wire.Event{Ev: "flight", Rank: r.firstRank, FlightEnd: true}})
	}
}

// jobIDOf returns the job's GORUN_JOB_ID from its ranks' environment.
func jobIDOf(ranks []wire.HostRank) string {
	for _, r := range ranks {
		for _, kv := range r.Env {
			if v, ok := strings.CutPrefix(kv, rankenv.JobID+"="); ok {
				return v
			}
		}
	}
	return ""
}

// drainOutput waits up to d for the output readers, then closes their
// pipes so that readers stuck on a pipe an escaped process holds return.
func drainOutput(wg *sync.WaitGroup, p *supervisor.Pipes, d time.Duration) {
	done := make(chan struct{})
	go func() { // owned: ends when wg does, which closing the pipes ensures
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		p.CloseStreams()
		<-done
	}
}

// filterEnv drops gorun-internal variables from an agent's environment
// before it becomes the ranks' base.
func filterEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "GORUN_INTERNAL_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
