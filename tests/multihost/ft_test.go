package multihost

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
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// Fault-tolerant jobs (gorun --fault-tolerant, the example trainer's
// --fault-tolerant mode) across namespace hosts that lose a host: its
// agent and every process of it killed (--inject kill-host), or its link
// cut. Only the lost host's replica groups leave the job: the other ranks
// keep stepping, each committing every step exactly once, never
// restarted, and end bitwise equal; gorun exits 0, its report names the
// host, the ranks retired and the quorum after; nothing of the job is
// left on any host. A loss that leaves no live holder of the job's state
// ends the job, saying so.

const ftHostSteps = 60

// ftHostReport is the part of the report these tests read.
type ftHostReport struct {
	FaultTolerance struct {
		Failures []struct {
			Rank   int    `json:"rank"`
			Host   string `json:"host"`
			Action string `json:"action"`
			// JoinedAfterStart is from the replacement's start to its heal.
			JoinedAfterStart *float64 `json:"healed_after_start_s"`
		} `json:"failures"`
		LostHosts []struct {
			Host         string `json:"host"`
			Ranks        []int  `json:"ranks"`
			Retired      []int  `json:"retired"`
			Step         int64  `json:"step"`
			Participants []int  `json:"participants_after"`
			Uncommitted  int    `json:"uncommitted_steps"`
			Action       string `json:"action"`
		} `json:"lost_hosts"`
		Quorum struct {
			Heals []struct {
				Replica     int `json:"replica"`
				Incarnation int `json:"incarnation"`
			} `json:"heals"`
		} `json:"quorum"`
		Exhausted string `json:"exhausted"`
	} `json:"fault_tolerance"`
}

// ftHostJob is one --fault-tolerant trainer job on the namespace hosts.
type ftHostJob struct {
	*job
	report string
	// steps is how many steps the trainer runs (ftHostSteps unless a
	// test gives another).
	steps int
	// final is each rank's "replica R incarnation I steps S state D"
	// fields; lines each rank's output lines, untagged.
	final map[int][]string
	lines map[int][]string
}

// newFTHostJob prepares gorun --fault-tolerant over the trainer on hostfile
// hf (np ranks); extra goes to gorun before the program, trainer after.
func newFTHostJob(t *testing.T, h *testhosts.Netns, hf string, np int, gorunArgs, trainerArgs []string) *ftHostJob {
	t.Helper()
	return newFTHostJobSteps(t, h, hf, np, ftHostSteps, gorunArgs, trainerArgs)
}

// newFTHostJobSteps is newFTHostJob with a trainer of steps steps.
func newFTHostJobSteps(t *testing.T, h *testhosts.Netns, hf string, np, steps int, gorunArgs, trainerArgs []string) *ftHostJob {
	t.Helper()
	dir := launchertest.Build(t, "examples/trainer")
	j := &ftHostJob{job: &job{t: t, h: h, token: launchertest.NewToken(t.Name())}, report: filepath.Join(t.TempDir(), "report.json"), steps: steps}
	a := []string{"--launch-agent", strings.Join(h.SSHArgs(), " "), "-hostfile", hf, "-np", strconv.Itoa(np), "--grace", "3s",
		"--fault-tolerant", "--tag-output", "--report", j.report, "-x", launchertest.TokenEnv + "=" + j.token, "-x", "GORACE=atexit_sleep_ms=0"}
	a = append(a, gorunArgs...)
	a = append(a, filepath.Join(dir, "trainer"), "--fault-tolerant", "--model", "small", "--batch", "12",
		"--steps", strconv.Itoa(steps), "--step-sleep", "40ms")
	a = append(a, trainerArgs...)
	j.cmd = exec.Command(gorunBin, a...)
	j.cmd.Stdout, j.cmd.Stderr = &j.stdout, &j.stderr
	return j
}

var ftFinal = regexp.MustCompile(`^replica (\d+) incarnation (\d+) steps (\d+) state ([0-9a-f]{16})$`)

// parse reads the ranks' tagged lines ("[rank,host] line") and the report.
func (j *ftHostJob) parse() ftHostReport {
	j.t.Helper()
	j.final, j.lines = map[int][]string{}, map[int][]string{}
	for _, l := range strings.Split(j.stdout.String(), "\n") {
		tag, rest, ok := strings.Cut(strings.TrimPrefix(l, "["), "] ")
		if !ok || !strings.HasPrefix(l, "[") {
			continue
		}
		rs, _, _ := strings.Cut(tag, ",")
		rk, err := strconv.Atoi(rs)
		if err != nil {
			continue
		}
		j.lines[rk] = append(j.lines[rk], rest)
		if m := ftFinal.FindStringSubmatch(rest); m != nil {
			j.final[rk] = m[1:]
		}
	}
	var rep ftHostReport
	b, err := os.ReadFile(j.report)
	if err != nil {
		j.t.Fatalf("report: %v\nstderr:\n%s", err, j.stderr.String())
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		j.t.Fatalf("report: %v\n%s", err, b)
	}
	return rep
}

// survived checks that each rank of ranks ran its first incarnation to
// the last step, committing every step exactly once, and that the ranks
// of each set in equal ended with the same state digest.
func (j *ftHostJob) survived(ranks []int, equal ...[]int) {
	j.t.Helper()
	for _, rk := range ranks {
		f := j.final[rk]
		if f == nil {
			j.t.Fatalf("survivor rank %d printed no final state\nstdout:\n%s\nstderr:\n%s", rk, j.stdout.String(), j.stderr.String())
		}
		if f[1] != "0" || f[2] != strconv.Itoa(j.steps) {
			j.t.Errorf("survivor rank %d ended as incarnation %s at step %s, want its first process at step %d", rk, f[1], f[2], j.steps)
		}
		var steps []int
		for _, l := range j.lines[rk] {
			var s int
			if _, err := fmt.Sscanf(l, "step %d loss", &s); err == nil {
				steps = append(steps, s)
			}
		}
		for i, s := range steps {
			if s != i+1 {
				j.t.Errorf("survivor rank %d committed steps %v: want 1..%d, each once", rk, steps, j.steps)
				break
			}
		}
	}
	for _, set := range equal {
		for _, rk := range set[1:] {
			if a, b := j.final[set[0]][3], j.final[rk][3]; a != b {
				j.t.Errorf("rank %d ended with state %s, rank %d with %s: the survivors are not bitwise equal\nstdout:\n%s", rk, b, set[0], a, j.stdout.String())
			}
		}
	}
}

// participants is the participant count of rank rk's committed steps, in
// order.
func (j *ftHostJob) participants(rk int) []int {
	var ps []int
	for _, l := range j.lines[rk] {
		var s, p int
		var loss string
		if _, err := fmt.Sscanf(l, "step %d loss %s participants %d", &s, &loss, &p); err == nil {
			ps = append(ps, p)
		}
	}
	return slices.Compact(ps)
}

// TestFTLostHostSurvivorsContinue: 4 hosts of one rank, --mode dp; the
// fourth host is lost (killed whole; its link cut) after step 5. Ranks
// 0-2 go on as 3 participants to the end, bitwise equal, and the job
// succeeds.
func TestFTLostHostSurvivorsContinue(t *testing.T) {
	h := requireHosts(t)
	victim := h.Hosts[3]
	for _, tc := range []string{"kill-host", "cut-link"} {
		t.Run(tc, func(t *testing.T) {
			hf, err := h.WriteHostfile(t.TempDir(), 1)
			if err != nil {
				t.Fatal(err)
			}
			var args []string
			if tc == "kill-host" {
				args = []string{"--inject", "kill-host:host=" + victim + ":after-steps=5"}
			}
			j := newFTHostJob(t, h, hf, 4, args, []string{"--mode", "dp"})
			if err := j.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc == "cut-link" {
				if !launchertest.WaitFor(time.Minute, func() bool { return strings.Contains(j.stdout.String(), "] step 5 loss") }) {
					_ = j.cmd.Process.Kill()
					t.Fatalf("no step 5\nstdout:\n%s\nstderr:\n%s", j.stdout.String(), j.stderr.String())
				}
				if err := h.CutLink(victim); err != nil {
					t.Fatal(err)
				}
				defer restore(t, victim)
			}
			code := j.wait()
			if tc == "cut-link" {
				// The host comes back: its agent must have ended its
				// rank on its own (its lease ran out). The next tests
				// want it answering ssh again.
				restoreAndReach(t, h, victim)
			}
			j.noSurvivors()
			rep := j.parse()
			if code != 0 {
				t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
			}
			j.survived([]int{0, 1, 2}, []int{0, 1, 2})
			if ps := j.participants(0); !slices.Equal(ps, []int{4, 3}) {
				t.Errorf("rank 0's steps had %v participants, want 4 then 3", ps)
			}
			if j.final[3] != nil {
				t.Errorf("the lost rank 3 finished: %v", j.final[3])
			}
			ft := rep.FaultTolerance
			if len(ft.LostHosts) != 1 {
				t.Fatalf("report's lost hosts: %+v\nstderr:\n%s", ft.LostHosts, j.stderr.String())
			}
			lh := ft.LostHosts[0]
			if lh.Host != victim || !slices.Equal(lh.Ranks, []int{3}) || !slices.Equal(lh.Retired, []int{3}) ||
				lh.Action != "survivors continue" || !slices.Equal(lh.Participants, []int{0, 1, 2}) || lh.Step < 5 || lh.Uncommitted > 1 {
				t.Errorf("report's lost host: %+v", lh)
			}
			if len(ft.Failures) != 1 || ft.Failures[0].Rank != 3 || ft.Failures[0].Host != victim || len(ft.Quorum.Heals) != 0 {
				t.Errorf("report's failures %+v, heals %d: want rank 3 lost with its host, no replacement", ft.Failures, len(ft.Quorum.Heals))
			}
			if !strings.Contains(j.stderr.String(), "gorun:   host "+victim+" lost at ") {
				t.Errorf("gorun's summary does not name the lost host:\n%s", j.stderr.String())
			}
		})
	}
}

// TestFTLostHostTakesItsReplicaGroups: HSDP replica groups of 2 over
// hosts of 2, 1, 2 and 1 slots: groups {0,1} on h1, {2,3} on h2 and h3,
// {4,5} on h3 and h4. Losing h4 takes group {4,5} out: rank 5 with its
// host, rank 4 killed on h3. Groups {0,1} and {2,3} go on to the end, each
// rank bitwise equal to its place in the other group.
func TestFTLostHostTakesItsReplicaGroups(t *testing.T) {
	h := requireHosts(t)
	j, rep := runHSDPHostLoss(t, h, []int{2, 1, 2, 1}, 6, 3)
	j.survived([]int{0, 1, 2, 3}, []int{0, 2}, []int{1, 3})
	if j.final[4] != nil || j.final[5] != nil {
		t.Errorf("the retired group finished: %v %v", j.final[4], j.final[5])
	}
	ft := rep.FaultTolerance
	if len(ft.LostHosts) != 1 || !slices.Equal(ft.LostHosts[0].Ranks, []int{5}) || !slices.Equal(ft.LostHosts[0].Retired, []int{4, 5}) ||
		ft.LostHosts[0].Action != "survivors continue" || !slices.Equal(ft.LostHosts[0].Participants, []int{0, 1, 2, 3}) {
		t.Errorf("report's lost hosts: %+v", ft.LostHosts)
	}
}

// TestFTLostHostLastHolderEndsJob: one replica group of 2 ranks on two
// hosts; losing the second host takes the only group out, and with it
// every holder of the job's state. The job fails, naming the host and
// why, and leaves nothing behind.
func TestFTLostHostLastHolderEndsJob(t *testing.T) {
	h := requireHosts(t)
	hf := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(hf, []byte(fmt.Sprintf("%s slots=1\n%s slots=1\n", h.Hosts[0], h.Hosts[1])), 0o644); err != nil {
		t.Fatal(err)
	}
	j := newFTHostJob(t, h, hf, 2, []string{"--fault-tolerant-group", "2", "--inject", "kill-host:host=" + h.Hosts[1] + ":after-steps=5"},
		[]string{"--mode", "hsdp"})
	code := j.run()
	j.noSurvivors()
	rep := j.parse()
	if code != 255 || !strings.Contains(j.stderr.String(), "no live rank holds the job's state") ||
		!strings.Contains(j.stderr.String(), "lost host "+h.Hosts[1]) {
		t.Fatalf("gorun exited %d; want 255 naming the lost host and the lost state\nstderr:\n%s", code, j.stderr.String())
	}
	if lh := rep.FaultTolerance.LostHosts; len(lh) != 1 || lh[0].Action != "job ended" {
		t.Errorf("report's lost hosts: %+v", lh)
	}
}

// TestFTSpareHostTakesOver: 4 hosts of one slot, -np 3: the fourth host is
// a spare. The second host is killed whole after step 5; its rank 1
// starts on the spare as its next incarnation, with the spare's identity
// (its hostname and GORUN_HOST), joins at a step boundary and heals from
// ranks 0 and 2, which never stopped: all three end bitwise equal.
func TestFTSpareHostTakesOver(t *testing.T) {
	h := requireHosts(t)
	victim, spare := h.Hosts[1], h.Hosts[3]
	hf, err := h.WriteHostfile(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	j := newFTHostJob(t, h, hf, 3, []string{"--inject", "kill-host:host=" + victim + ":after-steps=5"}, []string{"--mode", "dp"})
	// Each process says where it runs, then becomes the trainer.
	i := slices.Index(j.cmd.Args, "--fault-tolerant") // gorun's own flag comes first
	i = i + slices.Index(j.cmd.Args[i+1:], "--fault-tolerant")
	j.cmd.Args = slices.Insert(j.cmd.Args, i, "/bin/sh", "-c", `echo "on $(hostname) GORUN_HOST=$GORUN_HOST incarnation $GORUN_FT_INCARNATION"; exec "$0" "$@"`)
	code := j.run()
	j.noSurvivors()
	rep := j.parse()
	if code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	j.survived([]int{0, 2}, []int{0, 1, 2})
	if f := j.final[1]; f == nil || f[1] != "1" || f[2] != strconv.Itoa(ftHostSteps) {
		t.Errorf("rank 1 ended as %v, want incarnation 1 at step %d", f, ftHostSteps)
	}
	if !slices.Contains(j.lines[1], fmt.Sprintf("on %s GORUN_HOST=%s incarnation 1", spare, spare)) {
		t.Errorf("rank 1's replacement did not run on the spare %s as itself there:\n%s", spare, strings.Join(j.lines[1], "\n"))
	}
	ft := rep.FaultTolerance
	if len(ft.LostHosts) != 1 || ft.LostHosts[0].Host != victim || ft.LostHosts[0].Action != "replaced on spare host "+spare ||
		!slices.Equal(ft.LostHosts[0].Ranks, []int{1}) || len(ft.LostHosts[0].Retired) != 0 {
		t.Errorf("report's lost hosts: %+v", ft.LostHosts)
	}
	if len(ft.Quorum.Heals) != 1 {
		t.Errorf("report's heals: %+v, want rank 1's", ft.Quorum.Heals)
	}
	if len(ft.Failures) != 1 || ft.Failures[0].JoinedAfterStart == nil {
		t.Errorf("report's failures: %+v, want rank 1 healed", ft.Failures)
	}
}

// TestFTSpareHostTakesOverReplicaGroup: HSDP groups of 2 over hosts of 2,
// 1, 1 and 1 slots, -np 4: group {0,1} on h1, group {2,3} on h2 and h3,
// h4 a spare. Losing h3 starts rank 3 on the spare and rank 2 again on
// h2 (its group is replaced whole), both as incarnation 1; they heal
// their shards from group {0,1}, and each rank ends bitwise equal to its
// place in the other group.
func TestFTSpareHostTakesOverReplicaGroup(t *testing.T) {
	h := requireHosts(t)
	j, rep := runHSDPHostLoss(t, h, []int{2, 1, 1, 1}, 4, 2)
	j.survived([]int{0, 1}, []int{0, 2}, []int{1, 3})
	for _, rk := range []int{2, 3} {
		if f := j.final[rk]; f == nil || f[1] != "1" || f[2] != strconv.Itoa(ftHostSteps) {
			t.Errorf("rank %d ended as %v, want incarnation 1 at step %d", rk, f, ftHostSteps)
		}
	}
	ft := rep.FaultTolerance
	if len(ft.LostHosts) != 1 || ft.LostHosts[0].Action != "replaced on spare host "+h.Hosts[3] || !slices.Equal(ft.LostHosts[0].Ranks, []int{3}) {
		t.Errorf("report's lost hosts: %+v", ft.LostHosts)
	}
	healed := map[int]int{}
	for _, x := range ft.Quorum.Heals {
		healed[x.Replica] = x.Incarnation
	}
	if len(healed) != 2 || healed[2] != 1 || healed[3] != 1 {
		t.Errorf("heals %+v, want ranks 2 and 3 as incarnation 1", ft.Quorum.Heals)
	}
}

// runHSDPHostLoss runs np ranks of the trainer's --mode hsdp in replica
// groups of 2 on the hosts, slots[i] on host i (hosts the np ranks leave
// empty are spares), kills host victim whole after step 5, and wants gorun
// to exit 0 leaving nothing behind.
func runHSDPHostLoss(t *testing.T, h *testhosts.Netns, slots []int, np, victim int) (*ftHostJob, ftHostReport) {
	t.Helper()
	var hf strings.Builder
	for i, n := range slots {
		fmt.Fprintf(&hf, "%s slots=%d\n", h.Hosts[i], n)
	}
	path := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(path, []byte(hf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	j := newFTHostJob(t, h, path, np, []string{"--fault-tolerant-group", "2", "--inject", "kill-host:host=" + h.Hosts[victim] + ":after-steps=5"},
		[]string{"--mode", "hsdp"})
	code := j.run()
	j.noSurvivors()
	rep := j.parse()
	if code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	return j, rep
}

// TestFTHSDPStartUnderPacketLoss: HSDP replica groups that span hosts
// ({0,1} on h1 and h2, {2,3} on h3 and h4) start while h2 drops a share
// of its packets both ways (iptables' random match), as when the kernel's
// neighbour table overflowed. The start-up must either complete or fail
// with an error naming its cause within the test's bound: never a rank
// waiting without end in a group collective for a peer that gave the
// quorum up.
func TestFTHSDPStartUnderPacketLoss(t *testing.T) {
	h := requireHosts(t)
	victim := h.Hosts[1]
	// Half the packets for 12 s: enough that, on the code before the
	// quorum was failed on a no vote and the replica group's
	// communicator with it, one run in four hung.
	const loss, lossFor = "0.5", 12 * time.Second
	hf, err := h.WriteHostfile(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	rule := func(op, chain string) error {
		out, err := exec.Command("ip", "netns", "exec", victim, "iptables", op, chain,
			"-m", "statistic", "--mode", "random", "--probability", loss, "-j", "DROP").CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s %s on %s: %v: %s", op, chain, victim, err, out)
		}
		return nil
	}
	j := newFTHostJob(t, h, hf, 4, []string{"--fault-tolerant-group", "2"}, []string{"--mode", "hsdp"})
	var mu sync.Mutex
	on, off := false, false
	drop := func() error {
		mu.Lock()
		defer mu.Unlock()
		if off {
			return nil
		}
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			if err := rule("-I", chain); err != nil {
				return err
			}
		}
		on = true
		return nil
	}
	lift := func() {
		mu.Lock()
		defer mu.Unlock()
		if on {
			for _, chain := range []string{"INPUT", "OUTPUT"} {
				if err := rule("-D", chain); err != nil {
					t.Error(err)
				}
			}
		}
		on, off = false, true
	}
	defer lift()
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The loss starts as the ranks start (rank 0 announces the model
	// after joining the quorum service), so that the hosts' agents are
	// up and what it hits is the ranks' start-up: the quorum service,
	// the first quorum, the communicators.
	if launchertest.WaitFor(time.Minute, func() bool { return strings.Contains(j.stdout.String(), "fault-tolerant hsdp") }) {
		if err := drop(); err != nil {
			t.Error(err)
		}
		timer := time.AfterFunc(lossFor, lift)
		defer timer.Stop()
	}
	start := time.Now()
	code := j.wait()
	took := time.Since(start)
	lift()
	t.Logf("gorun exited %d %v after the loss began\nstderr:\n%s", code, took, j.stderr.String())
	j.noSurvivors()
	rep := j.parse()
	// The loss lasts lossFor; a communicator that cannot be built gives
	// up after ft's connect timeout (20 s), and its quorum is failed on
	// every participant at once.
	if bound := lossFor + 40*time.Second; took > bound {
		t.Errorf("gorun took %v after the loss began, beyond %v", took, bound)
	}
	switch lh := rep.FaultTolerance.LostHosts; {
	case code != 0:
		if !strings.Contains(j.stderr.String(), victim) {
			t.Fatalf("gorun exited %d without naming %s, the host that dropped packets\nstdout:\n%s", code, victim, j.stdout.String())
		}
	case len(lh) == 0:
		j.survived([]int{0, 1, 2, 3}, []int{0, 2}, []int{1, 3})
	default:
		// The host's link was silent past its lease: its replica group
		// was retired, and the other trained to the end.
		if lh[0].Host != victim || !slices.Equal(lh[0].Retired, []int{0, 1}) {
			t.Fatalf("lost hosts %+v, want %s with replica group {0,1}", lh, victim)
		}
		j.survived([]int{2, 3})
	}
}
