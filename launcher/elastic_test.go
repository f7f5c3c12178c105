package launcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/fault"
	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/launcher/outcome"
)

// launchReport runs the job through LaunchReport and checks that nothing of
// it survives.
func (j *jobRun) launchReport(ctx context.Context) (*Report, error) {
	if j.cfg.Timeout == 0 {
		// A broken restart or a SIGCONT never sent must fail, not hang.
		j.cfg.Timeout = 30 * time.Second
	}
	rep, err := LaunchReport(ctx, j.cfg, j.job)
	if s := launchertest.Survivors(j.token); len(s) > 0 {
		j.t.Errorf("processes of the job survive LaunchReport: %v", s)
	}
	return rep, err
}

// A kill injected into a rank ends the first world; with a restart left
// the job runs a new world with a new job id and the restart count, which
// completes; the report says what happened in order.
func TestInjectKillRestarts(t *testing.T) {
	// After step 1, the first all-reduce, which every rank joined after
	// printing its world line: a kill at a fixed time could land before
	// the ranks print on a loaded machine.
	j := newJobRun(t, 3, "restart-aware:allreduce", nil)
	j.job.Faults = mustFaults(t, "kill:rank=1:after-steps=1")
	j.job.MaxRestarts = 2
	j.cfg.OutputDir = t.TempDir()
	rep, err := j.launchReport(context.Background())
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, j.stderr)
	}
	// The logs keep the failed world's output, then the new world's.
	log1, err := os.ReadFile(filepath.Join(j.cfg.OutputDir, "rank.1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)world 0 torch 0 .*\n--- gorun: restart 1 \(job \w+\) ---\nworld 1 torch 1 `).Match(log1) {
		t.Errorf("rank.1.log does not hold both worlds:\n%s", log1)
	}
	out := j.stdout.String()
	re := regexp.MustCompile(`(?m)^\[(\d)\] world (\d) torch (\d) job (\w+) key (\w+)$`)
	jobs := map[string]string{} // world → job id
	keys := map[string]string{} // world → hash of the secret
	perWorld := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		if m[2] != m[3] {
			t.Errorf("rank %s: GORUN_RESTART_COUNT %s but TORCHELASTIC_RESTART_COUNT %s", m[1], m[2], m[3])
		}
		if id, ok := jobs[m[2]]; ok && id != m[4] {
			t.Errorf("world %s has two job ids %s and %s", m[2], id, m[4])
		}
		jobs[m[2]] = m[4]
		keys[m[2]] = m[5]
		perWorld[m[2]]++
	}
	if perWorld["0"] != 3 || perWorld["1"] != 3 || len(perWorld) != 2 {
		t.Fatalf("ranks per world %v, want 3 in world 0 and 3 in world 1; output:\n%s", perWorld, out)
	}
	if jobs["0"] == jobs["1"] {
		t.Errorf("the restarted world kept job id %s: members of the old world would be accepted", jobs["0"])
	}
	// The rendezvous refuses a member with another job id or secret
	// (rendezvous.TestForeignMemberRefused): both must change.
	if keys["0"] == keys["1"] || keys["0"] == "" {
		t.Errorf("the restarted world kept the job secret (hash %s)", keys["0"])
	}
	if rep.Restarts != 1 || len(rep.Worlds) != 2 || rep.Outcome != "succeeded" || rep.ExitCode != 0 {
		t.Fatalf("report: %+v", rep)
	}
	w0, w1 := rep.Worlds[0], rep.Worlds[1]
	if !strings.Contains(w0.Result, "rank 1") || !strings.Contains(w0.Result, "signal 9") || w1.Result != "succeeded" {
		t.Errorf("world results %q, %q", w0.Result, w1.Result)
	}
	if w0.JobID != jobs["0"] || w1.JobID != jobs["1"] {
		t.Errorf("report job ids %s %s, ranks saw %v", w0.JobID, w1.JobID, jobs)
	}
	if len(rep.Faults) != 1 {
		t.Fatalf("faults: %+v", rep.Faults)
	}
	f := rep.Faults[0]
	if f.InjectedAt == nil || f.DetectedAt == nil || f.WorldEndedAt == nil || f.RecoveredAt == nil || f.Restart == nil || *f.Restart != 0 {
		t.Fatalf("fault record incomplete: %+v", f)
	}
	if *f.InjectedAt <= 0 || *f.DetectedAt < *f.InjectedAt || *f.WorldEndedAt < *f.DetectedAt || *f.RecoveredAt < *f.WorldEndedAt {
		t.Errorf("fault times out of order: injected %.3f detected %.3f world gone %.3f recovered %.3f",
			*f.InjectedAt, *f.DetectedAt, *f.WorldEndedAt, *f.RecoveredAt)
	}
	if f.DetectedBy != "rank 1 killed by SIGKILL" || f.Action != "restarted" || f.Missed != "" || len(f.PIDs) != 1 {
		t.Errorf("fault record: %+v", f)
	}
	// The helpers report step 1 after their first all-reduce: the new
	// world's first one is when the job had recovered.
	if f.ResumedAt == nil || f.TimeToRecover == nil || *f.ResumedAt < *f.RecoveredAt || w1.FirstStepAt == nil || *w1.FirstStepAt != *f.ResumedAt ||
		*f.TimeToRecover != *f.ResumedAt-*f.InjectedAt {
		t.Errorf("recovery not recorded: resumed %v, time to recover %v, world 1's first step %v", f.ResumedAt, f.TimeToRecover, w1.FirstStepAt)
	}
	t.Logf("kill → world gone %.3fs, world gone → every rank restarted %.3fs",
		*f.WorldEndedAt-*f.InjectedAt, *f.RecoveredAt-*f.WorldEndedAt)
}

// A frozen rank: the report lists which ranks noticed it, when, and whom
// they blamed. gorun tears the job down at the first report, so at least
// that one is there; with a 1 s lease it comes at about 1 s.
func TestInjectStopReportsWhoNoticed(t *testing.T) {
	j := newJobRun(t, 3, "allreduce", nil)
	j.cfg.Env = append(j.cfg.Env, "GORUN_RDZV_LEASE=1s")
	j.job.Faults = mustFaults(t, "stop:rank=2:after-steps=1")
	rep, err := j.launchReport(context.Background())
	var ce *outcome.CollateralError
	if !errors.As(err, &ce) || ce.Blame != 2 || ce.Frozen != "T" {
		t.Fatalf("err = %v, want rank 2 frozen", err)
	}
	f := rep.Faults[0]
	if len(f.Noticed) == 0 || f.TimeToDetect == nil {
		t.Fatalf("no rank noticed the frozen rank: %+v", f)
	}
	firstHand := 0
	for _, n := range f.Noticed {
		// A survivor that saw it (blaming rank 2), or one that was told
		// by such a survivor's abort (relay, blaming that survivor);
		// both about a lease after the stop and naming rank 2.
		if n.Rank == 2 || (n.Blame != 2 && !n.Relay) || n.After < 0.9 || n.After > 20 || !strings.Contains(n.Why, "rank 2") {
			t.Errorf("notice %+v: want a survivor blaming rank 2 about a lease after the stop", n)
		}
		if !n.Relay {
			firstHand++
		}
	}
	if firstHand == 0 {
		t.Errorf("no survivor noticed rank 2 itself: %+v", f.Noticed)
	}
	t.Logf("noticed: %+v; time to detect %.3fs", f.Noticed, *f.TimeToDetect)
}

// Without restarts left the injected kill ends the job, naming the rank,
// and the report says so.
func TestInjectKillEndsJob(t *testing.T) {
	j := newJobRun(t, 2, "hang", nil)
	j.job.Faults = mustFaults(t, "kill:rank=1:at=100ms:sig=TERM")
	rep, err := j.launchReport(context.Background())
	var re *outcome.RankExitError
	if !errors.As(err, &re) || re.Rank != 1 || re.Signal != syscall.SIGTERM {
		t.Fatalf("err = %v, want rank 1 killed by SIGTERM", err)
	}
	if rep.Restarts != 0 || rep.ExitCode != 128+int(syscall.SIGTERM) || len(rep.Faults) != 1 || rep.Faults[0].Action != "job ended" {
		t.Fatalf("report: %+v %+v", rep, rep.Faults)
	}
}

// A stop with a duration freezes exactly its rank for that long and then
// lets it go on: the job completes, rank 0 saw a gap of at least the stop,
// rank 1 none.
func TestInjectStopFor(t *testing.T) {
	j := newJobRun(t, 2, "ticker:1200", nil)
	j.job.Faults = mustFaults(t, "stop:rank=0:after-steps=1:for=500ms")
	rep, err := j.launchReport(context.Background())
	if err != nil {
		t.Fatalf("job failed: %v", err)
	}
	gaps := tickerGaps(j.stdout.String())
	if len(gaps) != 2 || gaps["0"] < 450 || gaps["1"] >= 450 {
		t.Errorf("longest gaps per rank %v ms, want rank 0 stopped ~500 ms and rank 1 not", gaps)
	}
	f := rep.Faults[0]
	if f.InjectedAt == nil || f.ContinuedAt == nil || *f.ContinuedAt-*f.InjectedAt < 0.45 || f.Action != "job succeeded" || f.DetectedAt != nil {
		t.Errorf("fault record: %+v", f)
	}
}

// A fault that names a rank the job does not have is refused before any
// rank starts.
func TestInjectRefusedBeforeLaunch(t *testing.T) {
	j := newJobRun(t, 2, "print-env", nil)
	j.job.Faults = mustFaults(t, "kill:rank=2:at=1s")
	_, err := j.launchReport(context.Background())
	var se *fault.SpecError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "rank 2 does not exist") {
		t.Fatalf("err = %v", err)
	}
	if j.stdout.String() != "" {
		t.Errorf("ranks ran: %q", j.stdout.String())
	}
}

// Restarts stop after MaxRestarts: a rank that always fails runs 1+N
// worlds and the job ends with its error.
func TestMaxRestartsExhausted(t *testing.T) {
	j := newJobRun(t, 2, "exit:0", map[int]string{1: "exit:3"})
	j.job.MaxRestarts = 2
	rep, err := j.launchReport(context.Background())
	var re *outcome.RankExitError
	if !errors.As(err, &re) || re.Rank != 1 || re.Code != 3 {
		t.Fatalf("err = %v, want rank 1 exit 3", err)
	}
	if rep.Restarts != 2 || len(rep.Worlds) != 3 {
		t.Fatalf("restarts %d worlds %d, want 2 and 3", rep.Restarts, len(rep.Worlds))
	}
}

// A timeout is not a failure to restart from.
func TestNoRestartAfterTimeout(t *testing.T) {
	j := newJobRun(t, 1, "hang", nil)
	j.job.MaxRestarts = 3
	j.cfg.Timeout = 200 * time.Millisecond
	rep, err := j.launchReport(context.Background())
	var te *outcome.TimeoutError
	if !errors.As(err, &te) || rep.Restarts != 0 {
		t.Fatalf("err = %v restarts %d, want a timeout and no restart", err, rep.Restarts)
	}
}

// A rank frozen for good (stop without for=) mid all-reduce: its peers'
// runtimes notice, the world fails (every failure collateral: a
// *outcome.CollateralError), and the job restarts and completes. The default host
// leader mode: rank 1 is attached to rank 0, and only the attach lease
// finds it (without that lease this test hangs 30 s).
// At 1.5 s, so that under -race and load the world has formed: a rank
// frozen before that is found only by the formation timeout.
func TestInjectFrozenRankRestarts(t *testing.T) {
	j := newJobRun(t, 3, "restart-aware:allreduce", nil)
	j.job.Faults = mustFaults(t, "stop:rank=1:at=1500ms")
	j.job.MaxRestarts = 1
	start := time.Now()
	rep, err := j.launchReport(context.Background())
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, j.stderr)
	}
	f := rep.Faults[0]
	if rep.Restarts != 1 || f.InjectedAt == nil || f.DetectedAt == nil || f.Action != "restarted" {
		t.Fatalf("report %+v, fault %+v", rep, f)
	}
	t.Logf("frozen → detected %.3fs (%s), job done in %s; world 0: %s", *f.TimeToDetect, f.DetectedBy, time.Since(start), rep.Worlds[0].Result)
}

// An after-steps fault waits for the runtime's step reports: rank 1 of a
// job whose ranks report every step is killed once it has reported step 5,
// not before (its output holds step 5) and not much later (the supervisor
// reads the reports every tick; a step takes at least 20 ms). The report
// records the step the kill landed at; a fault whose step never comes is
// reported missed with the step named.
func TestInjectAfterSteps(t *testing.T) {
	j := newJobRun(t, 3, "steps:200", nil)
	j.job.Faults = mustFaults(t, "kill:rank=1:after-steps=5", "kill:rank=0:after-steps=1000")
	rep, err := j.launchReport(context.Background())
	var re *outcome.RankExitError
	if !errors.As(err, &re) || re.Rank != 1 || re.Signal != syscall.SIGKILL {
		t.Fatalf("job ended with %v, want rank 1 killed\n%s", err, j.stderr)
	}
	last := 0
	for _, m := range regexp.MustCompile(`(?m)^\[1\] step (\d+)$`).FindAllStringSubmatch(j.stdout.String(), -1) {
		last, _ = strconv.Atoi(m[1])
	}
	// At least 5: it must not fire early. At most a few steps later: it
	// must fire on the report, not at some unrelated time.
	if last < 5 || last > 10 {
		t.Errorf("rank 1 printed up to step %d, want it killed right after step 5\n%s", last, j.stdout)
	}
	f := rep.Faults
	if len(f) != 2 || f[0].AfterSteps != 5 || f[0].InjectedAt == nil || f[0].InjectedAtStep < 5 || f[0].InjectedAtStep > int64(last) {
		t.Errorf("report of the kill: %+v", f)
	}
	if len(f) == 2 && (f[1].InjectedAt != nil || !strings.Contains(f[1].Missed, "step 1000")) {
		t.Errorf("the fault for step 1000 was never reached but reads %+v", f[1])
	}
}

// Job.CheckpointBefore sends the checkpoint signal that long before a
// timed kill (a preemption notice) and before --timeout: the ranks (which
// exit 0 on SIGUSR1) are asked in time, the job ends well before either,
// and the report says when and why. The ranks find the signal's name in
// GORUN_CHECKPOINT_SIGNAL.
func TestCheckpointSignalBefore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		faults   []string
		timeout  time.Duration
		why      string
		earliest float64
	}{
		{"before a kill", []string{"kill:rank=1:at=2s"}, 0, "before fault 0 (kill:rank=1:at=2s)", 1.0},
		{"before --timeout", nil, 20 * time.Second, "before --timeout", 1.0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJobRun(t, 2, "wait-usr1", nil)
			j.job.Faults = mustFaults(t, tc.faults...)
			j.job.CheckpointBefore = 1 * time.Second
			if tc.timeout > 0 {
				j.cfg.Timeout = tc.timeout
				j.job.CheckpointBefore = tc.timeout - time.Second
			}
			rep, err := j.launchReport(context.Background())
			if err != nil {
				t.Fatalf("job failed: %v\n%s", err, j.stderr)
			}
			if n := strings.Count(j.stdout.String(), "] usr1\n"); n != 2 {
				t.Errorf("%d ranks got the checkpoint signal, want 2:\n%s", n, j.stdout)
			}
			if len(rep.CheckpointSignals) != 1 || rep.CheckpointSignals[0].Why != tc.why || rep.CheckpointSignals[0].At < tc.earliest {
				t.Errorf("checkpoint signals %+v, want one %q at %.1f s or later", rep.CheckpointSignals, tc.why, tc.earliest)
			}
			for _, f := range rep.Faults {
				if f.InjectedAt != nil {
					t.Errorf("fault %s was injected after the job should have ended", f.Spec)
				}
			}
		})
	}
	j := newJobRun(t, 1, "print-env", nil)
	j.job.CheckpointSignal = syscall.SIGUSR2
	if err := j.launch(context.Background()); err != nil {
		t.Fatal(err)
	}
	if env := rankEnvs(t, j.stdout.String(), 1)[0]; env["GORUN_CHECKPOINT_SIGNAL"] != "SIGUSR2" {
		t.Errorf("GORUN_CHECKPOINT_SIGNAL=%q, want SIGUSR2", env["GORUN_CHECKPOINT_SIGNAL"])
	}
	j = newJobRun(t, 1, "exit:0", nil)
	j.job.CheckpointSignal = syscall.SIGKILL
	if err := j.launch(context.Background()); err == nil || !strings.Contains(err.Error(), "cannot be caught") {
		t.Errorf("a SIGKILL checkpoint signal: %v, want it refused", err)
	}
}

// The elastic host policy: spares take a lost host's place, then the world
// shrinks, down to MinNP, after which the job fails naming the lost hosts
// and the last world's error.
func TestElasticWorlds(t *testing.T) {
	hosts := []Host{{Name: "h1", Slots: 2}, {Name: "h2", Slots: 2}, {Name: "h3", Slots: 2}}
	names := func(hs []Host) string {
		var out []string
		for _, h := range hs {
			out = append(out, h.Name)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		name      string
		job       Job
		lost      []string
		wantHosts string
		wantNP    int
		wantErr   string
	}{
		{"max-np leaves a spare", Job{Hosts: hosts, MinNP: 2, MaxNP: 4}, nil, "h1,h2,h3", 4, ""},
		{"the spare replaces a lost host", Job{Hosts: hosts, MinNP: 2, MaxNP: 4}, []string{"h2"}, "h1,h3", 4, ""},
		{"no spare left: fewer ranks", Job{Hosts: hosts, MinNP: 2, MaxNP: 4}, []string{"h2", "h1"}, "h3", 2, ""},
		{"below min-np", Job{Hosts: hosts, MinNP: 3, MaxNP: 4}, []string{"h2", "h1"}, "", 0, "2 slots left on the hosts not lost, --min-np is 3 (lost: h2, h1)"},
		{"-np is the maximum", Job{Hosts: hosts, NP: 3, MinNP: 1}, []string{"h3"}, "h1,h2", 3, ""},
		{"every slot without -np", Job{Hosts: hosts, MinNP: 1}, []string{"h1"}, "h2,h3", 4, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, np, err := newElastic(tc.job).world(tc.lost)
			if tc.wantErr != "" {
				var ee *ElasticError
				if !errors.As(err, &ee) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want an *ElasticError saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || names(hs) != tc.wantHosts || np != tc.wantNP {
				t.Fatalf("world on %s with %d ranks (%v), want %s with %d", names(hs), np, err, tc.wantHosts, tc.wantNP)
			}
		})
	}
	if newElastic(Job{Hosts: hosts, NP: 4}) != nil {
		t.Error("a job without --min-np/--max-np is elastic")
	}
	j := newJobRun(t, 2, "exit:0", nil)
	j.job.MinNP = 1
	if err := j.launch(context.Background()); err == nil || !strings.Contains(err.Error(), "need a host list") {
		t.Errorf("--min-np without hosts: %v", err)
	}
}

// An elastic job reads its hostfile again before each restart: added hosts
// serve the next world (as spares, in file order), removed ones neither
// serve nor are asked back, a changed slot count counts, and without -np
// or --max-np the maximum follows the slots. A file that does not parse
// keeps the list (reloadHosts reports the error).
func TestElasticReloadsHostfile(t *testing.T) {
	e := newElastic(Job{Hosts: []Host{{Name: "h1", Slots: 2}, {Name: "h2", Slots: 2}}, MinNP: 1})
	ch := e.reload([]Host{{Name: "h2", Slots: 3}, {Name: "h3", Slots: 1}})
	if !slicesEq(ch.Added, "h3") || !slicesEq(ch.Removed, "h1") || !slicesEq(ch.Resized, "h2") {
		t.Fatalf("change %+v, want h3 added, h1 removed, h2 resized", ch)
	}
	hs, np, err := e.world(nil)
	if err != nil || len(hs) != 2 || hs[0].Name != "h2" || hs[1].Name != "h3" || np != 4 {
		t.Fatalf("world %v with %d ranks (%v), want h2,h3 with 4", hs, np, err)
	}
	capped := newElastic(Job{Hosts: []Host{{Name: "h1", Slots: 2}}, MinNP: 1, MaxNP: 2})
	capped.reload([]Host{{Name: "h1", Slots: 2}, {Name: "h2", Slots: 2}})
	if _, np, _ := capped.world(nil); np != 2 {
		t.Fatalf("--max-np 2 after a reload: %d ranks", np)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "hosts")
	if err := os.WriteFile(path, []byte("h1 slots=2\nh4 slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := &Report{out: []string{"h2"}, lostIn: map[string]int{"h2": 0}}
	e = newElastic(Job{Hosts: []Host{{Name: "h1", Slots: 2}, {Name: "h2", Slots: 2}}, MinNP: 1})
	cfg := DefaultConfig()
	cfg.Logger = testLogger(t)
	reloadHosts(cfg, e, path, rep, 1)
	if len(rep.HostfileChanges) != 1 || !slicesEq(rep.HostfileChanges[0].Added, "h4") || !slicesEq(rep.HostfileChanges[0].Removed, "h2") ||
		rep.HostfileChanges[0].Restart != 1 || len(rep.out) != 0 {
		t.Fatalf("report %+v, lost hosts %v: want h4 added, h2 removed and no longer lost", rep.HostfileChanges, rep.out)
	}
	if err := os.WriteFile(path, []byte("h1 slots=two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reloadHosts(cfg, e, path, rep, 2)
	if hs, _, _ := e.world(nil); len(rep.HostfileChanges) != 2 || rep.HostfileChanges[1].Error == "" || len(hs) != 2 || hs[1].Name != "h4" {
		t.Fatalf("after a bad file: report %+v, hosts %v; want the error and the list kept", rep.HostfileChanges, hs)
	}
}

func slicesEq(got []string, want ...string) bool {
	return strings.Join(got, ",") == strings.Join(want, ",")
}

// End to end on this host: the job starts on the host list it was given
// (2 slots); the hostfile says 3; after a kill the restarted world runs 3
// ranks.
func TestElasticRestartUsesHostfileAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte("localhost slots=3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	j := newJobRun(t, 0, "restart-aware:allreduce", nil)
	j.job.Hosts = []Host{{Name: "localhost", Slots: 2}}
	j.job.Hostfile = path
	j.job.MinNP = 1
	j.job.MaxRestarts = 1
	j.job.Faults = mustFaults(t, "kill:rank=1:after-steps=1")
	rep, err := j.launchReport(context.Background())
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, j.stderr)
	}
	if len(rep.Worlds) != 2 || rep.Worlds[0].NP != 2 || rep.Worlds[1].NP != 3 || len(rep.HostfileChanges) != 1 ||
		!slicesEq(rep.HostfileChanges[0].Resized, "localhost") {
		t.Fatalf("worlds %+v, hostfile changes %+v: want 2 then 3 ranks, localhost resized", rep.Worlds, rep.HostfileChanges)
	}
	if n := strings.Count(j.stdout.String(), "] world 1 "); n != 3 {
		t.Fatalf("%d ranks printed world 1, want 3\n%s", n, j.stdout.String())
	}
}

// A random: fault is planned up to the job's timeout (a week without one:
// thousands of kills at a short MTBF), but the report lists the faults
// that happened or were due, and counts the planned kills it left out.
func TestReportListsOnlyRandomFaultsThatHappened(t *testing.T) {
	j := newJobRun(t, 2, "exit:0", nil)
	j.job.Faults = mustFaults(t, "random:mtbf=10ms:seed=3")
	j.cfg.Timeout = 60 * time.Second // plans about 6000 kills
	start := time.Now()
	rep, _ := j.launchReport(context.Background())
	ran := time.Since(start)
	// At most the kills due while the job ran (10 ms apart on average).
	if limit := int(ran/(10*time.Millisecond))*3 + 10; len(rep.Faults) > limit {
		t.Errorf("report lists %d faults for a job of %v, want at most %d (those due)", len(rep.Faults), ran, limit)
	}
	if rep.RandomNotDue < 1000 {
		t.Errorf("report says %d planned random kills were left out, want the plan's thousands", rep.RandomNotDue)
	}
	t.Logf("job of %v: %d faults listed, %d planned kills left out", ran, len(rep.Faults), rep.RandomNotDue)
}
