package main

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// A stand-in runs its timer and spends its spin of CPU each period: over
// a second, 10 ms periods of 4 ms spin are 0.4 s of CPU. A loaded machine
// delays ticks (the ticker drops those it misses), so the bound below is
// loose; a stand-in that does not spin spends almost nothing.
func TestStandInSpendsItsSpin(t *testing.T) {
	if testing.Short() {
		t.Skip("a real stand-in process, about 1.5 s")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var s standIns
	if err := s.add(exe, 1, 10*time.Millisecond, 4*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	pid := s.cmds[0].Process.Pid
	c0 := procRun(pid)
	time.Sleep(time.Second)
	got := procRun(pid) - c0
	if err := s.alive(); err != nil {
		t.Error(err)
	}
	if err := s.stop(); err != nil {
		t.Errorf("stand-in did not leave cleanly when told: %v", err)
	}
	t.Logf("stand-in spent %v of CPU in 1 s (10 ms periods, 4 ms spin each)", got)
	if got < 40*time.Millisecond || got > 900*time.Millisecond {
		t.Errorf("stand-in spent %v of CPU in 1 s, want about 400 ms (40-900 ms: a loaded machine drops ticks; without the spin it is 5-15 ms)", got)
	}
}

// A stand-in given a malformed setting says so and exits, and the set
// that started it reports it instead of counting it.
func TestStandInRefusesBadSetting(t *testing.T) {
	for _, v := range []string{"20ms", "20 120µs", "0s 1ms", "20ms -1ms"} {
		if _, _, err := parseStandIn(v); err == nil {
			t.Errorf("parseStandIn(%q) accepted", v)
		}
	}
	if p, s, err := parseStandIn("20ms 119.74µs"); err != nil || p != 20*time.Millisecond || s != 119740*time.Nanosecond {
		t.Errorf("parseStandIn(\"20ms 119.74µs\") = %v, %v, %v", p, s, err)
	}
}

// The death figures are what each part spent after the kill beyond its
// rate before it, scaled to the span after it.
func TestDeathExcess(t *testing.T) {
	t0 := time.Unix(100, 0)
	ms := time.Millisecond
	s0 := cpuSample{at: t0, launcher: 10 * ms, hosts: []time.Duration{0, 5 * ms, 7 * ms}}
	s1 := cpuSample{at: t0.Add(time.Second), launcher: 12 * ms, hosts: []time.Duration{ms, 6 * ms, 8 * ms}}
	// 2 s after: idle rates 2, 1, 1, 1 ms/s → 4, 2, 2, 2 ms expected idle.
	s2 := cpuSample{at: t0.Add(3 * time.Second), launcher: 20 * ms, hosts: []time.Duration{3 * ms, 18 * ms, 12 * ms}}
	d := deathExcess(1, s0, s1, s2)
	want := deathCPU{launcher: 4 * ms, victimHost: 10 * ms, otherHost: ms} // hosts 0 and 2: 0 and 2 ms over idle
	if d != want {
		t.Errorf("deathExcess = %+v, want %+v", d, want)
	}
}

// procRun reads a process's CPU from its threads' schedstat, and
// descendants finds a child by its parent.
func TestProcRunAndDescendants(t *testing.T) {
	before := procRun(os.Getpid())
	x := 0
	for t0 := time.Now(); time.Since(t0) < 50*time.Millisecond; {
		x++
	}
	if after := procRun(os.Getpid()); after <= before {
		t.Errorf("procRun(self) did not grow over 50 ms of spinning: %v then %v", before, after)
	}
	if procRun(1<<30) != 0 {
		t.Error("procRun of a pid that does not exist is not 0")
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep to start:", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if d := descendants(os.Getpid()); !slices.Contains(d, cmd.Process.Pid) {
		t.Errorf("descendants(self) = %v, missing the child %d", d, cmd.Process.Pid)
	}
	_ = x
}
