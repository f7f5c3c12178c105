package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// The fault-tolerant path end to end: real gorun --fault-tolerant, real
// trainer processes, real deaths. Each test asserts the promises that
// matter to a user: the replicas end bitwise equal (every replica's final
// state digest), the survivors never restart and keep stepping, a step a
// participant died in is committed by nobody, and nothing outlives gorun.

const ftSteps = 40

type ftRun struct {
	code   int
	out    string
	stderr string
	report ftReport
	// final is each rank's last "replica R incarnation I steps S state D".
	final map[int][]string
	// lines are each rank's output lines, untagged.
	lines map[int][]string
}

type ftReport struct {
	Outcome        string `json:"outcome"`
	FaultTolerance struct {
		Failures []struct {
			Rank        int      `json:"rank"`
			Incarnation int      `json:"incarnation"`
			Action      string   `json:"action"`
			TimeToHeal  *float64 `json:"time_to_heal_s"`
		} `json:"failures"`
		Quorum struct {
			Heals []struct {
				Replica     int   `json:"replica"`
				Incarnation int   `json:"incarnation"`
				Sources     []int `json:"sources"`
			} `json:"heals"`
			Uncommitted []struct {
				Step int64 `json:"step"`
			} `json:"uncommitted"`
			Commits int `json:"commits"`
		} `json:"quorum"`
		UncommittedSteps int    `json:"uncommitted_steps"`
		Exhausted        string `json:"exhausted"`
	} `json:"fault_tolerance"`
}

var finalLine = regexp.MustCompile(`^replica (\d+) incarnation (\d+) steps (\d+) state ([0-9a-f]{16})$`)

// runFT runs gorun -np 3 --fault-tolerant over the trainer with the given
// extra gorun and trainer flags, and checks that no process of the job is
// left once gorun returned.
func runFTJob(t *testing.T, gorunArgs []string, trainerArgs ...string) ftRun {
	t.Helper()
	return runFTJobN(t, 3, gorunArgs, trainerArgs...)
}

// runFTJobN is runFTJob on np ranks.
func runFTJobN(t *testing.T, np int, gorunArgs []string, trainerArgs ...string) ftRun {
	t.Helper()
	dir := buildBinaries(t)
	report := filepath.Join(t.TempDir(), "report.json")
	token := launchertest.NewToken(t.Name())
	args := append([]string{"-np", strconv.Itoa(np), "--fault-tolerant", "--tag-output", "--report", report}, gorunArgs...)
	args = append(args, filepath.Join(dir, "trainer"), "--fault-tolerant", "--model", "small", "--batch", "12",
		"--steps", strconv.Itoa(ftSteps), "--step-sleep", "40ms")
	args = append(args, trainerArgs...)
	cmd := exec.Command(filepath.Join(dir, "gorun"), args...)
	cmd.Env = append(os.Environ(), launchertest.TokenEnv+"="+token)
	var out, stderr launchertest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("gorun did not finish in 60 s\nstdout:\n%s\nstderr:\n%s", out.String(), stderr.String())
	}
	r := ftRun{out: out.String(), stderr: stderr.String(), final: map[int][]string{}, lines: map[int][]string{}}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if left := launchertest.Survivors(token); len(left) > 0 {
		t.Errorf("processes of the job outlived gorun: %v", left)
	}
	for _, l := range strings.Split(r.out, "\n") {
		if !strings.HasPrefix(l, "[") {
			continue
		}
		tag, rest, _ := strings.Cut(l[1:], "] ")
		rk, err := strconv.Atoi(tag)
		if err != nil {
			continue
		}
		r.lines[rk] = append(r.lines[rk], rest)
		if m := finalLine.FindStringSubmatch(rest); m != nil {
			r.final[rk] = m[1:]
		}
	}
	if b, err := os.ReadFile(report); err == nil {
		if err := json.Unmarshal(b, &r.report); err != nil {
			t.Fatalf("report: %v\n%s", err, b)
		}
	}
	return r
}

// checkHealed asserts a successful job whose three replicas ended at the
// last step bitwise equal, the given ranks on their first incarnation
// (never restarted).
func checkHealed(t *testing.T, r ftRun, survivors ...int) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.stderr)
	}
	var digest string
	for rk := range 3 {
		f := r.final[rk]
		if f == nil {
			t.Fatalf("rank %d printed no final state\nstdout:\n%s\nstderr:\n%s", rk, r.out, r.stderr)
		}
		if f[2] != strconv.Itoa(ftSteps) {
			t.Errorf("rank %d ended at step %s, want %d", rk, f[2], ftSteps)
		}
		if digest == "" {
			digest = f[3]
		}
		if f[3] != digest {
			t.Errorf("rank %d (incarnation %s) ended with state %s, rank 0 with %s: the replicas are not bitwise equal\nstdout:\n%s", rk, f[1], f[3], digest, r.out)
		}
	}
	for _, rk := range survivors {
		if r.final[rk][1] != "0" {
			t.Errorf("survivor rank %d was restarted (incarnation %s)", rk, r.final[rk][1])
		}
		// It stepped through every step: each committed exactly once.
		n := 0
		for _, l := range r.lines[rk] {
			if strings.HasPrefix(l, "step ") && strings.Contains(l, " loss ") {
				n++
			}
		}
		if n != ftSteps {
			t.Errorf("survivor rank %d committed %d steps, want all %d without a restart", rk, n, ftSteps)
		}
	}
}

// TestFTHealAfterInjectedKill: gorun kills rank 1 after its 5th step
// (--inject), replaces it, the replacement heals from both survivors
// (sharded) and every replica ends bitwise equal.
func TestFTHealAfterInjectedKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, []string{"--inject", "kill:rank=1:after-steps=5"})
	checkHealed(t, r, 0, 2)
	ft := r.report.FaultTolerance
	if len(ft.Failures) != 1 || ft.Failures[0].Rank != 1 || ft.Failures[0].Action != "replaced" || ft.Failures[0].TimeToHeal == nil {
		t.Errorf("report's failures: %+v", ft.Failures)
	}
	if len(ft.Quorum.Heals) != 1 || !slices.Equal(ft.Quorum.Heals[0].Sources, []int{0, 2}) {
		t.Errorf("report's heals: %+v, want one from both survivors", ft.Quorum.Heals)
	}
}

// TestFTStepNotCommittedWhenParticipantDies: rank 1 dies inside step 4
// (after its all-reduce, before its commit vote). Both survivors throw
// step 4 away (neither commits it with rank 1's gradient), do it again
// with the participants left, and the job ends healed.
func TestFTStepNotCommittedWhenParticipantDies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, nil, "--crash", "reduce:rank=1:step=4")
	checkHealed(t, r, 0, 2)
	for _, rk := range []int{0, 2} {
		var step4 []string
		for _, l := range r.lines[rk] {
			if strings.HasPrefix(l, "step 4 ") {
				step4 = append(step4, l)
			}
		}
		if len(step4) != 2 || step4[0] != "step 4 uncommitted participants 3" || !strings.Contains(step4[1], "participants 2") {
			t.Errorf("survivor rank %d at step 4: %q; want it uncommitted with 3 participants, then committed by the 2 left", rk, step4)
		}
	}
	ft := r.report.FaultTolerance
	if ft.UncommittedSteps != 1 || len(ft.Quorum.Uncommitted) != 1 || ft.Quorum.Uncommitted[0].Step != 3 {
		t.Errorf("report: %d uncommitted steps %+v, want one (the quorum at committed step 3)", ft.UncommittedSteps, ft.Quorum.Uncommitted)
	}
}

// TestFTKillDuringHeal: rank 1's replacement dies while loading the
// healed state; its own replacement heals, and all end equal.
func TestFTKillDuringHeal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, nil, "--crash", "reduce:rank=1:step=4,load:rank=1:incarnation=1")
	checkHealed(t, r, 0, 2)
	if r.final[1][1] != "2" {
		t.Errorf("rank 1 ended as incarnation %s, want 2 (incarnation 1 died in its heal)", r.final[1][1])
	}
	ft := r.report.FaultTolerance
	if len(ft.Failures) != 2 || ft.Failures[1].Incarnation != 1 {
		t.Errorf("report's failures: %+v, want incarnations 0 and 1 of rank 1", ft.Failures)
	}
	if len(ft.Quorum.Heals) != 1 || ft.Quorum.Heals[0].Incarnation != 2 {
		t.Errorf("report's heals: %+v, want one, by incarnation 2", ft.Quorum.Heals)
	}
}

// TestFTKillHealSource: a heal source (rank 2) dies while serving rank 1's
// heal. The heal fails cleanly and is retried from the remaining source
// (rank 0); rank 2's replacement heals in turn, and all end equal.
func TestFTKillHealSource(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, nil, "--crash", "reduce:rank=1:step=4,save:rank=2")
	checkHealed(t, r, 0)
	ft := r.report.FaultTolerance
	var healed []string
	for _, h := range ft.Quorum.Heals {
		healed = append(healed, strconv.Itoa(h.Replica)+"."+strconv.Itoa(h.Incarnation))
		if h.Replica == 1 && !slices.Equal(h.Sources, []int{0}) {
			t.Errorf("rank 1 healed from %v, want the remaining source [0]", h.Sources)
		}
	}
	if !slices.Contains(healed, "1.1") || !slices.Contains(healed, "2.1") {
		t.Errorf("heals %v, want rank 1's and rank 2's replacements", healed)
	}
}

// TestFTBudgetSpent: with --max-failures 0 the first failure ends the job,
// and the error says why.
func TestFTBudgetSpent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, []string{"--max-failures", "0"}, "--crash", "reduce:rank=1:step=2")
	if r.code == 0 || !strings.Contains(r.stderr, "--max-failures") {
		t.Errorf("gorun exited %d; stderr:\n%s\nwant a failure naming --max-failures", r.code, r.stderr)
	}
	if r.report.FaultTolerance.Exhausted == "" {
		t.Errorf("the report does not say the budget was spent")
	}
}

// TestFTFrozenRankReplaced: a rank stopped (SIGSTOP) past its lease holds
// the others at their next quorum; gorun kills it and replaces it, and the
// job completes healed instead of failing.
func TestFTFrozenRankReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, []string{"-x", "GORUN_RDZV_LEASE=500ms", "--inject", "stop:rank=1:after-steps=5"})
	checkHealed(t, r, 0, 2)
	if f := r.report.FaultTolerance.Failures; len(f) != 1 || f[0].Rank != 1 || f[0].Action != "replaced" {
		t.Errorf("report's failures: %+v, want rank 1 replaced", f)
	}
}

// TestFTHSDPGroupReplaced: HSDP with replica groups of 2 (a shard group is
// one replica). Rank 1 dies inside step 4: gorun replaces its whole group
// (ranks 0 and 1), whose new ranks heal their shards from the other
// group's (ranks 2 and 3), which never stopped. At the end every rank
// holds bitwise the state of the rank at its place in the other group.
func TestFTHSDPGroupReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJobN(t, 4, []string{"--fault-tolerant-group", "2"}, "--mode", "hsdp", "--crash", "reduce:rank=1:step=4")
	if r.code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.stderr)
	}
	for rk, wantInc := range []string{"1", "1", "0", "0"} {
		f := r.final[rk]
		if f == nil {
			t.Fatalf("rank %d printed no final state\nstdout:\n%s\nstderr:\n%s", rk, r.out, r.stderr)
		}
		if f[1] != wantInc || f[2] != strconv.Itoa(ftSteps) {
			t.Errorf("rank %d ended as incarnation %s at step %s, want incarnation %s at step %d", rk, f[1], f[2], wantInc, ftSteps)
		}
	}
	for _, pair := range [][2]int{{0, 2}, {1, 3}} {
		if a, b := r.final[pair[0]][3], r.final[pair[1]][3]; a != b {
			t.Errorf("rank %d's shard state %s differs from rank %d's %s: the groups are not bitwise equal", pair[0], a, pair[1], b)
		}
	}
	ft := r.report.FaultTolerance
	if len(ft.Failures) != 1 || ft.Failures[0].Rank != 1 || !strings.Contains(ft.Failures[0].Action, "replica group") {
		t.Errorf("report's failures: %+v, want rank 1's group replaced once", ft.Failures)
	}
	healed := map[int]bool{}
	for _, h := range ft.Quorum.Heals {
		healed[h.Replica] = true
		if want := []int{h.Replica + 2}; !slices.Equal(h.Sources, want) {
			t.Errorf("rank %d healed from %v, want its place in the other group %v", h.Replica, h.Sources, want)
		}
	}
	if !healed[0] || !healed[1] || len(healed) != 2 {
		t.Errorf("heals %+v, want ranks 0 and 1", ft.Quorum.Heals)
	}
}

// TestFTStartupFailureEndsJob: a deterministic configuration error (the
// global batch 16 does not divide by 3 ranks) is not retried: the first
// rank's failure ends the job at once, naming its error, instead of
// replacing ranks one at a time until the budget is spent.
func TestFTStartupFailureEndsJob(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, []string{"--max-failures", "5"}, "--batch", "16")
	if r.code == 0 {
		t.Fatalf("gorun exited 0 on a configuration error\nstderr:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "global batch 16 must be a multiple of the 3 ranks") || !strings.Contains(r.stderr, "start-up failure") {
		t.Errorf("stderr does not name the rank's error and why the job ended:\n%s", r.stderr)
	}
	f := r.report.FaultTolerance.Failures
	if len(f) != 1 || f[0].Action != "job ended" || f[0].Incarnation != 0 {
		t.Errorf("report's failures: %+v, want one, the first process's, ending the job (no replacement)", f)
	}
}

// TestFTDeterministicReplacementFailureEndsJob: rank 1 is killed mid-
// training and replaced (an outside fault); its replacement exits with
// code 3 while healing, is replaced once more, and the next one exits the
// same way before it healed: that is a deterministic failure, and the job
// ends then, with budget left, instead of retrying it.
func TestFTDeterministicReplacementFailureEndsJob(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, []string{"--max-failures", "10"},
		"--crash", "reduce:rank=1:step=3,load:rank=1:incarnation=1:exit=3,load:rank=1:incarnation=2:exit=3")
	if r.code == 0 || !strings.Contains(r.stderr, "deterministic failure") {
		t.Fatalf("gorun exited %d; want the job ended on a deterministic failure\nstderr:\n%s", r.code, r.stderr)
	}
	var acts []string
	for _, x := range r.report.FaultTolerance.Failures {
		acts = append(acts, fmt.Sprintf("%d/%d %s", x.Rank, x.Incarnation, x.Action))
	}
	if want := []string{"1/0 replaced", "1/1 replaced", "1/2 job ended"}; !slices.Equal(acts, want) {
		t.Errorf("failures %q, want %q", acts, want)
	}
}

// TestFTExitAfterCommitReplaced: a rank that exits with its own error code
// in the middle of training (after it committed steps) is replaced and
// healed like a killed one: only failures before a process held the job's
// state count as deterministic.
func TestFTExitAfterCommitReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, nil, "--crash", "reduce:rank=1:step=4:exit=3")
	checkHealed(t, r, 0, 2)
	if f := r.report.FaultTolerance.Failures; len(f) != 1 || f[0].Action != "replaced" {
		t.Errorf("report's failures: %+v, want rank 1 replaced", f)
	}
}

// TestFTLateReplacementFindsJobFinished: rank 1 dies after the last step
// was committed; its replacement finds the others finished, is told so
// (ft.ErrFinished), says it and exits 0, and the job succeeds with the
// survivors' final states; gorun's report says what happened to it.
func TestFTLateReplacementFindsJobFinished(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, nil, "--crash", "done:rank=1")
	if r.code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.stderr)
	}
	if r.final[0] == nil || r.final[2] == nil || r.final[0][3] != r.final[2][3] || r.final[0][2] != strconv.Itoa(ftSteps) {
		t.Errorf("survivors' final states %v and %v, want both at step %d and equal", r.final[0], r.final[2], ftSteps)
	}
	if !slices.ContainsFunc(r.lines[1], func(l string) bool {
		return strings.HasPrefix(l, "replica 1 incarnation 1: ft: the other replicas finished the job")
	}) {
		t.Errorf("the late replacement did not say it found the job finished:\n%s", r.out)
	}
	if !strings.Contains(r.stderr, "found the job finished") {
		t.Errorf("gorun's summary does not say the replacement found the job finished:\n%s", r.stderr)
	}
}

// TestFTEveryHolderDiedEndsJob: every replica dies in step 3, so no live
// process holds the committed step 2: the replacements would have nothing
// to heal from. The job fails, saying so, instead of replacements being
// told the job finished and exiting 0 with the training lost.
func TestFTEveryHolderDiedEndsJob(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches binaries")
	}
	r := runFTJob(t, []string{"--max-failures", "10"}, "--crash", "reduce:rank=0:step=3,reduce:rank=1:step=3,reduce:rank=2:step=3")
	if r.code == 0 || !strings.Contains(r.stderr, "nothing to heal from") {
		t.Fatalf("gorun exited %d; want the job ended with nothing to heal from\nstderr:\n%s", r.code, r.stderr)
	}
	// The service may learn of the others' deaths (their connections
	// closing) before gorun reaps the first: the job ends at the first
	// failure gorun handles after the last holder is gone.
	f := r.report.FaultTolerance.Failures
	if len(f) == 0 || f[len(f)-1].Action != "job ended" || len(r.report.FaultTolerance.Quorum.Heals) != 0 {
		t.Errorf("report's failures %+v, heals %+v: want the last failure ending the job, no heal", f, r.report.FaultTolerance.Quorum.Heals)
	}
}
