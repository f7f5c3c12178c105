package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// hierNet is one in-memory job with host leaders: gossip between hosts,
// attach streams inside them.
type hierNet struct {
	nw     *rendezvoustest.Network
	attach *rendezvoustest.AttachNet
	per    int
}

// hierConfig is rank r of size with per ranks on each host "h<r/per>";
// leaders get a gossip transport at memAddr(r).
func (hn *hierNet) config(t testing.TB, job string, r, size int) Config {
	t.Helper()
	var c Config
	if r%hn.per == 0 {
		c = memConfig(t, hn.nw, job, r, size)
	} else {
		c = memConfigOn(t, nil, job, r, size)
		c.Transport = nil
	}
	c.LocalRank, c.LocalWorldSize = r%hn.per, hn.per
	c.Host = fmt.Sprintf("h%d", r/hn.per)
	c.AttachNet = hn.attach
	return c
}

// formHier forms a world of hosts × per ranks.
func formHier(t testing.TB, hosts, per int, tweak func(*Config)) ([]*World, *hierNet) {
	t.Helper()
	hn := &hierNet{nw: &rendezvoustest.Network{}, attach: &rendezvoustest.AttachNet{}, per: per}
	n := hosts * per
	cfgs := make([]Config, n)
	for r := range cfgs {
		cfgs[r] = hn.config(t, "job1", r, n)
		if tweak != nil {
			tweak(&cfgs[r])
		}
	}
	ws, errs := joinAll(context.Background(), cfgs)
	for r, err := range errs {
		if err != nil {
			closeAll(ws)
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	return ws, hn
}

// With host leaders every rank sees the same world as in flat mode: all
// ranks, hosts, data addresses, epoch 1; barriers, splits and groups work
// across and inside hosts; closing is not a failure.
func TestHierFormBarrierGroups(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const hosts, per = 4, 4
		const n = hosts * per
		ws, _ := formHier(t, hosts, per, nil)
		defer closeAll(ws)
		for r, w := range ws {
			if w.Rank() != r || w.Size() != n || w.Epoch() != 1 || w.Alive() != n {
				t.Fatalf("rank %d: Rank %d Size %d Epoch %d Alive %d", r, w.Rank(), w.Size(), w.Epoch(), w.Alive())
			}
			for p := range n {
				if got, want := w.Host(p), fmt.Sprintf("h%d", p/per); got != want {
					t.Errorf("rank %d: Host(%d) = %q, want %q", r, p, got, want)
				}
				if got, want := w.DataAddr(p), fmt.Sprintf("data-%d:1", p); got != want {
					t.Errorf("rank %d: DataAddr(%d) = %q, want %q", r, p, got, want)
				}
			}
		}
		ctx := context.Background()
		eachRank(t, ws, func(w *World) error {
			if _, err := barriersAndSplit(ctx, w, n); err != nil {
				return err
			}
			// One host's ranks alone: messages never leave the host.
			hg, err := w.Group(hostRanks(w.Rank() / 4))
			if err != nil {
				return err
			}
			return hg.Barrier(ctx)
		})
	})
}

// An attached rank that dies (its stream closes without a goodbye) is
// reported by every other rank, on every host, within 2 s, naming rank and
// host; the epoch increases and a blocked barrier is released.
func TestHierAttachedRankLost(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const victim = 6
		ws, _ := formHier(t, 4, 4, nil)
		defer closeAll(ws)
		barrierErr := make([]error, len(ws))
		var wg sync.WaitGroup
		for r, w := range ws {
			if r != victim {
				wg.Go(func() { barrierErr[r] = w.Barrier(context.Background()) })
			}
		}
		synctest.Wait()
		crashed := time.Now()
		crash(ws[victim])
		awaitLost(t, ws, victim, "h1", crashed, func(r int, w *World, le *LostError) {
			if !errors.Is(le, ErrAttachClosed) {
				t.Fatalf("rank %d: Err = %v", r, w.Err())
			}
			if w.Epoch() != 2 {
				t.Errorf("rank %d: epoch %d", r, w.Epoch())
			}
			if ev := <-w.Events(); ev.Kind != MemberLost || ev.Rank != victim || ev.Epoch != 2 {
				t.Errorf("rank %d: event %+v", r, ev)
			}
		})
		wg.Wait()
		for r, err := range barrierErr {
			if r != victim && !errors.Is(err, ErrLost) {
				t.Errorf("rank %d: barrier %v", r, err)
			}
		}
		ws[victim] = nil
	})
}

// A leader that dies loses its whole host: its attached ranks fail naming
// it, every other host reports the leader and each of its ranks lost.
func TestHierLeaderLost(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const leader = 4 // host h1: ranks 4..7
		ws, _ := formHier(t, 4, 4, nil)
		defer closeAll(ws)
		crashed := time.Now()
		crash(ws[leader])
		awaitLost(t, ws, leader, "h1", crashed, func(r int, w *World, le *LostError) {
			if r/4 == 1 {
				if !errors.Is(le, ErrLeaderClosed) {
					t.Errorf("rank %d: cause %v", r, le.Cause)
				}
				if err := w.Barrier(context.Background()); !errors.Is(err, ErrLost) {
					t.Errorf("rank %d: barrier after losing its leader: %v", r, err)
				}
				return
			}
			var lost []int
			for len(lost) < 4 {
				ev := <-w.Events()
				if ev.Kind != MemberLost {
					t.Fatalf("rank %d: event %+v", r, ev)
				}
				lost = append(lost, ev.Rank)
				if ev.Rank != leader && !strings.Contains(ev.Err.Error(), "host leader, rank 4 (host h1), was lost") {
					t.Errorf("rank %d: %v", r, ev.Err)
				}
			}
			if !slices.Equal(lost, []int{4, 5, 6, 7}) || w.Alive() != 12 {
				t.Errorf("rank %d: lost %v, alive %d", r, lost, w.Alive())
			}
		})
		ws[leader] = nil
	})
}

// An attached rank that closes leaves: an event everywhere, not a failure.
func TestHierLeaveIsNotFailure(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const leaver = 6
		ws, _ := formHier(t, 2, 4, nil)
		defer closeAll(ws)
		if err := ws[leaver].Close(); err != nil {
			t.Fatal(err)
		}
		for r, w := range ws {
			if r == leaver {
				continue
			}
			ev := <-w.Events()
			if ev.Kind != MemberLeft || ev.Rank != leaver || ev.Epoch != 2 {
				t.Errorf("rank %d: event %+v", r, ev)
			}
		}
		time.Sleep(10 * time.Second)
		for r, w := range ws {
			if r != leaver && w.Err() != nil {
				t.Errorf("rank %d: %v", r, w.Err())
			}
		}
	})
}

// Two ranks claiming one number, on one host or on two, refuse to form,
// with an error naming both on the members that see it; the others fail
// too instead of timing out.
func TestHierDuplicateRankRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ranks []int // rank per config; hosts of two ranks each, in order
	}{
		{"same host", []int{0, 1, 1}},
		{"two hosts", []int{0, 1, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				hn := &hierNet{nw: &rendezvoustest.Network{}, attach: &rendezvoustest.AttachNet{}, per: 2}
				var cfgs []Config
				for i, r := range tc.ranks {
					c := hn.config(t, "job1", r, 4)
					c.FormationTimeout = 10 * time.Second
					if tc.name == "two hosts" {
						c.Host, c.LocalRank = fmt.Sprintf("h%d", i/2), i%2
						if i == 2 {
							tr, err := hn.nw.NewTransport("10.0.9.9:7946")
							if err != nil {
								t.Fatal(err)
							}
							c.Transport = tr
						}
					}
					cfgs = append(cfgs, c)
				}
				_, errs := joinAll(context.Background(), cfgs)
				conflicts := 0
				for i, err := range errs {
					if err == nil {
						t.Fatalf("config %d formed", i)
					}
					if errors.Is(err, ErrConflict) {
						conflicts++
						if !strings.Contains(err.Error(), "two processes claim one rank") || !strings.Contains(err.Error(), "rank 1 of job") {
							t.Errorf("config %d: %v", i, err)
						}
					}
				}
				if conflicts < 2 {
					t.Errorf("%d members saw the conflict: %v", conflicts, errs)
				}
			})
		})
	}
}

// A formation that cannot complete lists the missing ranks; ranks attached
// to a leader get the leader's verdict.
func TestHierFormationTimeoutListsMissing(t *testing.T) {
	bubble(t, func(t *testing.T) {
		hn := &hierNet{nw: &rendezvoustest.Network{}, attach: &rendezvoustest.AttachNet{}, per: 2}
		var cfgs []Config
		for r := range 3 { // rank 3 (h1) never starts
			c := hn.config(t, "job1", r, 4)
			c.FormationTimeout = 30 * time.Second
			c.RankHosts = []string{"h0", "h0", "h1", "h1"}
			cfgs = append(cfgs, c)
		}
		_, errs := joinAll(context.Background(), cfgs)
		for i, err := range errs {
			if !errors.Is(err, ErrFormation) {
				t.Errorf("config %d: %v", i, err)
			}
		}
		if want := "rendezvous: 2/4 ranks after 30s; missing 2 (h1), 3 (h1)"; errs[0] == nil || errs[0].Error() != want {
			t.Errorf("seed: %v, want %q", errs[0], want)
		}
		if errs[1] == nil || errs[1].Error() != errs[0].Error() {
			t.Errorf("attached rank: %v, want the leader's verdict", errs[1])
		}
		// Leader and attached rank alike name rank 2 as the one that
		// never joined (the leader relays it with its verdict).
		for i, err := range errs[:2] {
			var lost interface{ LostWorldRank() int }
			if !errors.As(err, &lost) || lost.LostWorldRank() != 2 {
				t.Errorf("config %d: %v does not name rank 2 as the one that never joined", i, err)
			}
		}
		// Rank 2, h1's leader, waited for its host's other rank and says
		// so, naming nobody: it cannot tell which rank did not come.
		var lost interface{ LostWorldRank() int }
		if want := "rendezvous: host leader rank 2 (host h1): 1/2 of its host's ranks attached after 30s; the world cannot form without the others"; errs[2] == nil || errs[2].Error() != want ||
			!errors.As(errs[2], &lost) || lost.LostWorldRank() != -1 {
			t.Errorf("h1's leader: %v, want %q naming nobody", errs[2], want)
		}
	})
}

// A process without the job secret cannot attach to a leader.
func TestHierForeignAttachRefused(t *testing.T) {
	bubble(t, func(t *testing.T) {
		hn := &hierNet{nw: &rendezvoustest.Network{}, attach: &rendezvoustest.AttachNet{}, per: 2}
		good := hn.config(t, "job1", 0, 2)
		good.FormationTimeout = 5 * time.Second
		bad := hn.config(t, "job1", 1, 2)
		bad.Secret = []byte("ffffffffffffffffffffffffffffffff")
		bad.FormationTimeout = 5 * time.Second
		_, errs := joinAll(context.Background(), []Config{good, bad})
		if !errors.Is(errs[1], ErrFormation) || !strings.Contains(errs[1].Error(), "not attached") {
			t.Errorf("foreign rank: %v", errs[1])
		}
		if !errors.Is(errs[0], ErrFormation) || !strings.Contains(errs[0].Error(), "1/2 ranks") {
			t.Errorf("leader: %v", errs[0])
		}
	})
}

// Hosts of unequal size form one world: a host of one rank is its own
// leader with nothing attached, yet it must learn the ranks attached to the
// other hosts' leaders (they travel in push-pull state, not in gossip
// metadata), and they must learn it. gorun -H a:2,b:1,c:1 gives such a job.
func TestHierUnevenHosts(t *testing.T) {
	for _, sizes := range [][]int{{2, 1, 1}, {1, 2}, {2, 1}, {1, 1, 3}, {3, 1, 2, 1}} {
		t.Run(fmt.Sprint(sizes), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				nw, attach := &rendezvoustest.Network{}, &rendezvoustest.AttachNet{}
				n := 0
				for _, s := range sizes {
					n += s
				}
				var cfgs []Config
				for h, s := range sizes {
					for l := range s {
						r := len(cfgs)
						var c Config
						if l == 0 {
							c = memConfig(t, nw, "job1", r, n)
						} else {
							c = memConfigOn(t, nil, "job1", r, n)
							c.Transport = nil
						}
						c.LocalRank, c.LocalWorldSize = l, s
						c.Host = fmt.Sprintf("h%d", h)
						c.AttachNet = attach
						cfgs = append(cfgs, c)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				ws, errs := joinAll(ctx, cfgs)
				defer closeAll(ws)
				for r, err := range errs {
					if err != nil {
						t.Fatalf("rank %d: Join: %v", r, err)
					}
				}
				for r, w := range ws {
					if w.Size() != n || w.Alive() != n {
						t.Fatalf("rank %d: Size %d Alive %d, want %d", r, w.Size(), w.Alive(), n)
					}
					for p := range n {
						if got, want := w.Host(p), cfgs[p].Host; got != want {
							t.Errorf("rank %d: Host(%d) = %q, want %q", r, p, got, want)
						}
					}
				}
				eachRank(t, ws, func(w *World) error { return w.Barrier(context.Background()) })
			})
		})
	}
}
