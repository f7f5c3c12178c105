package multihost

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// elasticReport is the part of gorun's --report an elastic test reads.
type elasticReport struct {
	Restarts  int      `json:"restarts"`
	LostHosts []string `json:"lost_hosts"`
	Worlds    []struct {
		NP      int      `json:"np"`
		Hosts   []string `json:"hosts"`
		Result  string   `json:"result"`
		EndedAt float64  `json:"ended_at_s"`
	} `json:"worlds"`
	Outcome           string `json:"outcome"`
	CheckpointSignals []struct {
		At      float64 `json:"at_s"`
		Restart int     `json:"restart"`
		Why     string  `json:"why"`
	} `json:"checkpoint_signals"`
}

func readElasticReport(t *testing.T, path string) (elasticReport, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep elasticReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, string(b)
}

// worldHosts maps each world to the hosts its ranks printed their
// "world N" line from (restart-aware helper, --tag-output).
func worldHosts(out string) map[string][]string {
	m := map[string][]string{}
	for _, g := range regexp.MustCompile(`(?m)^\[\d+,([^\]]+)\] world (\d) `).FindAllStringSubmatch(out, -1) {
		if !slices.Contains(m[g[2]], g[1]) {
			m[g[2]] = append(m[g[2]], g[1])
		}
		slices.Sort(m[g[2]])
	}
	return m
}

// Elastic (--min-np/--max-np) across namespace hosts, with a host killed
// whole (its agent and ranks: gorun sees it lost):
//   - spare: 4 hosts of 1 slot, --max-np 2: the world runs on h1,h2; h2 is
//     killed; the next world runs 2 ranks on h1,h3 (the spare took over);
//   - shrink: hosts h1,h2 of 2 slots, -np 4 --min-np 2: h2 is killed; the
//     next world runs 2 ranks on h1;
//   - below the minimum: the same with --min-np 3: the job fails naming
//     the lost host and what ended the last world.
//
// Every case leaves no process on any host.
func TestElasticKillHost(t *testing.T) {
	h := requireHosts(t)
	h1, h2, h3 := h.Hosts[0], h.Hosts[1], h.Hosts[2]
	for _, tc := range []struct {
		name      string
		hostfile  string
		args      []string
		wantCode  int
		wantNP    int
		wantHosts []string
	}{
		{"spare", fmt.Sprintf("%s slots=1\n%s slots=1\n%s slots=1\n%s slots=1\n", h1, h2, h3, h.Hosts[3]),
			[]string{"--max-np", "2", "--min-np", "1"}, 0, 2, []string{h1, h3}},
		{"shrink", fmt.Sprintf("%s slots=2\n%s slots=2\n", h1, h2),
			[]string{"-np", "4", "--min-np", "2"}, 0, 2, []string{h1}},
		{"below min-np", fmt.Sprintf("%s slots=2\n%s slots=2\n", h1, h2),
			[]string{"-np", "4", "--min-np", "3"}, 255, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			hf := filepath.Join(dir, "hostfile")
			if err := os.WriteFile(hf, []byte(tc.hostfile), 0o644); err != nil {
				t.Fatal(err)
			}
			report := filepath.Join(dir, "report.json")
			args := append([]string{"--tag-output", "--inject", "kill-host:host=" + h2 + ":at=1s", "--max-restarts", "2", "--report", report}, tc.args...)
			j := newJobOn(t, h, hf, "restart-aware", nil, args...)
			code := j.run()
			j.noSurvivors()
			rep, raw := readElasticReport(t, report)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s\nreport:\n%s", code, tc.wantCode, j.stdout.String(), j.stderr.String(), raw)
			}
			if !slices.Equal(rep.LostHosts, []string{h2}) || !strings.Contains(rep.Worlds[0].Result, "lost host "+h2) {
				t.Fatalf("report:\n%s", raw)
			}
			if tc.wantCode != 0 {
				if len(rep.Worlds) != 1 || !strings.Contains(rep.Outcome, "--min-np is 3 (lost: "+h2+")") || !strings.Contains(rep.Outcome, "lost host "+h2) {
					t.Fatalf("report:\n%s", raw)
				}
				return
			}
			w1 := rep.Worlds[len(rep.Worlds)-1]
			if rep.Restarts != 1 || w1.NP != tc.wantNP || !slices.Equal(w1.Hosts, tc.wantHosts) || w1.Result != "succeeded" {
				t.Fatalf("the last world: %+v, want %d ranks on %v\nreport:\n%s", w1, tc.wantNP, tc.wantHosts, raw)
			}
			// The ranks' own word: where world 1 ran.
			if got := worldHosts(j.stdout.String())["1"]; !slices.Equal(got, tc.wantHosts) {
				t.Fatalf("world 1's ranks printed from %v, want %v\n%s", got, tc.wantHosts, j.stdout.String())
			}
		})
	}
}

// The whole elastic promise with the example trainer: 2 hosts × 2 ranks,
// sharded, checkpointing every 3 steps; the second host is killed whole
// once its ranks have reported step 7. The job continues on the first host
// alone (2 ranks, --min-np 2), resumes from the checkpoint, and ends with
// the losses and parameters of an uninterrupted run on 4 ranks, bit for
// bit (--deterministic makes them independent of the rank count).
func TestElasticTrainerResumesOnFewerHosts(t *testing.T) {
	h := requireHosts(t)
	dir, trainer, common, ref := uninterruptedTrainer(t)
	hf := filepath.Join(dir, "hostfile")
	if err := os.WriteFile(hf, []byte(fmt.Sprintf("%s slots=2\n%s slots=2\n", h.Hosts[0], h.Hosts[1])), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report.json")
	args := []string{"--launch-agent", strings.Join(h.SSHArgs(), " "), "-hostfile", hf, "-np", "4", "--min-np", "2",
		"--max-restarts", "1", "--report", report, "--inject", "kill-host:host=" + h.Hosts[1] + ":after-steps=7",
		"/bin/sh", "-c", `echo "world $GORUN_RESTART_COUNT"; exec "$0" "$@"`, trainer}
	args = append(args, common...)
	args = append(args, "--checkpoint", filepath.Join(dir, "ckpt"), "--checkpoint-every", "3")
	cmd := exec.Command(gorunBin, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gorun: %v\n%s", err, out)
	}
	// Rank 0's lines per world (untagged output: only rank 0 prints).
	losses, params, resumed := trainerLosses(t, string(out), 2)
	if resumed[1] < 6 {
		t.Fatalf("the second world resumed from step %d\n%s", resumed[1], out)
	}
	want, wantParams, _ := trainerLosses(t, "world 0\n"+string(ref), 1)
	if !slices.Equal(losses, want) || params == "" || params != wantParams {
		t.Fatalf("losses %v %s\nwant %v %s\n%s", losses, params, want, wantParams, out)
	}
	rep, raw := readElasticReport(t, report)
	if len(rep.Worlds) != 2 || rep.Worlds[1].NP != 2 || !slices.Equal(rep.Worlds[1].Hosts, []string{h.Hosts[0]}) || !slices.Equal(rep.LostHosts, []string{h.Hosts[1]}) {
		t.Fatalf("report:\n%s", raw)
	}
}

// trainerLosses joins the "step N loss L" lines of rank 0 across worlds
// (each world's output follows its "world N" line): a world that resumed
// from step k replaces what came after k. It returns the losses, the last
// world's parameter summary and the step each world resumed from.
func trainerLosses(t *testing.T, out string, worlds int) (losses []string, params string, resumed []int) {
	t.Helper()
	byWorld := map[string][]string{}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		if w, ok := strings.CutPrefix(l, "world "); ok {
			cur = w
			continue
		}
		byWorld[cur] = append(byWorld[cur], l)
	}
	for w := range worlds {
		from := -1
		var own []string
		for _, l := range byWorld[fmt.Sprint(w)] {
			f := strings.Fields(l)
			switch {
			case len(f) == 6 && f[0] == "step" && f[2] == "loss":
				own = append(own, f[1]+" "+f[3])
			case len(f) >= 4 && f[0] == "resumed" && w > 0:
				fmt.Sscan(f[3], &from)
			case strings.HasPrefix(l, "summary:") && strings.LastIndex(l, "params ") > 0:
				params = l[strings.LastIndex(l, "params "):]
			}
		}
		if w > 0 {
			if from < 0 || from > len(losses) {
				t.Fatalf("world %d resumed from step %d after %d steps\n%s", w, from, len(losses), out)
			}
			losses = losses[:from]
		}
		resumed = append(resumed, from)
		losses = append(losses, own...)
	}
	return losses, params, resumed
}

// Grow-back: 2 hosts × 2 ranks, -np 4 --min-np 2. The second
// host is killed whole once its ranks reported step 5: world 1 runs on
// the first host alone (2 ranks). Once world 1's rank 1 reported step 12
// it is killed: at that restart gorun asks the lost host again, it
// answers (its sshd never went away; only gorun's agent and ranks were
// killed), and world 2 runs 4 ranks on both hosts again, resuming from
// the checkpoint. The losses and parameters equal an uninterrupted run's
// on 4 ranks, bit for bit. A variant with the lost host blackholed
// before world 2 shows it left out: world 2 runs on 2 ranks.
func TestElasticGrowBack(t *testing.T) {
	h := requireHosts(t)
	_, trainer, common, ref := uninterruptedTrainer(t)
	want, wantParams, _ := trainerLosses(t, "world 0\n"+string(ref), 1)
	for _, tc := range []struct {
		name      string
		blackhole bool
		wantNP    int
	}{
		{"answers again", false, 4},
		{"still lost", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.blackhole && os.Getenv("GORUN_CHAOS") != "full" {
				// ~10 s, most of it the unanswered question: in the
				// full matrix (make test-chaos), not in make test.
				t.Skip("GORUN_CHAOS=full runs it (make test-chaos)")
			}
			dir := t.TempDir()
			hf := filepath.Join(dir, "hostfile")
			if err := os.WriteFile(hf, []byte(fmt.Sprintf("%s slots=2\n%s slots=2\n", h.Hosts[0], h.Hosts[1])), 0o644); err != nil {
				t.Fatal(err)
			}
			report := filepath.Join(dir, "report.json")
			args := []string{"--launch-agent", strings.Join(h.SSHArgs(), " "), "-hostfile", hf, "-np", "4", "--min-np", "2",
				"--max-restarts", "2", "--report", report,
				"--inject", "kill-host:host=" + h.Hosts[1] + ":after-steps=5",
				"--inject", "kill:rank=1:after-steps=12",
				"/bin/sh", "-c", `echo "world $GORUN_RESTART_COUNT"; exec "$0" "$@"`, trainer}
			args = append(args, common...)
			args = append(args, "--checkpoint", filepath.Join(dir, "ckpt"), "--checkpoint-every", "3")
			cmd := exec.Command(gorunBin, args...)
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout, cmd.Stderr = pw, pw
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			var buf strings.Builder
			sc := bufio.NewScanner(pr)
			blocked := false
			for sc.Scan() {
				buf.WriteString(sc.Text() + "\n")
				if tc.blackhole && !blocked && sc.Text() == "world 1" {
					// An event, not a time: world 1 runs, so the lost
					// host is cut off before world 2 asks for it, as a
					// host that stays down looks.
					if err := h.Blackhole(h.Hosts[1]); err != nil {
						t.Error(err)
					}
					blocked = true
				}
			}
			err = cmd.Wait()
			pr.Close()
			if blocked {
				_ = h.Unblock(h.Hosts[1])
			}
			out := buf.String()
			if err != nil {
				t.Fatalf("gorun: %v\n%s", err, out)
			}
			rep, raw := readElasticReport(t, report)
			if len(rep.Worlds) != 3 || rep.Worlds[1].NP != 2 || !slices.Equal(rep.Worlds[1].Hosts, []string{h.Hosts[0]}) ||
				rep.Worlds[2].NP != tc.wantNP || !slices.Equal(rep.LostHosts, []string{h.Hosts[1]}) {
				t.Fatalf("worlds: want 4, 2, then %d ranks\nreport:\n%s\n%s", tc.wantNP, raw, out)
			}
			if got := strings.Contains(raw, `"readmitted"`); got == tc.blackhole {
				t.Fatalf("readmitted in the report: %v, want %v\n%s", got, !tc.blackhole, raw)
			}
			losses, params, resumed := trainerLosses(t, out, 3)
			if !slices.Equal(losses, want) || params == "" || params != wantParams {
				t.Fatalf("losses %v %s\nwant %v %s\n%s", losses, params, want, wantParams, out)
			}
			t.Logf("worlds of %d, %d, %d ranks; resumed from steps %v", rep.Worlds[0].NP, rep.Worlds[1].NP, rep.Worlds[2].NP, resumed[1:])
		})
	}
}

// Grow-back while the world runs (--readmit-every, torchrun's restart on a
// membership change): hosts h1, h2 of 2 slots, -np 4 --min-np 2
// --max-restarts 1. h2 is killed whole once its ranks did their first
// all-reduce; world 1 runs 2 ranks on h1 and can end in no other way
// than being stopped to grow (its ranks wait for ever); gorun asks h2
// every second, it answers, world 1 is stopped, and world 2 runs 4 ranks
// on both hosts and succeeds. The grow restart is not counted against
// --max-restarts (1, spent on the kill). With --checkpoint-signal-before
// 500ms, world 1's ranks get the checkpoint signal (SIGUSR1) at least that
// long before gorun stops them, so a program resumes from a checkpoint
// taken then, not from its last periodic one.
func TestElasticGrowsWhileRunning(t *testing.T) {
	h := requireHosts(t)
	h1, h2 := h.Hosts[0], h.Hosts[1]
	dir := t.TempDir()
	hf := filepath.Join(dir, "hostfile")
	if err := os.WriteFile(hf, []byte(fmt.Sprintf("%s slots=2\n%s slots=2\n", h1, h2)), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report.json")
	j := newJobOn(t, h, hf, "restart-aware:grow", nil, "--tag-output", "-np", "4", "--min-np", "2", "--max-restarts", "1",
		"--readmit-every", "1s", "--report", report, "--inject", "kill-host:host="+h2+":after-steps=1",
		"--checkpoint-signal-before", "500ms")
	code := j.run()
	j.noSurvivors()
	rep, raw := readElasticReport(t, report)
	if code != 0 || len(rep.Worlds) != 3 || rep.Restarts != 2 {
		t.Fatalf("exit %d, want 0 after 3 worlds\nstdout:\n%s\nstderr:\n%s\nreport:\n%s", code, j.stdout.String(), j.stderr.String(), raw)
	}
	nps := []int{rep.Worlds[0].NP, rep.Worlds[1].NP, rep.Worlds[2].NP}
	if !slices.Equal(nps, []int{4, 2, 4}) || !slices.Equal(rep.Worlds[2].Hosts, []string{h1, h2}) ||
		!strings.Contains(rep.Worlds[1].Result, "grow back") || rep.Worlds[2].Result != "succeeded" {
		t.Fatalf("worlds of %v ranks, want 4, 2, 4\nreport:\n%s", nps, raw)
	}
	if got := worldHosts(j.stdout.String())["2"]; !slices.Equal(got, []string{h1, h2}) {
		t.Fatalf("world 2's ranks printed from %v\n%s", got, j.stdout.String())
	}
	// The notice before the stop: sent once, in world 1, 500 ms or more
	// before it ended, and received by both of its ranks.
	cs := rep.CheckpointSignals
	if len(cs) != 1 || cs[0].Restart != 1 || !strings.HasPrefix(cs[0].Why, "before growing back ("+h2) || rep.Worlds[1].EndedAt-cs[0].At < 0.5 {
		t.Fatalf("checkpoint signals %+v, want one in world 1 at least 0.5 s before it ended (%.3f s)\nreport:\n%s", cs, rep.Worlds[1].EndedAt, raw)
	}
	if n := strings.Count(j.stdout.String(), "checkpoint signal at "); n != 2 {
		t.Fatalf("%d ranks printed the checkpoint signal, want world 1's 2\n%s", n, j.stdout.String())
	}
}

// uninterruptedTrainer builds the example trainer and runs it on 4 local
// ranks with the elastic tests' common flags: the run every elastic world
// sequence must equal bit for bit. It returns the build directory, the
// trainer, those flags and the run's output.
func uninterruptedTrainer(t *testing.T) (dir, trainer string, common []string, ref []byte) {
	t.Helper()
	dir = launchertest.Build(t, "examples/trainer")
	trainer = filepath.Join(dir, "trainer")
	// 200 steps: an after-steps kill lands a supervisor tick (20 ms) or
	// so after the step; the world must still be running then. With 20
	// steps a quiet machine ran world 1 of TestElasticGrowBack (steps 7
	// to 20, 0.3 ms each) to its end before the kill at step 12 landed,
	// and the job finished in 2 worlds instead of 3.
	common = []string{"--steps", "200", "--model", "small", "--batch", "8", "--deterministic", "--mode", "sharded"}
	ref, err := exec.Command(gorunBin, append([]string{"-np", "4", trainer}, common...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("the uninterrupted run: %v\n%s", err, ref)
	}
	return dir, trainer, common, ref
}
