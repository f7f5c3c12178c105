package multihost

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// An injected kill-host takes a host down whole — its ranks and its host
// agent — so gorun sees the host lost; with a restart left the job starts a
// new world on every host (its agent is started anew) and completes.
// Nothing of either world survives on any host.
func TestInjectKillHostRestarts(t *testing.T) {
	h := requireHosts(t)
	victim := h.Hosts[2]
	report := filepath.Join(t.TempDir(), "report.json")
	// After step 1 (the first all-reduce every rank joined), not at a
	// time: on a loaded machine world 0 may not be up by any fixed time.
	j := newJob(t, h, 2, "restart-aware:allreduce", nil, "--tag-output",
		"--inject", "kill-host:host="+victim+":after-steps=1", "--max-restarts", "1", "--report", report)
	if code := j.run(); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.stdout.String(), j.stderr.String())
	}
	j.noSurvivors()
	// Every rank ran in both worlds.
	worlds := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\[\d+,[^\]]+\] world (\d) `).FindAllStringSubmatch(j.stdout.String(), -1) {
		worlds[m[1]]++
	}
	if worlds["0"] != 2*len(h.Hosts) || worlds["1"] != 2*len(h.Hosts) {
		t.Errorf("ranks per world %v, want %d in each\n%s", worlds, 2*len(h.Hosts), j.stdout.String())
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Restarts int `json:"restarts"`
		Worlds   []struct {
			Result string `json:"result"`
		} `json:"worlds"`
		Faults []struct {
			Ranks      []int  `json:"ranks"`
			Host       string `json:"host"`
			DetectedBy string `json:"detected_by"`
			Action     string `json:"action"`
		} `json:"faults"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Restarts != 1 || len(rep.Faults) != 1 || len(rep.Worlds) != 2 {
		t.Fatalf("report:\n%s", b)
	}
	f := rep.Faults[0]
	// Detected by the host's loss, or by a rank of another host that
	// failed first because of it: one that lost rank 4 or 5 itself, or
	// one that a peer's abort reached (1 in 25 runs alone: rank 7 after
	// rank 6's, which had lost rank 5).
	detected := regexp.MustCompile(`^host of ranks 4-5 lost|^rank \d+ exited with code \d+ after (its runtime lost rank [45]$|rank \d+'s abort reached its runtime$)`)
	if f.Host != victim || len(f.Ranks) != 2 || f.Ranks[0] != 4 || f.Action != "restarted" || !detected.MatchString(f.DetectedBy) {
		t.Errorf("fault: %+v\nstderr:\n%s", f, j.stderr.String())
	}
	if !strings.Contains(rep.Worlds[0].Result, "lost host "+victim) {
		t.Errorf("world 0 ended with %q, want host %s lost", rep.Worlds[0].Result, victim)
	}
}
