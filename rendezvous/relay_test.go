package rendezvous

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// Every gossip member other than the seed is pushed to exactly once; up to
// 2·limit of them the seed pushes to all, above it to ⌈√n⌉ relays that
// push to their blocks, and nobody pushes to more than about √n.
func TestPushPlan(t *testing.T) {
	for _, limit := range []int{1, 2, 16} {
		for n := 0; n <= 300; n++ {
			others := make([]int, n)
			for i := range others {
				others[i] = 3 * (i + 1) // leader ranks: gaps, ascending
			}
			got := map[int]int{}
			most := 0
			for _, self := range append([]int{0}, others...) {
				to := pushPlan(self, others, limit)
				most = max(most, len(to))
				for _, r := range to {
					got[r]++
				}
				if self != 0 && len(to) > 0 && n <= 2*limit {
					t.Fatalf("limit %d, %d others: rank %d pushes %v in a direct world", limit, n, self, to)
				}
			}
			for _, r := range others {
				if got[r] != 1 {
					t.Fatalf("limit %d, %d others: rank %d pushed to %d times", limit, n, r, got[r])
				}
			}
			if len(got) != n {
				t.Fatalf("limit %d, %d others: pushes reach %d ranks", limit, n, len(got))
			}
			k := 1
			for k*k < n {
				k++
			}
			switch {
			case n <= 2*limit && len(pushPlan(0, others, limit)) != n:
				t.Fatalf("limit %d, %d others: the seed pushes to %d, want all", limit, n, len(pushPlan(0, others, limit)))
			case n > 2*limit && (len(pushPlan(0, others, limit)) != k || most > k):
				t.Fatalf("limit %d, %d others: the seed pushes to %d, a member at most to %d; want %d",
					limit, n, len(pushPlan(0, others, limit)), most, k)
			}
		}
	}
	// 1,000 hosts: the seed pushes to 32 relays, each to 31 (the last to
	// the 6 left).
	others := make([]int, 999)
	for i := range others {
		others[i] = 8 * (i + 1)
	}
	if got := pushPlan(0, others, 16); !slices.Equal(got, others[:32]) {
		t.Errorf("1,000 hosts: the seed pushes to %v", got)
	}
	if got := pushPlan(others[0], others, 16); !slices.Equal(got, others[32:63]) {
		t.Errorf("1,000 hosts: the first relay pushes to %v", got)
	}
	if got := pushPlan(others[31], others, 16); !slices.Equal(got, others[32+31*31:]) {
		t.Errorf("1,000 hosts: the last relay pushes to %v", got)
	}
}

// pushLog records the pushes of the member table (Config.pushHook).
type pushLog struct {
	mu     sync.Mutex
	pushes map[int][]int // from → to, in order
	first  time.Time     // the seed's first push: when it formed
	skip   int           // this rank's pushes are lost (-1: none)
}

func newPushLog() *pushLog { return &pushLog{pushes: map[int][]int{}, skip: -1} }

func (p *pushLog) hook(from, to int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if from == 0 && p.first.IsZero() {
		p.first = time.Now()
	}
	if from == p.skip {
		return false
	}
	p.pushes[from] = append(p.pushes[from], to)
	return true
}

// quietPush makes a world form by push-pulls alone: gossip and probes (on
// which memberlist piggybacks its alive messages) are rarer than the test,
// so a rank forms by the seed's or a relay's push, or its own pull.
func quietPush(l *pushLog) func(*Config) {
	return func(c *Config) {
		c.PushConcurrency = 2
		c.GossipInterval = time.Minute
		c.ProbeInterval = time.Minute
		c.pushHook = l.hook
	}
}

// seedFormed is when the seed formed (its first push); zero before.
func (p *pushLog) seedFormed() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

// quietFlat is the configs of a flat world of n ranks on one in-memory
// network, each forming by push-pulls recorded in l (quietPush).
func quietFlat(t *testing.T, l *pushLog, n int) []Config {
	nw := &rendezvoustest.Network{}
	cfgs := make([]Config, n)
	for r := range cfgs {
		cfgs[r] = memConfig(t, nw, "job1", r, n)
		quietPush(l)(&cfgs[r])
	}
	return cfgs
}

// allButSeed is ranks 1..n-1, the gossip members besides the seed of a
// flat world of n.
func allButSeed(n int) []int {
	others := make([]int, 0, n-1)
	for r := 1; r < n; r++ {
		others = append(others, r)
	}
	return others
}

// joinTimed joins every config concurrently and returns the worlds, the
// errors and when each Join returned.
func joinTimed(cfgs []Config) ([]*World, []error, []time.Time) {
	ws := make([]*World, len(cfgs))
	errs := make([]error, len(cfgs))
	at := make([]time.Time, len(cfgs))
	var wg sync.WaitGroup
	for i, c := range cfgs {
		wg.Go(func() {
			ws[i], errs[i] = Join(context.Background(), c)
			at[i] = time.Now()
		})
	}
	wg.Wait()
	return ws, errs, at
}

// formTimed is joinTimed that fails the test unless every Join succeeds.
func formTimed(t *testing.T, cfgs []Config) ([]*World, []time.Time) {
	t.Helper()
	ws, errs, at := joinTimed(cfgs)
	for r, err := range errs {
		if err != nil {
			closeAll(ws)
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	return ws, at
}

// checkRelayed checks that the pushes logged are pushPlan's for the gossip
// members others (PushConcurrency 2: relayed above 4), and that every rank formed right after the seed, before
// any rank's first pull (RejoinInterval): by the pushes, through relays.
func checkRelayed(t *testing.T, l *pushLog, others []int, at []time.Time, rejoin time.Duration) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, self := range append([]int{0}, others...) {
		want := pushPlan(self, others, 2)
		if got := l.pushes[self]; !slices.Equal(sortedInts(got), want) {
			t.Errorf("rank %d pushed to %v, want %v", self, got, want)
		}
	}
	if k := len(l.pushes[0]); len(others) > 4 && (k*k < len(others) || (k-1)*(k-1) >= len(others)) {
		t.Errorf("the seed pushed to %d of %d gossip members, want ⌈√%d⌉", k, len(others), len(others))
	}
	for r, a := range at {
		if d := a.Sub(l.first); d > rejoin/2 {
			t.Errorf("rank %d formed %v after the seed, not by a push", r, d)
		}
	}
}

// A flat world of 40 forms by relayed pushes: the seed pushes to 7 relays,
// each relay to its block of 5 (fake clock).
func TestRelayedPushFlat(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const n = 40
		l := newPushLog()
		cfgs := quietFlat(t, l, n)
		ws, at := formTimed(t, cfgs)
		defer closeAll(ws)
		time.Sleep(100 * time.Millisecond) // the relays' pushes done
		checkRelayed(t, l, allButSeed(n), at, cfgs[0].RejoinInterval)
	})
}

// With host leaders (20 hosts × 3) the relays are leaders and every rank,
// attached ones included, forms by the relayed pushes.
func TestRelayedPushHier(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const hosts, per = 20, 3
		l := newPushLog()
		hn := newHierNet(per)
		cfgs := make([]Config, hosts*per)
		var others []int
		for r := range cfgs {
			cfgs[r] = hn.config(t, "job1", r, hosts*per)
			quietPush(l)(&cfgs[r])
			if r > 0 && r%per == 0 {
				others = append(others, r)
			}
		}
		ws, at := formTimed(t, cfgs)
		defer closeAll(ws)
		time.Sleep(100 * time.Millisecond)
		checkRelayed(t, l, others, at, cfgs[0].RejoinInterval)
		for r, w := range ws {
			if w.Alive() != hosts*per {
				t.Errorf("rank %d: %d alive", r, w.Alive())
			}
		}
	})
}

// A relay that dies before relaying (its pushes are all lost) delays only
// its block, and by at most 3 RejoinInterval after the seed formed (form's
// pulls): the world forms all the same (fake clock).
func TestRelayThatNeverPushes(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const n = 40
		l := newPushLog()
		others := allButSeed(n)
		l.skip = pushPlan(0, others, 2)[2]
		block := pushPlan(l.skip, others, 2)
		if len(block) == 0 {
			t.Fatalf("relay %d has no block", l.skip)
		}
		cfgs := quietFlat(t, l, n)
		ws, at := formTimed(t, cfgs)
		defer closeAll(ws)
		rejoin := cfgs[0].RejoinInterval
		seed := l.seedFormed()
		latest := time.Duration(0)
		for _, r := range block {
			d := at[r].Sub(seed)
			latest = max(latest, d)
			if d > 3*rejoin+100*time.Millisecond {
				t.Errorf("rank %d (block of dead relay %d) formed %v after the seed, want ≤ 3×%v", r, l.skip, d, rejoin)
			}
		}
		t.Logf("the dead relay's block %v formed up to %v after the seed", block, latest)
		if latest < rejoin/2 {
			t.Errorf("the dead relay's block formed within %v, before any pull: were its pushes lost?", latest)
		}
	})
}

// newHierNet is a fresh in-memory job with host leaders.
func newHierNet(per int) *hierNet {
	return &hierNet{nw: &rendezvoustest.Network{}, attach: &rendezvoustest.AttachNet{}, per: per}
}

// A world of up to 2·PushConcurrency gossip members besides the seed keeps
// the direct push: the seed pushes to all of them, nobody relays.
func TestDirectPushSmallWorld(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const n = 5 // 4 others = 2·PushConcurrency
		l := newPushLog()
		cfgs := quietFlat(t, l, n)
		ws, at := formTimed(t, cfgs)
		defer closeAll(ws)
		time.Sleep(100 * time.Millisecond)
		checkRelayed(t, l, allButSeed(n), at, cfgs[0].RejoinInterval)
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.pushes) != 1 || len(l.pushes[0]) != n-1 {
			t.Errorf("pushes %v, want the seed's to all %d others only", l.pushes, n-1)
		}
	})
}

// A relay whose process exits right after it formed, before relaying (its
// address refuses from then on), never stalls the world: every other rank
// forms within 3 RejoinInterval of the seed, or, if one of its pulls went
// to the dead relay, fails as fast with an error naming it (fake clock).
func TestRelayCrashedBeforeRelaying(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const n = 40
		victim := pushPlan(0, allButSeed(n), 2)[4]
		l := newPushLog()
		l.skip = victim
		cfgs := quietFlat(t, l, n)
		tr := cfgs[victim].Transport.(*rendezvoustest.Transport)
		var once sync.Once
		cfgs[victim].pushHook = func(from, to int) bool {
			once.Do(func() { _ = tr.Shutdown() })
			return l.hook(from, to)
		}
		ws, errs, at := joinTimed(cfgs)
		defer closeAll(ws)
		if errs[victim] != nil {
			t.Fatalf("the relay did not form before it died: %v", errs[victim])
		}
		seed := l.seedFormed()
		rejoin := cfgs[0].RejoinInterval
		formed, failed := 0, 0
		for r, err := range errs {
			if d := at[r].Sub(seed); d > 3*rejoin+100*time.Millisecond {
				t.Errorf("rank %d: Join returned %v after the seed formed (err %v), want ≤ 3×%v", r, d, err, rejoin)
			}
			var le *LostError
			switch {
			case err == nil:
				formed++
			case errors.As(err, &le) && le.Rank == victim:
				failed++
			default:
				t.Errorf("rank %d: %v, want formation or the dead relay %d named", r, err, victim)
			}
		}
		t.Logf("relay %d dead: %d ranks formed, %d failed naming it", victim, formed, failed)
	})
}
