package sim

import (
	"math"
	"time"
)

// Failure detection after formation.
//
// A SIGKILLed attached rank closes its attach stream: its leader's reader
// sees the end at once (serveAttached → attachedGone), counts it lost,
// tells its own ranks, sends kindGone to every other leader directly (one
// packet each, SendBestEffort) and queues it for gossip as a backstop;
// each leader applies it (handleGone) and tells its ranks (frameGone).
//
// A silent host (powered off, cut off) answers nothing: memberlist's
// probes find it, suspect it, declare it dead, and each World loses it
// GossipLease − SuspicionTimeout later (gossip.go).

// KillRank SIGKILLs attached rank r (not a leader) now.
func (w *World) KillRank(r int) {
	l := w.leaders[r/w.cfg.PerHost]
	w.setLost(r, 0) // the victim itself is not waited for
	w.s.After(w.cfg.ExitDelay, func() {
		w.rankGone(l, r)
		w.launcherReacts(l.h)
	})
}

// launcherReacts charges what gorun's own processes spend on the death of
// a rank of host h, on the cores the rendezvous uses too: the agent there
// reaps it and reports (DeathAgent, with its sshd), a hop later gorun
// stops the job (DeathLauncher per host, with its ssh clients), and a hop
// after that every other host's agent stops its ranks (DeathHost, with
// its sshd). Only the CPU is charged: nothing waits on it but the
// handlers queued behind it. Ranks in one process have no launcher.
func (w *World) launcherReacts(h int) {
	if w.cfg.InProcess {
		return
	}
	c := &w.cfg.Costs
	w.cpu[h].Exec(c.DeathAgent, func() {
		w.s.After(w.cfg.Latency+w.wake(0), func() {
			w.launcher.Exec(time.Duration(w.cfg.Hosts)*c.DeathLauncher, func() {
				for k, o := range w.leaders {
					if k != h && !o.silent {
						w.s.After(w.cfg.Latency+w.wake(k), func() { w.cpu[k].Exec(c.DeathHost, nil) })
					}
				}
			})
		})
	})
}

// rankGone: the killed rank r's stream has closed; its leader l sees it.
func (w *World) rankGone(l *leader, r int) {
	h, c := l.h, &w.cfg.Costs
	// The leader wakes to read the closed stream's end: half a message.
	w.cpu[h].Exec(c.Packet/2+w.sock(c.UnixMsg)/2, func() {
		w.seenGoneBy(l, r)
		var others []int
		for k, kn := range l.knowsHost {
			if kn && k != h {
				others = append(others, k)
			}
		}
		for _, k := range others {
			w.sendPacket(l, w.leaders[k], c.GoneBytes, "gone", func() { w.handleGone(w.leaders[k], r) })
		}
		w.queueBroadcast(l, msgGone, r, 0)
	})
}

// handleGone applies a kindGone at leader l once.
func (w *World) handleGone(l *leader, r int) {
	if l.seenGone[r] {
		return
	}
	w.queueBroadcast(l, msgGone, r, 0) // memberlist passes a new message on
	w.seenGoneBy(l, r)
}

// seenGoneBy: leader l learned rank r is lost; it and its ranks note it
// (frameGone to each attached rank).
func (w *World) seenGoneBy(l *leader, r int) {
	l.seenGone[r] = true
	c := &w.cfg.Costs
	if w.rank(l.h, 0) != r {
		w.noteLost(w.rank(l.h, 0))
	}
	for i := 1; i < w.cfg.PerHost; i++ {
		q := w.rank(l.h, i)
		if q == r {
			continue
		}
		// frameGone on the rank's Unix stream: both ends on this host.
		w.s.After(w.localHop(l.h), func() { w.cpu[l.h].Exec(c.Packet/2+w.sock(c.UnixMsg), func() { w.noteLost(q) }) })
	}
}

// SilenceHost makes host h answer nothing from now on (its ranks stop
// too); its own ranks are not waited for.
func (w *World) SilenceHost(h int) {
	w.leaders[h].silent = true
	for i := range w.cfg.PerHost {
		w.setLost(w.rank(h, i), 0)
	}
}

// ResetLost forgets who learned of the last failure.
func (w *World) ResetLost() {
	for r := range w.lost {
		w.lost[r] = -1
	}
	w.nLost = 0
	for h, l := range w.leaders {
		if l.silent {
			for i := range w.cfg.PerHost {
				w.setLost(w.rank(h, i), 0)
			}
		}
	}
}

// Surfaced is the time from since until the last rank learned of the
// failure, and how many ranks had not learned it by now.
func (w *World) Surfaced(since time.Duration) (time.Duration, int) {
	var last time.Duration
	missing := 0
	for _, t := range w.lost {
		switch {
		case t < 0:
			missing++
		case t > 0:
			last = max(last, t-since)
		}
	}
	return last, missing
}

// AllSurfaced reports whether every rank learned of the failure.
func (w *World) AllSurfaced() bool { return w.nLost == w.n }

func (w *World) setLost(r int, t time.Duration) {
	if w.lost[r] < 0 {
		w.lost[r] = t
		w.nLost++
	}
}

// pushPullScale is memberlist's pushPullScale: the anti-entropy interval
// grows with log2 of the member count beyond 32.
func pushPullScale(iv time.Duration, n int) time.Duration {
	if n <= 32 {
		return iv
	}
	return time.Duration(math.Ceil(math.Log2(float64(n))-math.Log2(32))+1) * iv
}

// StartAntiEntropy starts every leader's periodic push-pull with a random
// member (memberlist's pushPullTrigger, staggered at random within the
// first interval).
func (w *World) StartAntiEntropy() {
	iv := pushPullScale(w.cfg.Rdzv.PushPullInterval, w.cfg.Hosts)
	for _, l := range w.leaders {
		var tick func()
		tick = func() {
			if l.silent {
				return
			}
			if t := w.randomTargets(l, 1); len(t) == 1 {
				w.pushPull(l, w.leaders[t[0]], nil)
			}
			w.s.After(iv, tick)
		}
		w.s.After(time.Duration(w.s.rng.Int64N(int64(iv))), tick)
	}
}

// AntiEntropyInterval is the scaled push-pull interval at this host count.
func (w *World) AntiEntropyInterval() time.Duration {
	return pushPullScale(w.cfg.Rdzv.PushPullInterval, w.cfg.Hosts)
}
