package rendezvous

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Scale runs use synctest's fake clock over the in-memory network: time moves
// only when every member is idle, so CPU contention between hundreds of
// members sharing two cores never turns into missed probes. What is measured
// is the protocol's latency with each member on its own host, which is the
// situation the numbers are for. (bench/rdzvscale measures the same on the
// real clock, where one process's members compete for the cores.)

type scaleResult struct {
	formation            time.Duration // fake time until every Join returned
	detectMin, detectMax time.Duration // fake time from the cut to each survivor's Failed
	wall                 time.Duration // real time for the whole run
}

// A fault a scale run applies to its victim.
type scaleFault int

const (
	faultCrash scaleFault = iota // the victim's process is gone: refused
	faultCut                     // the victim's host is cut off: silence
)

// bound is the longest detection a fault may take at scale: a crash is
// proved by a refused connection and told to everyone at once; silence
// waits the lease (GossipLease, 4 s), counted from the suspicion, which
// starts when the first member's probe round reaches the silent one. With
// tens of members probing that is early, but each probe interval later is
// a few times rarer: 60 runs of the cut at 256 and 64x16 ranks took
// 4.13-4.75 s, and one CI run 5.13 s (stop 24). A lease counted from
// memberlist's death verdict would take 6.1 s and more.
func (f scaleFault) bound() time.Duration {
	if f == faultCrash {
		return 2 * time.Second
	}
	c := DefaultConfig()
	return c.GossipLease + 9*c.ProbeInterval
}

// runScale forms a world of n members, crashes one or cuts it off, and
// measures.
func runScale(t *testing.T, n int, fault scaleFault) scaleResult {
	var res scaleResult
	wallStart := time.Now()
	bubble(t, func(t *testing.T) {
		start := time.Now()
		ws, nw := formMem(t, n, func(c *Config) {
			c.FormationTimeout = 60 * time.Second
			c.Host = fmt.Sprintf("h%d", c.Rank)
		})
		defer func() {
			// Shut down without leaving: 256 simultaneous leaves are a
			// gossip storm that costs more real time than the rest of
			// the test, and leaving is covered elsewhere.
			for _, w := range ws {
				crash(w)
			}
		}()
		res.formation = time.Since(start)
		time.Sleep(500 * time.Millisecond) // the seed's pushes and first probes done
		victim := n / 2
		cut := time.Now()
		if fault == faultCrash {
			crash(ws[victim])
		} else {
			nw.Isolate(memAddr(victim))
		}
		measureDetection(t, ws, victim, cut, &res, func(r int) bool { return r == victim })
	})
	res.wall = time.Since(wallStart)
	return res
}

// A 256-member world forms; a crashed member is seen by every other member
// within 2 s, one cut off within its lease and not before it, with no false
// reports. Under the race detector it runs with 64 members (256 take three
// minutes there, over the package budget).
func TestScale256(t *testing.T) {
	if testing.Short() {
		t.Skip("256 members")
	}
	n := 256
	if raceEnabled {
		n = 64
	}
	for _, f := range []scaleFault{faultCrash, faultCut} {
		res := runScale(t, n, f)
		t.Logf("%d members, %s: formation %v, detection %v..%v (fake clock); %v real", n, f, res.formation, res.detectMin, res.detectMax, res.wall)
		res.check(t, f)
	}
}

func (f scaleFault) String() string {
	if f == faultCrash {
		return "crash"
	}
	return "cut"
}

// check applies the bounds: formation within 2 s, detection within the
// fault's bound and, for silence, not before the lease less a probe round.
func (res scaleResult) check(t *testing.T, f scaleFault) {
	t.Helper()
	if res.formation > 2*time.Second {
		t.Errorf("%s: formation took %v", f, res.formation)
	}
	if res.detectMax > f.bound() {
		t.Errorf("%s: detection took up to %v, want at most %v", f, res.detectMax, f.bound())
	}
	if lease := DefaultConfig().GossipLease; f == faultCut && res.detectMin < lease-500*time.Millisecond {
		t.Errorf("%s: a member lost the cut-off one after %v, before its lease (%v)", f, res.detectMin, lease)
	}
}

// TestScaleTable prints the scale table for GORUN_RDZV_SCALE=64,256,1024.
func TestScaleTable(t *testing.T) {
	sizes := os.Getenv("GORUN_RDZV_SCALE")
	if sizes == "" {
		t.Skip("set GORUN_RDZV_SCALE=64,256,1024 to run")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-6s %-6s %12s %12s %12s %10s\n", "size", "fault", "formation", "detect-min", "detect-max", "real")
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []scaleFault{faultCrash, faultCut} {
			r := runScale(t, n, f)
			fmt.Fprintf(&b, "%-6d %-6s %11.3fs %11.3fs %11.3fs %9.1fs\n", n, f, r.formation.Seconds(), r.detectMin.Seconds(), r.detectMax.Seconds(), r.wall.Seconds())
		}
	}
	t.Log(b.String())
}

// runScaleHier forms hosts × per ranks with host leaders, crashes one
// leader or cuts it off, and measures formation and how long the other
// hosts' ranks take to see it.
func runScaleHier(t *testing.T, hosts, per int, fault scaleFault) scaleResult {
	var res scaleResult
	wallStart := time.Now()
	bubble(t, func(t *testing.T) {
		start := time.Now()
		ws, hn := formHier(t, hosts, per, func(c *Config) { c.FormationTimeout = 60 * time.Second })
		defer func() {
			for _, w := range ws {
				crash(w)
			}
		}()
		res.formation = time.Since(start)
		time.Sleep(500 * time.Millisecond)
		victim := hosts / 2 * per
		cut := time.Now()
		if fault == faultCrash {
			crash(ws[victim])
		} else {
			hn.nw.Isolate(memAddr(victim))
		}
		measureDetection(t, ws, victim, cut, &res, func(r int) bool { return r/per == victim/per })
	})
	res.wall = time.Since(wallStart)
	return res
}

// 1024 ranks as 64 hosts of 16 form within 2 s and lose a crashed leader
// within 2 s, a cut-off one within its lease (fake clock). Under the race
// detector: 16 hosts of 16.
func TestScaleHier1024(t *testing.T) {
	if testing.Short() {
		t.Skip("1024 members")
	}
	hosts, per := 64, 16
	if raceEnabled {
		hosts = 16
	}
	for _, f := range []scaleFault{faultCrash, faultCut} {
		res := runScaleHier(t, hosts, per, f)
		t.Logf("%dx%d ranks, %s: formation %v, host loss seen in %v..%v (fake clock); %v real", hosts, per, f, res.formation, res.detectMin, res.detectMax, res.wall)
		res.check(t, f)
	}
}

// measureDetection waits for every rank not skipped to report the loss of
// victim, recording the earliest and latest detection since cut; a report
// naming another rank is a false loss.
func measureDetection(t *testing.T, ws []*World, victim int, cut time.Time, res *scaleResult, skip func(r int) bool) {
	t.Helper()
	res.detectMin = time.Hour
	for r, w := range ws {
		if skip(r) {
			continue
		}
		select {
		case <-w.Failed():
		case <-time.After(30 * time.Second):
			t.Fatalf("rank %d did not see the loss within 30 s", r)
		}
		d := time.Since(cut)
		res.detectMin, res.detectMax = min(res.detectMin, d), max(res.detectMax, d)
		var le *LostError
		if !errors.As(w.Err(), &le) || le.Rank != victim {
			t.Errorf("rank %d: false loss: %v", r, w.Err())
		}
	}
}
