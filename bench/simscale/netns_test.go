package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/sim"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// The test binary is the rank program, the echo end, the socket peer,
// the victim and the stand-in, as the command is (role).
func TestMain(m *testing.M) {
	if code, ok := role(time.Now(), cpuTime()); ok {
		os.Exit(code)
	}
	launchertest.FastRaceExit()
	os.Exit(m.Run())
}

// One job of the namespace calibration, 4 hosts × 2 ranks (about 30 s,
// root only): the harness sees every rank form, the SIGKILLed rank and
// the cut host surface at every other rank, nothing left running; and the
// model, replaying the job's start times, names the cut host within 25%
// of the real job (the calibration's runs agree within 6%: the term is
// memberlist's suspicion and the World's doubt, timers the model takes
// from the real configuration, on top of probe rounds it simulates).
func TestNamespaceJobAgreesOnTheCutHost(t *testing.T) {
	h := testhosts.RequireNetns(t, 4)
	gorun := launchertest.Build(t, "cmd/gorun") + "/gorun"
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	costs, err := sim.LoadCosts("../../sim/testdata/costs.json")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	delay, err := messageDelay(ctx, h, h.Hosts[1])
	if err != nil {
		t.Fatal(err)
	}
	j := &netnsJob{h: h, hosts: 4, per: 2, gorun: gorun, exe: exe, dir: t.TempDir()}
	real, err := j.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if left, err := strays(h, 4); err != nil || len(left) > 0 {
		t.Errorf("left running on the hosts after the job: %v %v", left, err)
	}
	m, err := runModel(sim.WorldConfig{Hosts: 4, PerHost: 2, SharedCores: 2, Latency: delay, LocalLatency: delay, Starts: real.starts,
		Rdzv: rendezvous.DefaultConfig(), Costs: costs, Seed: 1}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("real: formation %v, cpu %v, rank lost %v, host lost %v, launch %v, gorun's own CPU on the death %v; model: %v, %v, %v, %v (message delay %v)",
		real.formation, real.cpu, real.rank, real.host, real.launch, real.death, m.formation, m.cpu, m.rank, m.host, delay)
	if real.formation <= 0 || real.rank <= 0 || real.host <= 0 {
		t.Errorf("real job: formation %v, rank lost %v, host lost %v; every one must be after its cause", real.formation, real.rank, real.host)
	}
	if m.rankMiss > 0 || m.hostMiss > 0 {
		t.Errorf("model: %d ranks missed the lost rank, %d the lost host", m.rankMiss, m.hostMiss)
	}
	if r := ratio(m.host, real.host); r < 0.75 || r > 1.25 {
		t.Errorf("cut host named after %v in the model, %v in the real job: ratio %.2f, want within [0.75, 1.25]", m.host, real.host, r)
	}
}

// The exit delay is measured from real kills: positive, and far below the
// second a lost rank may take to surface.
func TestExitDelay(t *testing.T) {
	d, err := exitDelay(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exit delay %v", d)
	if d <= 0 || d > time.Second {
		t.Errorf("exit delay %v, want in (0, 1 s]", d)
	}
}
