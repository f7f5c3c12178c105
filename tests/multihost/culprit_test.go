package multihost

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
)

// The culprit, named right, across hosts: 4 namespace hosts with
// 2 ranks each run all-reduces through gorun's runtime (so the survivors
// report themselves collateral); a fault hits one rank, one host, or the
// link between two hosts. The final line and exit code must name the
// cause, the --report's causal record say the same, and nothing of the
// job may be left on any host, in /dev/shm or in the temp directory.

// reportCause is the part of --report's causal record the tests check.
type reportCause struct {
	Kind            string   `json:"kind"`
	Rank            int      `json:"rank"`
	Host            string   `json:"host"`
	PID             int      `json:"pid"`
	Ranks           int      `json:"ranks"`
	State           string   `json:"state"`
	ExitCode        int      `json:"exit_code"`
	DetectedAt      *float64 `json:"detected_at_s"`
	ReporterHost    string   `json:"reporter_host"`
	CollateralRanks []int    `json:"collateral_ranks"`
}

func readCause(t *testing.T, path string) *reportCause {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Cause *reportCause `json:"cause"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if rep.Cause == nil {
		t.Fatalf("report has no cause:\n%s", b)
	}
	return rep.Cause
}

// leftoverNames lists the shared-memory segments gorun's data plane
// creates (/dev/shm/gorun-*), to compare before and after a job, and
// everything in the job's private temp directory.
func leftoverNames(tmp string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/dev/shm")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "gorun") {
			out[filepath.Join("/dev/shm", e.Name())] = true
		}
	}
	ents, _ = os.ReadDir(tmp)
	for _, e := range ents {
		out[filepath.Join(tmp, e.Name())] = true
	}
	return out
}

// noLeftovers fails the test if a segment that was not there before the
// job, or anything in its temp directory, is still there (after a short
// grace: segments of other jobs on a shared machine come and go within
// milliseconds). The hosts share this machine's file systems, so
// /dev/shm covers every host; the temp directory is gorun's own (TMPDIR),
// where it keeps the ranks' flight records.
func noLeftovers(t *testing.T, tmp string, before map[string]bool) {
	t.Helper()
	var left []string
	ok := launchertest.WaitFor(5*time.Second, func() bool {
		left = left[:0]
		for name := range leftoverNames(tmp) {
			if !before[name] {
				left = append(left, name)
			}
		}
		return len(left) == 0
	})
	if !ok {
		t.Errorf("left behind: %v", left)
	}
}

// startAllReduce starts 2 all-reducing ranks on each host with a report,
// and waits until each has finished one all-reduce. It returns the job,
// the report's path and each rank's pid.
func startAllReduce(t *testing.T, args ...string) (*job, string, map[int]int) {
	t.Helper()
	h := requireHosts(t)
	report := filepath.Join(t.TempDir(), "report.json")
	j := newJob(t, h, 2, "allreduce", nil, append([]string{"--tag-output", "--report", report}, args...)...)
	j.tmp = t.TempDir()
	j.cmd.Env = append(os.Environ(), "TMPDIR="+j.tmp)
	j.before = leftoverNames(j.tmp)
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := 2 * len(h.Hosts)
	waitReady(t, j, n)
	pids := map[int]int{}
	for _, m := range regexp.MustCompile(`ready (\d+) (\d+)`).FindAllStringSubmatch(j.stdout.String(), -1) {
		r, _ := strconv.Atoi(m[1])
		pids[r], _ = strconv.Atoi(m[2])
	}
	if len(pids) != n {
		t.Fatalf("ready lines for %d ranks:\n%s", len(pids), j.stdout.String())
	}
	return j, report, pids
}

// A rank frozen on another host (rank 5: attached to rank 4, the leader of
// host 3): its leader's lease names it, the survivors report it, its
// supervisor sees it stopped, and gorun's line says frozen.
func TestFrozenRankAcrossHosts(t *testing.T) {
	j, report, pids := startAllReduce(t)
	victim, host := 5, j.h.Hosts[2]
	frozen := time.Now()
	if err := syscall.Kill(pids[victim], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	code := j.wait()
	took := time.Since(frozen)
	want := fmt.Sprintf("gorun: rank %d (host %s, pid %d) was frozen (process state T", victim, host, pids[victim])
	if code != 6 || !strings.Contains(j.stderr.String(), want) {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 6 (the survivors') and %q", code, j.stderr.String(), want)
	}
	c := readCause(t, report)
	if c.Kind != "frozen" || c.Rank != victim || c.Host != host || c.PID != pids[victim] || c.State != "T" || len(c.CollateralRanks) == 0 {
		t.Errorf("report cause %+v", c)
	}
	t.Logf("SIGSTOP of rank %d on %s → gorun exited after %v", victim, host, took)
	j.noSurvivors()
	noLeftovers(t, j.tmp, j.before)
}

// A blackholed host (every packet to and from it dropped; its link stays
// up): gorun names the host lost with exit 255, not a healthy rank whose
// runtime gave up on it first with exit 6.
func TestBlackholedHost(t *testing.T) {
	j, report, _ := startAllReduce(t)
	victim := j.h.Hosts[1]
	if err := j.h.Blackhole(victim); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := j.h.Unblock(victim); err != nil {
			t.Error(err)
		}
	}()
	code := j.wait()
	if code != 255 || !strings.Contains(j.stderr.String(), "gorun: lost host "+victim+": ") {
		t.Errorf("exit %d, stderr:\n%s\nwant 255 and host %s lost", code, j.stderr.String(), victim)
	}
	c := readCause(t, report)
	if c.Kind != "host lost" || c.Host != victim || c.Rank != 2 || c.Ranks != 2 || c.ExitCode != 255 {
		t.Errorf("report cause %+v", c)
	}
	j.noSurvivors()
	noLeftovers(t, j.tmp, j.before)
}

// The link between two hosts cut (both still reach gorun and the other
// hosts): no process failed, and the line must say that the ranks of the
// two hosts lost each other, not blame one healthy rank.
func TestPartitionBetweenHosts(t *testing.T) {
	// A 4 s user timeout instead of the default 10 s keeps make test short.
	j, report, _ := startAllReduce(t, "-x", "GORUN_TCP_USER_TIMEOUT=4s")
	a, b := j.h.Hosts[1], j.h.Hosts[2]
	if err := j.h.Partition(a, b); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := j.h.Unblock(a); err != nil {
			t.Error(err)
		}
	}()
	cut := time.Now()
	code := j.wait()
	took := time.Since(cut)
	line := regexp.MustCompile(`gorun: the network between host (\S+) and host (\S+) failed: `).FindStringSubmatch(j.stderr.String())
	if code != 255 || line == nil || !(line[1] == a && line[2] == b || line[1] == b && line[2] == a) {
		t.Errorf("exit %d, stderr:\n%s\nwant 255 and the network between %s and %s named", code, j.stderr.String(), a, b)
	}
	c := readCause(t, report)
	if c.Kind != "link lost" || !(c.Host == a && c.ReporterHost == b || c.Host == b && c.ReporterHost == a) || c.ExitCode != 255 {
		t.Errorf("report cause %+v", c)
	}
	t.Logf("partition %s | %s → gorun exited after %v", a, b, took)
	j.noSurvivors()
	noLeftovers(t, j.tmp, j.before)
}
