package sim

import (
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
)

// testCosts are the costs measured on the development machine
// (testdata/costs.json, written by bench/simscale -measure).
func testCosts(t *testing.T) Costs {
	t.Helper()
	c, err := LoadCosts("testdata/costs.json")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testWorld(t *testing.T, hosts, per int, mutate func(*WorldConfig)) *World {
	t.Helper()
	cfg := WorldConfig{Hosts: hosts, PerHost: per, Cores: 4, Latency: 50 * time.Microsecond, Bandwidth: 1.25e9,
		StartSpread: 200 * time.Millisecond, Rdzv: rendezvous.DefaultConfig(), Costs: testCosts(t), Seed: 7}
	if mutate != nil {
		mutate(&cfg)
	}
	w, err := NewWorld(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.StartAll()
	w.Run(60*time.Second, w.FormedAll)
	return w
}

// Every rank forms, every leader's view holds the whole world, and nobody
// forms before it started or before its leader.
func TestFormationEveryRankLearnsTheWorld(t *testing.T) {
	const hosts, per = 40, 4
	w := testWorld(t, hosts, per, nil)
	f, ok := w.Formation()
	if !ok {
		t.Fatalf("not every rank formed by %v", w.Now())
	}
	if f <= 0 || f > 5*time.Second {
		t.Errorf("formation %v after the last start, want (0, 5 s]", f)
	}
	for h := range hosts {
		if got := w.ViewSize(h); got != hosts*per {
			t.Errorf("host %d's leader counts %d ranks alive, want %d", h, got, hosts*per)
		}
		lead := w.FormedAt(h * per)
		for i := range per {
			r := h*per + i
			if w.FormedAt(r) < w.StartedAt(r) {
				t.Errorf("rank %d formed at %v before it started at %v", r, w.FormedAt(r), w.StartedAt(r))
			}
			if w.FormedAt(r) < lead {
				t.Errorf("rank %d formed at %v before its leader at %v (the table comes from the leader)", r, w.FormedAt(r), lead)
			}
		}
	}
}

// A SIGKILLed rank reaches every rank within a second; a silent host is
// named by every rank after memberlist's suspicion and the World's doubt,
// never before, and within the lease and a couple of probe rounds.
func TestDetection(t *testing.T) {
	const hosts, per = 40, 4
	w := testWorld(t, hosts, per, nil)
	rc := rendezvous.DefaultConfig()
	t0 := w.Now() + time.Second
	w.Run(t0, nil)
	w.ResetLost()
	w.KillRank(per + 1)
	w.Run(t0+10*time.Second, w.AllSurfaced)
	d, missing := w.Surfaced(t0)
	if missing != 0 || d <= 0 || d > time.Second {
		t.Errorf("killed rank: surfaced everywhere after %v with %d ranks missing; want within 1 s, none missing", d, missing)
	}
	t1 := w.Now() + time.Second
	w.Run(t1, nil)
	w.ResetLost()
	w.SilenceHost(hosts / 2)
	w.Run(t1+30*time.Second, w.AllSurfaced)
	d, missing = w.Surfaced(t1)
	lower := w.suspicionTimeout() + rc.GossipLease - rc.SuspicionTimeout
	if missing != 0 || d < lower || d > rc.GossipLease+4*rc.ProbeInterval {
		t.Errorf("silent host: named everywhere after %v with %d ranks missing; want in [%v, %v]", d, missing, lower, rc.GossipLease+4*rc.ProbeInterval)
	}
	if w.Count.FalseSuspicions != 0 {
		t.Errorf("%d false suspicions among hosts with their own CPUs", w.Count.FalseSuspicions)
	}
}

// The CPU queue: on one shared 2-core CPU formation cannot end before the
// CPU time it charged fits on two cores; with free handlers it would.
func TestCPUQueueDelaysHandlers(t *testing.T) {
	shared := func(c *WorldConfig) { c.SharedCores, c.StartSpread = 2, 0 }
	w := testWorld(t, 32, 4, shared)
	f, ok := w.Formation()
	if !ok {
		t.Fatal("shared-CPU world did not form")
	}
	busy := w.Busy(0) // one CPU for all
	if f < busy/2 {
		t.Errorf("formation %v is shorter than the %v of CPU it charged spread over 2 cores: handlers ran for free", f, busy)
	}
	fw, err := NewWorld(WorldConfig{Hosts: 32, PerHost: 4, SharedCores: 2, Rdzv: rendezvous.DefaultConfig(), Costs: testCosts(t), Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	fw.SetFreeCPU()
	fw.StartAll()
	fw.Run(60*time.Second, fw.FormedAll)
	ff, ok := fw.Formation()
	if !ok || ff >= f {
		t.Errorf("free CPU: formation %v (formed %v), want below the charged run's %v", ff, ok, f)
	}
}

// A run is a function of its seed.
func TestDeterministic(t *testing.T) {
	a := testWorld(t, 16, 4, nil)
	b := testWorld(t, 16, 4, nil)
	fa, _ := a.Formation()
	fb, _ := b.Formation()
	if fa != fb || a.Events() != b.Events() || a.Count != b.Count {
		t.Errorf("same seed, different runs: %v/%v, %d/%d events", fa, fb, a.Events(), b.Events())
	}
}

// Events run in time order, and in scheduling order at one instant.
func TestEventOrder(t *testing.T) {
	s := NewSim(3)
	var got []int
	var last time.Duration
	for i := range 200 {
		at := time.Duration(s.rng.IntN(20)) * time.Millisecond
		s.At(at, func() {
			if s.Now() < last {
				t.Fatalf("event %d at %v after one at %v", i, s.Now(), last)
			}
			last = s.Now()
			got = append(got, i)
		})
	}
	s.At(5*time.Millisecond, func() { s.After(0, func() { got = append(got, -1) }) })
	s.Run(time.Second, nil)
	if len(got) != 201 {
		t.Fatalf("%d events ran, want 201", len(got))
	}
}

func TestLaunchTreeAndPMI(t *testing.T) {
	c := testCosts(t)
	flat, err := Launch(LaunchConfig{Hosts: 1000, PerHost: 8, FanoutThreshold: -1, LauncherCores: 8, HostCores: 8, Latency: 50 * time.Microsecond, Costs: c})
	if err != nil {
		t.Fatal(err)
	}
	tree, err := Launch(LaunchConfig{Hosts: 1000, PerHost: 8, FanoutThreshold: 32, LauncherCores: 8, HostCores: 8, Latency: 50 * time.Microsecond, Costs: c})
	if err != nil {
		t.Fatal(err)
	}
	if tree.Direct != 32 || tree.ViaParents != 968 {
		t.Errorf("tree: %d direct, %d via parents; want 32 and 968 (√N)", tree.Direct, tree.ViaParents)
	}
	if tree.LastRank >= flat.LastRank || tree.LauncherBusy >= flat.LauncherBusy {
		t.Errorf("tree %v (launch node %v of CPU) not faster than flat %v (%v)", tree.LastRank, tree.LauncherBusy, flat.LastRank, flat.LauncherBusy)
	}
	small, big := PMIFence(c, 4, 8), PMIFence(c, 1000, 8)
	if small.Release != big.Release || small.Neighbours != big.Neighbours {
		t.Errorf("fence bytes per host grow with hosts: %+v vs %+v", small, big)
	}
	if wide := PMIFence(c, 4, 32); wide.Neighbours <= small.Neighbours {
		t.Errorf("neighbours' cards do not grow with ranks per host: %d vs %d", wide.Neighbours, small.Neighbours)
	}
}

func TestCostsValidate(t *testing.T) {
	c := testCosts(t)
	c.Packet = 0
	if err := c.Validate(); err == nil {
		t.Error("a zero packet cost passed validation")
	}
}

// The relayed push (a modelled design change) still forms every rank, and
// the seed sends less.
func TestPushTreeFormsWithLessFromTheSeed(t *testing.T) {
	flat := testWorld(t, 64, 4, nil)
	tree := testWorld(t, 64, 4, func(c *WorldConfig) { c.PushTree = true })
	if _, ok := tree.Formation(); !ok {
		t.Fatal("relayed push: not every rank formed")
	}
	if a, b := flat.SentBytes(0, "pushpull"), tree.SentBytes(0, "pushpull"); b >= a {
		t.Errorf("seed sent %d push-pull bytes relayed, %d directly; want fewer relayed", b, a)
	}
}

// Start times given per rank are the ones the ranks start at (a
// calibration replays a real launch's), formation counts from the last of
// them, and a list of the wrong length or beside StartSpread is refused.
func TestStartsReplayed(t *testing.T) {
	const hosts, per = 4, 2
	starts := []time.Duration{0, 3 * time.Millisecond, 40 * time.Millisecond, 41 * time.Millisecond,
		90 * time.Millisecond, 7 * time.Millisecond, 250 * time.Millisecond, 60 * time.Millisecond}
	w := testWorld(t, hosts, per, func(c *WorldConfig) { c.StartSpread, c.Starts = 0, starts })
	for r, s := range starts {
		if w.StartedAt(r) != s {
			t.Errorf("rank %d started at %v, want %v", r, w.StartedAt(r), s)
		}
		if w.FormedAt(r) < 250*time.Millisecond {
			t.Errorf("rank %d formed at %v, before the last rank started (250ms)", r, w.FormedAt(r))
		}
	}
	f, ok := w.Formation()
	last := -1 * time.Second
	for r := range starts {
		last = max(last, w.FormedAt(r))
	}
	if !ok || f != last-250*time.Millisecond {
		t.Errorf("formation %v (ok %v), want the last formation %v less the last start 250ms", f, ok, last)
	}
	for _, bad := range []WorldConfig{
		{Hosts: hosts, PerHost: per, Cores: 1, Starts: starts[:7]},
		{Hosts: hosts, PerHost: per, Cores: 1, Starts: starts, StartSpread: time.Second},
		{Hosts: hosts, PerHost: per, Cores: 1, Starts: append([]time.Duration{-time.Millisecond}, starts[1:]...)},
	} {
		bad.Rdzv, bad.Costs = rendezvous.DefaultConfig(), testCosts(t)
		if _, err := NewWorld(bad); err == nil {
			t.Errorf("starts %v with spread %v accepted", bad.Starts, bad.StartSpread)
		}
	}
}

// Each rank in its own process pays ProcessStart on its host's CPU before
// it attaches (or listens): exactly N of them more CPU than ranks in one
// process, and the last rank to start cannot form sooner than its own
// process start after it. (The 1 ms allowed below is the rest of the two
// runs, whose gossip rounds differ with their timings.)
func TestProcessStartCharged(t *testing.T) {
	const hosts, per = 8, 4
	c := testCosts(t)
	c.ProcessStart, c.ProcessIdle = 10*time.Millisecond, time.Nanosecond // idle: rounds to nothing per tick
	noSockets(&c)                                                        // TestSocketCostsCharged's part
	shared := func(in bool) func(*WorldConfig) {
		return func(w *WorldConfig) { w.SharedCores, w.InProcess, w.Costs = 2, in, c }
	}
	own := testWorld(t, hosts, per, shared(false))
	one := testWorld(t, hosts, per, shared(true))
	// The rest of the two runs differs a little (their timings differ,
	// so do their gossip rounds and pulls): 1 ms of 320.
	if got, want := own.Busy(0)-one.Busy(0), hosts*per*c.ProcessStart; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Errorf("own processes charged %v more CPU than one process, want %v ± 1ms (N × ProcessStart)", got, want)
	}
	f, ok := own.Formation()
	if !ok || f < c.ProcessStart {
		t.Errorf("formation %v after the last start (ok %v), below the last rank's own process start %v", f, ok, c.ProcessStart)
	}
	if f1, _ := one.Formation(); f1 >= f {
		t.Errorf("ranks in one process formed %v after the last start, not sooner than in their own processes (%v)", f1, f)
	}
}

// noSockets makes the socket costs between processes (near) free.
func noSockets(c *Costs) {
	c.SockPacket, c.SockMsg, c.SockConnect, c.SockByte = time.Nanosecond, time.Nanosecond, time.Nanosecond, time.Nanosecond
	c.UnixMsg, c.UnixConnect = time.Nanosecond, time.Nanosecond
}

// Ranks in their own processes pay the sockets between them: every
// attach (a Unix connect and its six messages), every table frame, every
// UDP packet and every push-pull's TCP connection, messages and bytes.
// Ranks in one process pay none of it (the in-process fit's costs hold
// their in-memory network's).
func TestSocketCostsCharged(t *testing.T) {
	const hosts, per = 8, 4
	world := func(in, sockets bool) *World {
		c := testCosts(t)
		c.ProcessStart, c.ProcessIdle = time.Nanosecond, time.Nanosecond
		if !sockets {
			noSockets(&c)
		}
		return testWorld(t, hosts, per, func(w *WorldConfig) { w.SharedCores, w.InProcess, w.Costs = 2, in, c })
	}
	if a, b := world(true, true), world(true, false); a.Busy(0) != b.Busy(0) {
		t.Errorf("in one process the socket costs changed the CPU: %v with, %v without", a.Busy(0), b.Busy(0))
	}
	a, b := world(false, true), world(false, false)
	c := &a.cfg.Costs
	attached := time.Duration(hosts * (per - 1))
	fixed := attached * (c.UnixConnect + 7*c.UnixMsg) // attach's 6 messages and the table's frame
	counted := fixed + time.Duration(a.Count.Packets)*c.SockPacket +
		time.Duration(a.Count.PushPulls)*(c.SockConnect+2*c.SockMsg)
	got := a.Busy(0) - b.Busy(0)
	t.Logf("sockets: %v more CPU (%d packets, %d push-pulls; attaches and tables %v)", got, a.Count.Packets, a.Count.PushPulls, fixed)
	// The two runs' gossip differs with their timings: 10% of slack.
	if got < fixed || float64(got) < 0.9*float64(counted) {
		t.Errorf("own processes with sockets charged %v more CPU than without, want at least the attaches and tables' %v and about %v in all", got, fixed, counted)
	}
	fa, _ := a.Formation()
	if fb, _ := b.Formation(); fa <= fb {
		t.Errorf("formation with the sockets charged %v, not later than without (%v)", fa, fb)
	}
}

// A live rank process costs ProcessIdle per second from its start, on its
// host's CPU: ranks that wait long for the last one load the cores the
// whole time. Two worlds differing only in ProcessIdle differ in CPU by
// the ranks' lifetimes times it (to a tick each).
func TestProcessIdleCharged(t *testing.T) {
	const hosts, per = 2, 2
	starts := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second}
	run := func(idle time.Duration) *World {
		c := testCosts(t)
		c.ProcessIdle = idle
		w := testWorld(t, hosts, per, func(w *WorldConfig) { w.StartSpread, w.Starts, w.Costs = 0, starts, c })
		w.Run(5*time.Second, nil)
		return w
	}
	quiet, busy := run(time.Nanosecond), run(10*time.Millisecond)
	var life time.Duration
	for _, s := range starts {
		life += 5*time.Second - s
	}
	want := time.Duration(float64(life) * 0.01)
	got := busy.Busy(0) + busy.Busy(1) - quiet.Busy(0) - quiet.Busy(1)
	if tol := time.Duration(len(starts)) * IdleTick / 100; got < want-tol || got > want+tol {
		t.Errorf("idle ranks charged %v over their %v of life, want %v ± %v (1%% of it)", got, life, want, tol)
	}
}

// A message between a leader and its attached rank (another process)
// takes LocalLatency: a killed rank reaches the attached ranks of other
// hosts no sooner than the network's latency and one local hop after it.
func TestLocalLatencyDelaysAttachedRanks(t *testing.T) {
	const hosts, per = 8, 2
	const hop = 5 * time.Millisecond
	for _, local := range []time.Duration{0, hop} {
		w := testWorld(t, hosts, per, func(c *WorldConfig) { c.LocalLatency = local })
		t0 := w.Now() + time.Second
		w.Run(t0, nil)
		w.ResetLost()
		w.KillRank(per + 1)
		w.Run(t0+10*time.Second, w.AllSurfaced)
		d, missing := w.Surfaced(t0)
		if missing != 0 {
			t.Fatalf("local latency %v: %d ranks never learned of the killed rank", local, missing)
		}
		if lower := 50*time.Microsecond + local; d < lower {
			t.Errorf("local latency %v: killed rank surfaced everywhere after %v, below one network latency and one local hop (%v)", local, d, lower)
		}
		if local == 0 && d >= hop {
			t.Errorf("without local latency the killed rank took %v to surface, not below the hop %v the test adds", d, hop)
		}
	}
}
