package launcher

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// fakeJob drives the job loop with a scripted supervisor inside a synctest
// bubble, so the timing rules (grace, timeout) are checked exactly and
// without real processes. Its fakeHome is the third rankHome, beside
// localHome and hostsHome.
type fakeJob struct {
	t      *testing.T
	events chan wire.Event
	cmds   chan wire.Cmd
	errc   chan error
	// killed records the process groups loop killed itself.
	killed chan int
}

// basePlanConfig is a valid plan.Config (one rank on localhost) that a
// test changes where it needs to.
func basePlanConfig() plan.Config {
	return plan.Config{JobID: "job1", Secret: "s3cret", MasterPort: 1000, RdzvPort: 1001}
}

func startFakeJob(t *testing.T, np int, cfg Config) *fakeJob {
	t.Helper()
	return startFakeJobIn(t, np, cfg, cfg.loop().world)
}

// startFakeJobIn is startFakeJob in the world w.
func startFakeJobIn(t *testing.T, np int, cfg Config, w worldHooks) *fakeJob {
	t.Helper()
	c := basePlanConfig()
	c.NP = np
	plan, err := plan.New(c)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeJob{t: t, events: make(chan wire.Event, 64), cmds: make(chan wire.Cmd, 64), errc: make(chan error, 1), killed: make(chan int, 64)}
	cfg.Logger = zerolog.Nop()
	lc := cfg.loop()
	lc.world = w
	r := &jobLoop{cfg: lc, plan: plan, log: cfg.Logger, home: &fakeHome{f: f, n: 1}}
	go func() { f.errc <- r.run(context.Background()) }()
	for i := range np {
		f.events <- wire.Event{Ev: "started", Rank: i, PID: 1000 + i}
	}
	return f
}

// fakeHome is the rankHome of a fakeJob: events come from the test,
// commands and group kills are recorded.
type fakeHome struct {
	f *fakeJob
	n int // supervisors
}

var _ rankHome = (*fakeHome)(nil)

func (h *fakeHome) events() <-chan wire.Event     { return h.f.events }
func (h *fakeHome) supervisors() int              { return h.n }
func (h *fakeHome) command(c wire.Cmd)            { h.f.cmds <- c }
func (h *fakeHome) commandNode(_ int, c wire.Cmd) { h.f.cmds <- c }
func (h *fakeHome) killGroup(pgid int)            { h.f.killed <- pgid }
func (h *fakeHome) lostWhy() error                { return nil }

// exit reports rank's exit with a code (sig 0) or a signal.
func (f *fakeJob) exit(rank, code int, sig syscall.Signal) {
	f.events <- wire.Event{Ev: "exited", Rank: rank, PID: 1000 + rank, Code: code, Signal: int(sig)}
}

// expect waits until loop is idle and checks the one command it sent.
func (f *fakeJob) expect(op string, sig syscall.Signal) {
	f.t.Helper()
	synctest.Wait()
	select {
	case c := <-f.cmds:
		if c.Op != op || syscall.Signal(c.Signal) != sig {
			f.t.Fatalf("command %+v, want %s %v", c, op, sig)
		}
	default:
		f.t.Fatalf("no command, want %s %v", op, sig)
	}
}

// expectNone checks that loop sent nothing.
func (f *fakeJob) expectNone() {
	f.t.Helper()
	synctest.Wait()
	select {
	case c := <-f.cmds:
		f.t.Fatalf("unexpected command %+v", c)
	default:
	}
}

func (f *fakeJob) done() error {
	f.events <- wire.Event{Ev: "done"}
	close(f.events)
	return <-f.errc
}

func testConfig() Config {
	c := DefaultConfig()
	c.Stdout, c.Stderr = os.Stdout, os.Stderr
	return c
}

// SIGKILL follows SIGTERM after exactly the grace period, not before.
func TestLoopGraceTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Grace = 7 * time.Second
		f := startFakeJob(t, 3, cfg)
		f.exit(1, 3, 0)
		f.expect("signal", syscall.SIGTERM)
		start := time.Now()
		f.exit(0, 0, syscall.SIGTERM)
		time.Sleep(cfg.Grace - time.Nanosecond)
		f.expectNone()
		time.Sleep(time.Nanosecond)
		f.expect("kill", 0)
		if d := time.Since(start); d != cfg.Grace {
			t.Fatalf("SIGKILL after %v, want %v", d, cfg.Grace)
		}
		f.exit(2, 0, syscall.SIGKILL)
		err := f.done()
		var re *outcome.RankExitError
		if !errors.As(err, &re) || re.Rank != 1 || re.Code != 3 || re.PID != 1001 || re.Stopped != 2 {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestLoopTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Timeout = time.Hour
		f := startFakeJob(t, 2, cfg)
		time.Sleep(time.Hour - time.Nanosecond)
		f.expectNone()
		time.Sleep(time.Nanosecond)
		f.expect("signal", syscall.SIGTERM)
		f.exit(0, 0, syscall.SIGTERM)
		f.exit(1, 143, 0)
		var te *outcome.TimeoutError
		if err := f.done(); !errors.As(err, &te) || te.Stopped != 2 || te.After != time.Hour {
			t.Fatalf("err = %v", err)
		}
	})
}

// The second SIGINT kills at once; SIGTERM during a teardown changes
// nothing; SIGUSR1 is forwarded without stopping.
func TestLoopSignals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		sigs := make(chan os.Signal, 4)
		cfg.Signals = sigs
		f := startFakeJob(t, 2, cfg)
		sigs <- syscall.SIGUSR1
		f.expect("signal", syscall.SIGUSR1)
		sigs <- syscall.SIGINT
		f.expect("signal", syscall.SIGINT)
		sigs <- syscall.SIGTERM
		f.expectNone()
		sigs <- syscall.SIGINT
		f.expect("kill", 0)
		f.exit(0, 0, syscall.SIGKILL)
		f.exit(1, 0, syscall.SIGKILL)
		var ie *outcome.InterruptedError
		if err := f.done(); !errors.As(err, &ie) || ie.Signal != syscall.SIGINT || ie.Stopped != 2 {
			t.Fatalf("err = %v", err)
		}
	})
}

// Which failure is reported: rank 3 fails first (code 2); while the others
// are being stopped, rank 1 fails on its own (code 5), rank 0 dies of the
// SIGTERM and rank 2 exits 143 — both the teardown's doing.
func TestLoopExitPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy     ExitPolicy
		rank, code int
	}{{ExitFirst, 3, 2}, {ExitLowest, 1, 5}, {ExitMax, 1, 5}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig()
				cfg.ExitPolicy = tc.policy
				f := startFakeJob(t, 4, cfg)
				f.exit(3, 2, 0)
				f.expect("signal", syscall.SIGTERM)
				f.exit(1, 5, 0)
				f.exit(0, 0, syscall.SIGTERM)
				f.exit(2, 143, 0)
				var re *outcome.RankExitError
				err := f.done()
				// Rank 1 failed on its own: not one gorun stopped.
				if !errors.As(err, &re) || re.Rank != tc.rank || re.Code != tc.code || re.Stopped != 2 || re.AlsoFailed != 1 {
					t.Fatalf("err = %v, want rank %d code %d", err, tc.rank, tc.code)
				}
			})
		})
	}
}

// A confused agent naming a rank that does not exist cannot crash gorun.
func TestLoopIgnoresUnknownRanks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := startFakeJob(t, 1, testConfig())
		f.events <- wire.Event{Ev: "exited", Rank: 5, Code: 1}
		f.events <- wire.Event{Ev: "started", Rank: -1}
		f.expectNone()
		f.exit(0, 0, 0)
		if err := f.done(); err != nil {
			t.Fatal(err)
		}
	})
}

// An agent that vanishes without "done" is an *outcome.SupervisorError.
func TestLoopAgentVanishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := startFakeJob(t, 2, testConfig())
		close(f.events)
		var ae *outcome.SupervisorError
		if err := <-f.errc; !errors.As(err, &ae) {
			t.Fatalf("err = %v", err)
		}
		// The ranks' groups may still hold children: loop kills them.
		if len(f.killed) != 2 || <-f.killed != 1000 || <-f.killed != 1001 {
			t.Fatalf("process groups killed: want 1000 and 1001")
		}
	})
}

// A lost host agent fails its ranks and ends the job: the other hosts'
// ranks get SIGTERM, and the error names the host and its ranks. The loop
// ends when every other agent reported done.
func TestLoopHostLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := basePlanConfig()
		c.Hosts = []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}}
		plan, err := plan.New(c)
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeJob{t: t, events: make(chan wire.Event, 64), cmds: make(chan wire.Cmd, 64), errc: make(chan error, 1), killed: make(chan int, 64)}
		cfg := testConfig()
		cfg.Logger = zerolog.Nop()
		r := &jobLoop{cfg: cfg.loop(), plan: plan, log: cfg.Logger, home: &fakeHome{f: f, n: 2}}
		go func() { f.errc <- r.run(context.Background()) }()
		for i := range 4 {
			f.events <- wire.Event{Ev: "started", Rank: i, PID: 1000 + i, Node: i / 2}
		}
		f.events <- wire.Event{Ev: "lost", Rank: 2, Err: "no word from its agent for 4s", Node: 1}
		f.expect("signal", syscall.SIGTERM)
		f.exit(0, 0, syscall.SIGTERM)
		f.exit(1, 143, 0)
		err = f.done() // node 0's agent
		var le *outcome.HostLostError
		if !errors.As(err, &le) || le.Host != "b" || le.FirstRank != 2 || le.Ranks != 2 || le.Stopped != 2 || le.ExitCode() != 255 {
			t.Fatalf("err = %v, want host b lost with ranks 2-3 and 2 stopped", err)
		}
		if want := "lost host b: no word from its agent for 4s; its ranks 2-3 counted as failed; stopped 2 other ranks"; err.Error() != want {
			t.Errorf("message %q, want %q", err.Error(), want)
		}
	})
}

// When every rank fails on its own, the final line says so and does not
// claim to have stopped the others; when some were stopped, it counts both.
func TestLoopEveryRankFailsOnItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := startFakeJob(t, 3, testConfig())
		f.exit(1, 3, 0)
		f.expect("signal", syscall.SIGTERM)
		f.exit(0, 3, 0)
		f.exit(2, 0, syscall.SIGSEGV)
		err := f.done()
		var re *outcome.RankExitError
		if !errors.As(err, &re) || re.Rank != 1 || re.Stopped != 0 || re.AlsoFailed != 2 {
			t.Fatalf("err = %#v", err)
		}
		if want := "rank 1 (host localhost, pid 1001) exited with code 3; 2 other ranks also failed"; err.Error() != want {
			t.Errorf("message %q, want %q", err.Error(), want)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		f := startFakeJob(t, 3, testConfig())
		f.exit(2, 1, 0)
		f.expect("signal", syscall.SIGTERM)
		f.exit(0, 4, 0)
		f.exit(1, 0, syscall.SIGTERM)
		err := f.done()
		if want := "rank 2 (host localhost, pid 1002) exited with code 1; 1 other rank also failed; stopped 1 other rank"; err == nil || err.Error() != want {
			t.Errorf("message %v, want %q", err, want)
		}
	})
}

// The verdict follows causality, not arrival order: ranks whose runtime
// reported a lost peer (Collateral) never name the job's cause while a
// rank failed on its own, a SIGKILL gorun did not send is a cause even
// during the teardown, and when every failure is collateral the line
// names the rank the reports point to.
func TestLoopCulprit(t *testing.T) {
	coll := func(rank, blame int) wire.Event {
		return wire.Event{Ev: "exited", Rank: rank, PID: 1000 + rank, Code: 6, Collateral: true, Blame: blame, Err: "comm: peer lost"}
	}
	relay := func(rank, blame int) wire.Event {
		ev := coll(rank, blame)
		ev.Relay = true
		return ev
	}
	kill3 := wire.Event{Ev: "exited", Rank: 3, PID: 1003, Signal: int(syscall.SIGKILL)}
	term := func(rank int) wire.Event {
		return wire.Event{Ev: "exited", Rank: rank, PID: 1000 + rank, Signal: int(syscall.SIGTERM)}
	}
	for _, tc := range []struct {
		name   string
		events []wire.Event
		want   string
		code   int
	}{
		{"collateral first", []wire.Event{coll(2, 3), coll(4, 3), kill3, coll(0, 2), term(1), term(5)},
			"rank 3 (host localhost, pid 1003) killed by signal 9 (killed); 3 ranks failed as a consequence (peer lost); stopped 2 other ranks", 137},
		{"culprit first", []wire.Event{kill3, coll(2, 3), coll(4, 3), coll(0, 2), coll(1, 0), coll(5, 4)},
			"rank 3 (host localhost, pid 1003) killed by signal 9 (killed); 5 ranks failed as a consequence (peer lost)", 137},
		{"all collateral (frozen rank 3)", []wire.Event{coll(2, 4), coll(4, 2), coll(0, 3), coll(1, 0), coll(5, 4), term(3)},
			`rank 3 (host localhost, pid 1003) was lost to its peers: rank 0 reported "comm: peer lost"; 5 ranks failed as a consequence (peer lost)`, 6},
		// An abort relayed around the ring: every rank reported, the
		// relays blame each other in a cycle; rank 1 saw rank 0 go
		// first-hand (a partition: rank 0 ran on and relayed too).
		{"relayed cycle", []wire.Event{relay(3, 2), relay(4, 3), coll(1, 0), relay(2, 1), relay(0, 5), relay(5, 4)},
			`rank 0 (host localhost, pid 1000) was lost to its peers: rank 1 reported "comm: peer lost"; 6 ranks failed as a consequence (peer lost)`, 6},
		{"blame unknown", []wire.Event{coll(2, -1), term(0), term(1), term(3), term(4), term(5)},
			"rank 2 reported a lost peer (comm: peer lost); 1 rank failed as a consequence (peer lost); stopped 5 other ranks", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := startFakeJob(t, 6, testConfig())
				for _, ev := range tc.events {
					f.events <- ev
				}
				err := f.done()
				if err == nil || err.Error() != tc.want {
					t.Fatalf("got  %v\nwant %s", err, tc.want)
				}
				if c := err.(interface{ ExitCode() int }).ExitCode(); c != tc.code {
					t.Fatalf("exit code %d, want %d", c, tc.code)
				}
			})
		})
	}
}

// A frozen rank resumed at the teardown can report its peers lost before
// the stop signal ends it: the verdict still blames it by name and counts
// only the other ranks as failed because of it.
func TestBlamedFrozenRankThatReportedIsNotItsOwnConsequence(t *testing.T) {
	c := basePlanConfig()
	c.Hosts = []Host{{Name: "a", Slots: 4}}
	plan, err := plan.New(c)
	if err != nil {
		t.Fatal(err)
	}
	r := &jobLoop{plan: plan, log: zerolog.Nop()}
	ranks := []rankState{{pid: 10}, {pid: 11}, {pid: 12, stopped: true, frozen: "T"}, {pid: 13}}
	why := "rendezvous: rank 2 lost: frozen or unresponsive"
	fs := []failure{
		{rank: 3, code: 6, collateral: true, blame: 2, why: why, exitedAt: 1},
		{rank: 1, code: 6, collateral: true, blame: 2, why: why, exitedAt: 2},
		{rank: 0, code: 6, collateral: true, blame: 2, why: why, exitedAt: 3},
		{rank: 2, code: 6, collateral: true, blame: 0, relay: true, why: "aborted: " + why, exitedAt: 4},
	}
	var ce *outcome.CollateralError
	if err := r.blamed(fs, ranks, 1); !errors.As(err, &ce) || ce.Blame != 2 || ce.Frozen != "T" || ce.Failed+ce.Stopped != 3 {
		t.Fatalf("want rank 2 blamed as frozen and 3 others failed or stopped; got %T %+v: %v", err, ce, err)
	}
}
