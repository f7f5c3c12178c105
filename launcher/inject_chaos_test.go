package launcher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/internal/netfault"
)

// Slow and data-plane faults naming ranks the job does not have are
// refused before launch.
func TestScheduleChaosRefuses(t *testing.T) {
	plan := &Plan{WorldSize: 2, Ranks: []RankSpec{{Host: "a"}, {Host: "a"}}}
	for _, spec := range []string{"drop:rank=0:peer=2:at=1s", "partition:ranks=0-1:at=1s", "slow:rank=2:at=1s",
		"partition:hosts=a:after-steps=2", "partition:hosts=b:at=1s"} {
		if _, err := schedule(mustFaults(t, spec), plan, time.Hour); err == nil {
			t.Errorf("schedule(%q) accepted", spec)
		}
	}
}

// Data-plane faults reach every rank through the environment, timed from
// the job's start; a fault that already fired is not armed again in a
// restarted world.
func TestNetFaultEnv(t *testing.T) {
	faults := mustFaults(t, "drop:rank=1:at=1s", "corrupt:rank=0:at=3s", "kill:rank=1:at=2s", "delay:rank=0:ms=5:after-steps=4")
	start := time.Unix(100, 0)
	env := netFaultEnv(faults, start, 10*time.Millisecond, 0)
	want := []string{netfault.Env + "=drop:rank=1:at=1s;corrupt:rank=0:at=3s;delay:rank=0:ms=5:after-steps=4", netfault.EpochEnv + "=100000000000"}
	if strings.Join(env, " ") != strings.Join(want, " ") {
		t.Errorf("env %q, want %q", env, want)
	}
	// A restarted world: the timed faults not yet due; no after-steps one
	// (it counts steps anew and would meet its step again).
	if env := netFaultEnv(faults, start, 2*time.Second, 1); len(env) != 2 || !strings.HasSuffix(env[0], "=corrupt:rank=0:at=3s") {
		t.Errorf("after 2s: %q, want only the corrupt", env)
	}
	if env := netFaultEnv(faults, start, 4*time.Second, 1); env != nil {
		t.Errorf("after 4s: %q, want nothing armed", env)
	}

	j := newJobRun(t, 2, "print-env", nil)
	j.job.Faults = mustFaults(t, "delay:rank=1:ms=5:at=1h")
	if _, err := j.launchReport(context.Background()); err != nil {
		t.Fatal(err)
	}
	envs := rankEnvs(t, j.stdout.String(), 2)
	for r, e := range envs {
		if e[netfault.Env] != "delay:rank=1:ms=5:at=1h" || e[netfault.EpochEnv] == "" {
			t.Errorf("rank %d: %s=%q %s=%q", r, netfault.Env, e[netfault.Env], netfault.EpochEnv, e[netfault.EpochEnv])
		}
	}
}

// A slowed rank is stopped in slices and left running at the end: its
// longest gap is one slice, its peer's is short, and the job completes
// (no death verdict).
func TestInjectSlow(t *testing.T) {
	j := newJobRun(t, 2, "ticker:2000", nil)
	j.job.Faults = mustFaults(t, "slow:rank=0:at=200ms:for=1200ms:duty=0.8:period=500ms")
	rep, err := j.launchReport(context.Background())
	if err != nil {
		t.Fatalf("job failed: %v", err)
	}
	gaps := tickerGaps(j.stdout.String())
	// Stopped 400 ms of each 500 ms: the gap is one slice, not the whole
	// 1.2 s (the rank was continued between slices).
	if len(gaps) != 2 || gaps["0"] < 350 || gaps["0"] > 1000 || gaps["1"] >= 350 {
		t.Errorf("longest gaps per rank %v ms, want rank 0 stopped in ~400 ms slices and rank 1 not", gaps)
	}
	f := rep.Faults[0]
	if f.InjectedAt == nil || f.ContinuedAt == nil || *f.ContinuedAt-*f.InjectedAt < 1.1 || f.Action != "job succeeded" || f.DetectedAt != nil {
		t.Errorf("fault record: %+v", f)
	}
	if !strings.Contains(f.Signal, "SIGSTOP 80% of every 500ms") {
		t.Errorf("fault record says %q", f.Signal)
	}
}

// A shared-memory segment left by a dead rank (killed between creating it
// and its peer's mapping it) is removed when the job's supervisor is done,
// not left for the next job on the host to find.
func TestSupervisorSweepsDeadShm(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join("/dev/shm", fmt.Sprintf("gorun-%d-0000000000000000-0-1-sweeptest", dead.Process.Pid))
	if err := os.WriteFile(seg, nil, 0o600); err != nil {
		t.Skipf("no /dev/shm here: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(seg) })
	j := newJobRun(t, 1, "exit:0", nil)
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seg); err == nil {
		t.Errorf("%s is still there after the job", seg)
	}
}

// tickerGaps reads the "ticker" helpers' tagged "maxgap N" lines: each
// rank's longest gap between wake-ups, in ms, by rank.
func tickerGaps(out string) map[string]int {
	gaps := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\[(\d)\] maxgap (\d+)$`).FindAllStringSubmatch(out, -1) {
		gaps[m[1]], _ = strconv.Atoi(m[2])
	}
	return gaps
}
