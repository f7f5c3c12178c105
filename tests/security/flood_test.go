package security

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The second user on each job host shares the address that host's ranks
// connect from, and floods the ports of the other host's ranks that those
// ranks must reach while a real job forms: the seed's gossip port (the
// first host's leader) while the second host joins, with more connections
// than its bound, and every rank's data port while the all-reduce
// connects, with more than a source's share. Each flood redials every
// connection the rank closes. The launch and the all-reduce must succeed
// every time and be at most about a second slower than without the
// floods, and the ranks' descriptors stay bounded.
func TestRankPortsFloodFromAJobHost(t *testing.T) {
	h := requireHosts(t)
	// The second host's agent starts 2 s after the first's, so the
	// gossip flood is in place when its leader joins.
	template := fmt.Sprintf(`--launch-agent=sh -c 'sleep 0.5; case "$*" in *%s*) sleep 2;; esac; exec "$0" "$@"' %s`,
		h.Hosts[1], strings.Join(h.SSHArgs(), " "))
	hostsArg := h.Hosts[0] + ":2," + h.Hosts[1] + ":2"
	type times struct {
		formed, reduced time.Duration
		weak            []string // floods that made fewer than 1000 connections
	}
	launch := func(flood bool) times {
		t.Helper()
		start := time.Now()
		j := startJob(t, template, "-H", hostsArg)
		var gossip func() string
		if flood {
			seed := j.seed()
			gossip = attack(t, h.Hosts[1], "churn", seed, "2000", "8s")
		}
		addrs, pids := j.ready(4)
		formed := time.Since(start)
		var data []func() string
		if flood {
			// Each host's outsider floods the other host's ranks.
			for r, addr := range addrs {
				data = append(data, attack(t, h.Hosts[1-r/2], "churn", addr, "300", "8s"))
			}
			time.Sleep(time.Second) // the floods are dialed
			// Rank 0, the seed, also holds the gossip flood's streams.
			checkBounded(t, "rank", pids[1:])
			if n := fds(pids[0]); n > maxGossipFDs {
				t.Errorf("the seed (rank 0, pid %d) holds %d descriptors under the floods, want ≤ %d", pids[0], n, maxGossipFDs)
			}
		}
		t0 := time.Now()
		j.finish(4)
		reduced := time.Since(t0)
		var weak []string
		if flood {
			for _, out := range append(data, gossip) {
				o := out()
				if !regexp.MustCompile(`dials=[1-9]\d{3,}`).MatchString(o) {
					weak = append(weak, strings.TrimSpace(o))
				}
				t.Log(strings.TrimSpace(o))
			}
		}
		return times{formed, reduced, weak}
	}
	clean := launch(false)
	best := times{formed: 1 << 62, reduced: 1 << 62}
	var formed, reduced []time.Duration
	var weak []string
	// A flood redials only while its rank lives and closes its
	// connections, both slower on a loaded machine (one data-port flood
	// made 718 beside a load of 20, the others about 1,050): a run with a
	// flood under 1,000 connections shows nothing about the delay it would
	// cause, and is not counted; another run takes its place, up to twice
	// the runs asked for.
	for i := 0; len(formed) < floodRuns() && i < 2*floodRuns(); i++ {
		if i > 0 && measuring() {
			clean = launch(false) // each flooded launch beside its own anchor
		}
		f := launch(true)
		t.Logf("run %d: formed in %v (clean %v), all-reduce in %v (clean %v)", i+1, f.formed, clean.formed, f.reduced, clean.reduced)
		if len(f.weak) > 0 {
			t.Logf("run %d not counted: a flood made fewer than 1000 connections: %v", i+1, f.weak)
			weak = append(weak, f.weak...)
			continue
		}
		best.formed = min(best.formed, f.formed-clean.formed)
		best.reduced = min(best.reduced, f.reduced-clean.reduced)
		formed, reduced = append(formed, f.formed-clean.formed), append(reduced, f.reduced-clean.reduced)
	}
	if len(formed) == 0 {
		t.Fatalf("no flooded run had every flood at 1000 connections or more: %v", weak)
	}
	t.Logf("rank-port floods: median delay of the formation %v, of the all-reduce %v, over %d runs", median(formed), median(reduced), len(formed))
	// What this guards: the floods never keep the job waiting for them
	// to end. With refusing gates they kept the second host's members out
	// of the seed and its ranks out of the first host's data ports until
	// they ended, 5-8 s later. Measured here the delays are 0.2-1.3 s on a
	// quiet 2-core machine; but the floods run on the job's own two cores,
	// and beside other load (20-30) the better of two runs read 1.5-1.6 s.
	// So the better run is held to 3 s: far below the wait for a flood's
	// end, above what sharing the cores with the floods costs.
	if best.formed > 3*time.Second {
		t.Errorf("the gossip flood delayed the formation by %v at best of %d runs (clean %v)", best.formed, len(formed), clean.formed)
	}
	if best.reduced > 3*time.Second {
		t.Errorf("the data-port floods delayed the all-reduce by %v at best of %d runs (clean %v)", best.reduced, len(reduced), clean.reduced)
	}
}

// floodRuns is how many flooded launches a flood test makes: 2, or
// GORUN_SECURITY_FLOOD_RUNS to measure (scripts/flood-delays.sh).
func floodRuns() int {
	if n, err := strconv.Atoi(os.Getenv("GORUN_SECURITY_FLOOD_RUNS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// measuring: GORUN_SECURITY_FLOOD_RUNS is set, and every flooded launch
// gets a clean one just before it as its anchor.
func measuring() bool { return os.Getenv("GORUN_SECURITY_FLOOD_RUNS") != "" }

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// seed waits for a rank of this job to start and returns the rendezvous
// endpoint in its environment (the first host leader's gossip port); an
// outsider finds it with a port scan, the test more simply as root.
func (j *job) seed() string {
	j.t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			if err != nil {
				continue
			}
			env := map[string]string{}
			for _, kv := range strings.Split(string(b), "\x00") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					env[k] = v
				}
			}
			if env[goFileEnv] == j.goFile && env["GORUN_RDZV_ENDPOINT"] != "" {
				return env["GORUN_RDZV_ENDPOINT"]
			}
		}
	}
	j.t.Fatalf("no rank of the job started within 30 s\nstderr:\n%s", j.stderr.String())
	return ""
}
