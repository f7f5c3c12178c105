package sim

import (
	"testing"
	"time"
)

// Wake interpolates between the measured points from no excess at none,
// and holds the last point beyond it.
func TestWakeInterpolates(t *testing.T) {
	c := Costs{WakeExcess: []WakePoint{{4, 40 * time.Microsecond}, {8, 100 * time.Microsecond}}}
	for _, tc := range []struct {
		perCore float64
		want    time.Duration
	}{
		{0, 0}, {2, 20 * time.Microsecond}, {4, 40 * time.Microsecond}, {6, 70 * time.Microsecond},
		{8, 100 * time.Microsecond}, {32, 100 * time.Microsecond},
	} {
		if got := c.Wake(tc.perCore); got != tc.want {
			t.Errorf("Wake(%v) = %v, want %v", tc.perCore, got, tc.want)
		}
	}
}

// A costs file without wake points, or with points out of order, is
// refused with the field named.
func TestWakeExcessValidated(t *testing.T) {
	c := testCosts(t)
	c.WakeExcess = nil
	if err := c.Validate(); err == nil {
		t.Error("no wake points accepted")
	}
	c.WakeExcess = []WakePoint{{8, time.Microsecond}, {4, time.Microsecond}}
	if err := c.Validate(); err == nil {
		t.Error("wake points out of order accepted")
	}
	c.WakeExcess = []WakePoint{{4, -time.Microsecond}}
	if err := c.Validate(); err == nil {
		t.Error("a negative wake excess accepted")
	}
}

// The wake excess delays every message between rank processes by the
// excess at the live processes per core: a killed rank reaches every
// other host's attached ranks at least one network hop and one local hop,
// each with the excess, after its leader learns of it; ranks in one
// process wake nobody and are not delayed.
func TestWakeExcessDelaysMessages(t *testing.T) {
	const hosts, per = 8, 2
	const excess = 3 * time.Millisecond
	surfaced := func(in bool, e time.Duration) time.Duration {
		t.Helper()
		c := testCosts(t)
		c.WakeExcess = []WakePoint{{0.25, e}}
		w := testWorld(t, hosts, per, func(cfg *WorldConfig) { cfg.InProcess, cfg.Costs = in, c })
		t0 := w.Now() + time.Second
		w.Run(t0, nil)
		w.ResetLost()
		w.KillRank(per + 1)
		w.Run(t0+10*time.Second, w.AllSurfaced)
		d, missing := w.Surfaced(t0)
		if missing != 0 {
			t.Fatalf("in process %v, excess %v: %d ranks never learned of the killed rank", in, e, missing)
		}
		return d
	}
	none, with := surfaced(false, 0), surfaced(false, excess)
	if with < none+2*excess {
		t.Errorf("killed rank surfaced after %v with a %v wake excess, %v without: want at least two hops' excess more", with, excess, none)
	}
	if a, b := surfaced(true, 0), surfaced(true, excess); a != b {
		t.Errorf("in one process the wake excess moved the killed rank's surfacing: %v with, %v without", b, a)
	}
}

// A rank's death costs gorun's processes DeathAgent on its host,
// DeathLauncher per host at the launcher, and DeathHost on every other
// host, on the cores the rendezvous uses: on one shared CPU the run's
// CPU grows by exactly that, and the other ranks learn of the death
// later when those costs are large; in one process nothing is charged.
func TestDeathReactionCharged(t *testing.T) {
	const hosts, per = 8, 2
	run := func(in bool, agent, launcher, host time.Duration) (time.Duration, time.Duration) {
		t.Helper()
		c := testCosts(t)
		c.DeathAgent, c.DeathLauncher, c.DeathHost = agent, launcher, host
		w := testWorld(t, hosts, per, func(cfg *WorldConfig) { cfg.SharedCores, cfg.InProcess, cfg.Costs = 2, in, c })
		t0 := w.Now() + time.Second
		w.Run(t0, nil)
		w.ResetLost()
		before := w.Busy(0)
		w.KillRank(per + 1)
		w.Run(t0+500*time.Millisecond, nil) // the same span in every run

		d, missing := w.Surfaced(t0)
		if missing != 0 {
			t.Fatalf("%d ranks never learned of the killed rank", missing)
		}
		return w.Busy(0) - before, d
	}
	const agent, launcher, host = 3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond
	cpu0, d0 := run(false, time.Nanosecond, time.Nanosecond, time.Nanosecond)
	cpu1, d1 := run(false, agent, launcher, host)
	want := agent + hosts*launcher + (hosts-1)*host - (1 + hosts + hosts - 1)
	if got := cpu1 - cpu0; got < want-IdleTick/100 || got > want+IdleTick/100 {
		t.Errorf("a death charged %v more CPU with the reaction's costs, want %v (agent + hosts × launcher + other hosts × host)", got, want)
	}
	if d1 <= d0 {
		t.Errorf("the killed rank surfaced after %v with gorun's reaction on the shared cores, not later than without it (%v)", d1, d0)
	}
	cpuIn0, _ := run(true, time.Nanosecond, time.Nanosecond, time.Nanosecond)
	if cpuIn, _ := run(true, agent, launcher, host); cpuIn != cpuIn0 {
		t.Errorf("ranks in one process were charged gorun's reaction: %v with, %v without", cpuIn, cpuIn0)
	}
}

// With ReportFormed every rank's line is relayed at its formation:
// LineHost on its host and LineLauncher at the launcher, each once per
// rank, on the shared cores; ranks in one process print through no
// agent and are charged nothing.
func TestReportFormedCharged(t *testing.T) {
	const hosts, per = 8, 2
	const line = 500 * time.Microsecond
	run := func(in, report bool) *World {
		t.Helper()
		c := testCosts(t)
		c.LineHost, c.LineLauncher = line, 2*line
		w := testWorld(t, hosts, per, func(cfg *WorldConfig) {
			cfg.SharedCores, cfg.InProcess, cfg.ReportFormed, cfg.Costs = 2, in, report, c
		})
		w.Run(2*time.Second, nil) // the same span in every run, the last relays charged
		return w
	}
	quiet, chatty := run(false, false), run(false, true)
	if got, want := chatty.Busy(0)-quiet.Busy(0), hosts*per*3*line; got < want-want/50 || got > want+want/50 {
		// 2% of slack: the two runs' gossip differs with their timings.
		t.Errorf("ranks printing at formation charged %v more CPU, want %v ± 2%% (each rank's line at its host and at the launcher)", got, want)
	}
	if a, b := run(true, false), run(true, true); a.Busy(0) != b.Busy(0) {
		t.Errorf("ranks in one process were charged the line relay: %v with, %v without", b.Busy(0), a.Busy(0))
	}
}
