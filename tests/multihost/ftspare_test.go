package multihost

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// Spare hosts of a fault-tolerant job at their edges: a spare lost while
// it waits, unused; a rank that moved to a spare, in the output; a host
// some of whose ranks had finished.

// ftSpareReport is the part of the report about spare hosts.
type ftSpareReport struct {
	FaultTolerance struct {
		LostSpares []struct {
			Host       string   `json:"host"`
			Why        string   `json:"why"`
			SparesLeft []string `json:"spares_left"`
		} `json:"lost_spares"`
		LostHosts []struct {
			Host    string `json:"host"`
			Ranks   []int  `json:"ranks"`
			Retired []int  `json:"retired"`
			Spare   string `json:"spare"`
			Action  string `json:"action"`
		} `json:"lost_hosts"`
		Failures []struct {
			Rank   int    `json:"rank"`
			Host   string `json:"host"`
			Action string `json:"action"`
		} `json:"failures"`
		Quorum struct {
			Heals []struct {
				Replica     int `json:"replica"`
				Incarnation int `json:"incarnation"`
			} `json:"heals"`
		} `json:"quorum"`
	} `json:"fault_tolerance"`
}

func (j *ftHostJob) spareReport() ftSpareReport {
	j.t.Helper()
	var rep ftSpareReport
	b, err := os.ReadFile(j.report)
	if err == nil {
		err = json.Unmarshal(b, &rep)
	}
	if err != nil {
		j.t.Fatalf("report: %v\nstderr:\n%s", err, j.stderr.String())
	}
	return rep
}

// tagged reports whether gorun's stdout holds a line of rank rk tagged
// with host that starts with prefix.
func (j *ftHostJob) tagged(rk int, host, prefix string) bool {
	return strings.Contains(j.stdout.String(), fmt.Sprintf("[%d,%s] %s", rk, host, prefix))
}

// waitOutput waits up to d for out() to hold s; it fails the test (after
// killing gorun) when it does not.
func (j *ftHostJob) waitOutput(d time.Duration, what string, out func() string, s string) {
	j.t.Helper()
	if !launchertest.WaitFor(d, func() bool { return strings.Contains(out(), s) }) {
		_ = j.cmd.Process.Kill()
		j.t.Fatalf("no %s (%q) within %v\nstdout:\n%s\nstderr:\n%s", what, s, d, j.stdout.String(), j.stderr.String())
	}
}

// TestFTSpareLostWhileIdle: 4 hosts of one slot, -np 2: ranks 0 and 1 on
// h1 and h2, h3 and h4 spares, leases of 2 s. h3's link is cut while it
// waits: gorun says so on stderr within about a lease, no longer offers
// it, and h3's agent ends on its own while still cut off. Then h2's agent
// is killed: rank 1 starts on h4, the next live spare, heals and steps,
// its lines tagged with h4 and its log saying where it moved. Then h4's
// agent is killed too: no spare is left, rank 1 is retired, the failure
// says so, and rank 0 trains alone to the end. gorun exits 0 and nothing
// of the job is left anywhere.
func TestFTSpareLostWhileIdle(t *testing.T) {
	h := requireHosts(t)
	first, victim, idle, spare := h.Hosts[0], h.Hosts[1], h.Hosts[2], h.Hosts[3]
	hf, err := h.WriteHostfile(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	logs := t.TempDir()
	const lease = 2 * time.Second
	j := newFTHostJobSteps(t, h, hf, 2, 300, []string{"-v", "--lease", lease.String(), "--output-dir", logs}, []string{"--mode", "dp"})
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := false
	defer func() {
		if !ended { // a failure on the way: gorun goes too
			_ = j.cmd.Process.Kill()
			_ = j.cmd.Wait()
		}
	}()
	j.waitOutput(time.Minute, "step 5", j.stdout.String, "] step 5 loss")
	// The ranks start before every host is up; a spare holds its lease
	// once gorun has its hello and the plan (-v logs it).
	for _, sp := range []string{idle, spare} {
		j.waitOutput(time.Minute, "lease of the spare "+sp, j.stderr.String, "spare host waits, holding a lease host="+sp)
	}

	back := j.cutIdleSpare(idle, lease)
	if err := syscall.Kill(agentPid(t, victim), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	j.waitOutput(time.Minute, "step of rank 1 on the spare "+spare, j.stdout.String, fmt.Sprintf("[1,%s] step ", spare))
	if err := syscall.Kill(agentPid(t, spare), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := j.wait()
	ended = true
	back()
	j.noSurvivors()
	j.parse()
	if code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	j.survived([]int{0})
	if n := strings.Count(j.stderr.String(), idleLine(idle)); n != 1 {
		t.Errorf("stderr says %d times that %s was lost while idle, want once:\n%s", n, idle, j.stderr.String())
	}
	if !strings.Contains(j.stderr.String(), "gorun:   spare host "+idle+" lost while idle at ") {
		t.Errorf("gorun's summary does not list the lost spare:\n%s", j.stderr.String())
	}

	ft := j.spareReport().FaultTolerance
	if len(ft.LostSpares) != 1 || ft.LostSpares[0].Host != idle || !slices.Equal(ft.LostSpares[0].SparesLeft, []string{spare}) ||
		!strings.Contains(ft.LostSpares[0].Why, "no word from its agent") {
		t.Errorf("report's lost spares: %+v, want %s (silent), leaving %s", ft.LostSpares, idle, spare)
	}
	if len(ft.LostHosts) != 2 ||
		ft.LostHosts[0].Host != victim || ft.LostHosts[0].Spare != spare || ft.LostHosts[0].Action != "replaced on spare host "+spare ||
		ft.LostHosts[1].Host != spare || ft.LostHosts[1].Action != "survivors continue" || !slices.Equal(ft.LostHosts[1].Retired, []int{1}) {
		t.Errorf("report's lost hosts: %+v, want %s replaced on %s, then %s with rank 1 retired", ft.LostHosts, victim, spare, spare)
	}
	if len(ft.Failures) != 2 || !strings.Contains(ft.Failures[1].Action, "no spare host is left: "+idle+" lost while idle") {
		t.Errorf("report's failures: %+v, want rank 1's second loss to say that no spare was left", ft.Failures)
	}
	if !slices.ContainsFunc(ft.Quorum.Heals, func(x struct {
		Replica     int `json:"replica"`
		Incarnation int `json:"incarnation"`
	}) bool {
		return x.Replica == 1 && x.Incarnation == 1
	}) {
		t.Errorf("heals %+v: rank 1's replacement on %s did not heal", ft.Quorum.Heals, spare)
	}

	// The output of a rank that moved: tagged with the host it runs on,
	// in one log that says where it moved.
	j.checkMoved(logs, victim, spare)
	if !j.tagged(0, first, "replica 0 incarnation 0") {
		t.Errorf("rank 0's last line is not tagged with %s", first)
	}
}

// cutIdleSpare cuts idle spare host idle's link and waits for gorun to
// say, once, that it lost it, and for its agent to end at its own lease
// while still cut off. The returned function restores the link and waits
// for the host to answer ssh (the next tests use it); it is idempotent,
// and runs at the test's end whatever happens.
func (j *ftHostJob) cutIdleSpare(idle string, lease time.Duration) (back func()) {
	t, h := j.t, j.h
	t.Helper()
	if err := h.CutLink(idle); err != nil {
		_ = j.cmd.Process.Kill()
		t.Fatal(err)
	}
	cut := time.Now()
	back = sync.OnceFunc(func() {
		restoreAndReach(t, h, idle)
	})
	t.Cleanup(back) // on every path, a failure's included
	j.waitOutput(lease+20*time.Second, "word of the idle spare's loss", j.stderr.String, idleLine(idle))
	t.Logf("the cut spare was reported lost %v after the cut", time.Since(cut).Round(time.Millisecond))
	var stray []int
	var err error
	if !launchertest.WaitFor(lease+15*time.Second, func() bool {
		stray, err = h.StrayPids(idle)
		return err == nil && len(stray) == 0
	}) {
		t.Errorf("the cut spare %s still runs %v (%s) %v after the cut: its agent did not end at its lease (err %v)",
			idle, stray, describe(stray), time.Since(cut).Round(time.Millisecond), err)
	}
	return back
}

// idleLine is the start of gorun's line for a spare lost while idle.
func idleLine(host string) string {
	return "gorun: fault-tolerant: spare host " + host + " lost while idle: "
}

// checkMoved checks the output of rank 1, which ran on from and then on
// to: its lines tagged with the host each process ran on, and one log
// (in dir) with the move's line between them.
func (j *ftHostJob) checkMoved(dir, from, to string) {
	t := j.t
	t.Helper()
	if !j.tagged(1, from, "step ") || !j.tagged(1, to, "step ") || j.tagged(1, from, "replica 1 incarnation 1") {
		t.Errorf("rank 1's lines are not tagged with the host each process ran on (%s, then %s):\n%s", from, to, j.stdout.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "rank.1.log"))
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	marker := fmt.Sprintf("--- gorun: rank 1 moves to spare host %s (host %s was lost) ---\n", to, from)
	before, after, ok := strings.Cut(log, marker)
	if !ok || !strings.Contains(before, "step 5 loss") || !strings.Contains(after, "step ") {
		t.Errorf("rank 1's log does not hold its steps on %s, the move line, then its steps on %s:\n%s", from, to, log)
	}
}

// TestFTHostWithFinishedRankRetired: hosts of 1, 2, 1 and 1 slots, -np 3:
// rank 0 on h1, ranks 1 and 2 on h2, h3 and h4 spares. h4's agent is
// killed while it waits: gorun drops it and says so, the job goes on. Rank
// 2 stops after 5 steps (exit 0); h2 is killed whole after step 10, with
// rank 1 running. Its host is not moved to the spare h3 left (that would
// start the finished rank 2 again): rank 1 is retired, the spare stays
// unused, and rank 0 trains to the end; gorun exits 0.
func TestFTHostWithFinishedRankRetired(t *testing.T) {
	h := requireHosts(t)
	victim, spare, killed := h.Hosts[1], h.Hosts[2], h.Hosts[3]
	hf := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(hf, []byte(fmt.Sprintf("%s slots=1\n%s slots=2\n%s slots=1\n%s slots=1\n", h.Hosts[0], victim, spare, killed)), 0o644); err != nil {
		t.Fatal(err)
	}
	j := newFTHostJob(t, h, hf, 3, []string{"-v", "--inject", "kill-host:host=" + victim + ":after-steps=10"}, []string{"--mode", "dp"})
	// Rank 2 trains 5 steps (the trainer's last --steps counts), the
	// others the test's.
	i := slices.Index(j.cmd.Args, "--fault-tolerant") // gorun's own flag comes first
	i = i + slices.Index(j.cmd.Args[i+1:], "--fault-tolerant")
	j.cmd.Args = slices.Insert(j.cmd.Args, i, "/bin/sh", "-c", `if [ "$GORUN_RANK" = 2 ]; then exec "$0" "$@" --steps 5; fi; exec "$0" "$@"`)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := false
	defer func() {
		if !ended { // a failure on the way: gorun goes too
			_ = j.cmd.Process.Kill()
			_ = j.cmd.Wait()
		}
	}()
	j.waitOutput(time.Minute, "lease of the spare "+killed, j.stderr.String, "spare host waits, holding a lease host="+killed)
	if err := syscall.Kill(agentPid(t, killed), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := j.wait()
	ended = true
	j.noSurvivors()
	j.parse()
	if code != 0 {
		t.Fatalf("gorun exited %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	j.survived([]int{0})
	if f := j.final[2]; f == nil || f[1] != "0" || f[2] != "5" {
		t.Errorf("rank 2 ended as %v, want its first process at step 5", f)
	}
	if j.final[1] != nil {
		t.Errorf("rank 1, lost with its host, finished: %v", j.final[1])
	}
	if strings.Contains(j.stdout.String(), ","+spare+"] ") {
		t.Errorf("a rank ran on the spare %s:\n%s", spare, j.stdout.String())
	}
	ft := j.spareReport().FaultTolerance
	if len(ft.LostHosts) != 1 || ft.LostHosts[0].Host != victim || !slices.Equal(ft.LostHosts[0].Ranks, []int{1}) ||
		!slices.Equal(ft.LostHosts[0].Retired, []int{1}) || ft.LostHosts[0].Spare != "" || ft.LostHosts[0].Action != "survivors continue" {
		t.Errorf("report's lost hosts: %+v, want %s with rank 1 retired and no spare", ft.LostHosts, victim)
	}
	if len(ft.Quorum.Heals) != 0 {
		t.Errorf("heals %+v, want none", ft.Quorum.Heals)
	}
	if len(ft.Failures) != 1 || ft.Failures[0].Rank != 1 || !strings.Contains(ft.Failures[0].Action, "1 of its host's 2 ranks had finished") {
		t.Errorf("report's failures: %+v, want rank 1 retired because rank 2 had finished", ft.Failures)
	}
	if ls := ft.LostSpares; len(ls) != 1 || ls[0].Host != killed || !strings.Contains(ls[0].Why, "connection to its agent closed") ||
		!slices.Equal(ls[0].SparesLeft, []string{spare}) {
		t.Errorf("report's lost spares: %+v, want %s (its agent killed), leaving %s", ls, killed, spare)
	}
	if line := "gorun: fault-tolerant: spare host " + killed + " lost while idle: the connection to its agent closed"; strings.Count(j.stderr.String(), line) != 1 {
		t.Errorf("stderr does not say once that %s was lost while idle:\n%s", killed, j.stderr.String())
	}
}
