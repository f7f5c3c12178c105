package sim

import (
	"time"
)

// Formation, as rendezvous.Join runs it in host-leader mode (hier.go,
// world.go):
//
//   - a leader starts (LeaderStart: newWorld, startLeader's listener,
//     memberlist.Create) and waits for its host's ranks (waitLocals);
//   - an attached rank starts (RankStart) and dials its leader, retrying
//     with joinAttached's backoff (5 ms doubling to 200 ms, jittered)
//     while the leader is not listening; the handshake and hello cost
//     Attach, split between the two ends (serveAttached);
//   - once every local rank is attached, the leader joins the seed (form:
//     ml.Join, a push-pull, retried 10 ms doubling to 500 ms while the
//     seed is not up); a push-pull carries each end's state: memberlist's
//     node states and localStateLocked's attached ranks;
//   - what a member learns of a new gossip member it re-broadcasts
//     (memberlist's aliveNode), and gossip spreads it (GossipInterval,
//     GossipNodes, retransmit limit); a member's attached ranks count
//     alive once their leader is alive in that view (mergeStateLocked,
//     markAliveLocked);
//   - a member with every rank alive forms and sends its ranks the table
//     (sendTableLocked: TableEntry per entry to encode once, and per
//     entry at each attached rank to decode: applyTable);
//   - the seed, once formed, pushes its state to every leader,
//     PushConcurrency at a time (pushTable); a leader not formed
//     RejoinInterval (jittered) after its join pulls again from the seed or
//     a random member (form's rejoin, randomPeer).

// StartAll schedules every rank's start.
func (w *World) StartAll() {
	if !w.cfg.InProcess {
		w.startIdle()
	}
	for h, l := range w.leaders {
		w.s.At(w.start[w.rank(h, 0)], func() { w.processStart(h, func() { w.startLeader(l) }) })
		for i := 1; i < w.cfg.PerHost; i++ {
			r := w.rank(h, i)
			w.s.At(w.start[r], func() {
				w.Count.RankStarts++
				w.processStart(h, func() { w.dialLeader(l, r, 5*time.Millisecond) })
			})
		}
	}
}

// IdleTick is how often a host is charged its ranks' idle CPU
// (Costs.ProcessIdle): coarse enough to cost few events, fine enough
// beside the 20 ms gossip interval to load the cores evenly.
const IdleTick = 100 * time.Millisecond

// startIdle charges each host, every IdleTick from its first rank's start,
// ProcessIdle for each of its ranks started by then (a silent host is no
// longer charged: it ran on the machine the calibration shares, but its
// ranks stop with it in the model).
func (w *World) startIdle() {
	per := w.cfg.PerHost
	for h, l := range w.leaders {
		first := w.start[w.rank(h, 0)]
		for i := range per {
			first = min(first, w.start[w.rank(h, i)])
		}
		var tick func()
		tick = func() {
			if l.silent {
				return
			}
			live := 0
			for i := range per {
				if w.start[w.rank(h, i)] <= w.s.now {
					live++
				}
			}
			w.cpu[h].Exec(time.Duration(live)*w.cfg.Costs.ProcessIdle*IdleTick/time.Second, nil)
			w.s.After(IdleTick, tick)
		}
		w.s.At(first+IdleTick, tick)
	}
}

// processStart charges a rank process's own start-up on host h's CPU,
// then runs next; ranks in one process (InProcess) share it and go on at
// once.
func (w *World) processStart(h int, next func()) {
	if w.cfg.InProcess {
		next()
		return
	}
	w.cpu[h].Exec(w.cfg.Costs.ProcessStart, next)
}

// attachMsgs is the messages of an attach on its stream: the handshake's
// nonce and MAC each way (rendezvous's handshake), the rank's hello and
// the leader's frameLeader.
const attachMsgs = 6

// sock is d when each rank is its own process and its messages cross
// real sockets, and 0 in one process (the in-process fit's in-memory
// network, where these costs are part of the fitted ones).
func (w *World) sock(d time.Duration) time.Duration {
	if w.cfg.InProcess {
		return 0
	}
	return d
}

func (w *World) startLeader(l *leader) {
	w.Count.LeaderStarts++
	w.cpu[l.h].Exec(w.cfg.Costs.LeaderStart, func() {
		l.listening = true
		w.setKnows(l, l.h, true)
		l.knowsRank[l.h] = true
		l.aliveN = 1
		w.queueBroadcast(l, msgAlive, l.h, 0) // memberlist's setAlive
		w.maybeJoin(l)
	})
}

// dialLeader is joinAttached: dial, and retry while the leader is not
// listening.
func (w *World) dialLeader(l *leader, r int, backoff time.Duration) {
	if !l.listening {
		w.s.After(w.s.Jitter(backoff), func() { w.dialLeader(l, r, min(2*backoff, 200*time.Millisecond)) })
		return
	}
	w.Count.Attaches++
	// The attach over a real Unix stream between processes: its connect,
	// the handshake's nonces and MACs both ways, the hello and the
	// leader's frameLeader (attachMsgs messages), half at each end.
	c := &w.cfg.Costs
	half := c.Attach/2 + w.sock(c.UnixConnect+attachMsgs*c.UnixMsg)/2
	w.cpu[l.h].Exec(half, func() { // the rank's end, then (a round trip later) the leader's hello check
		w.s.After(2*w.localHop(l.h), func() {
			w.cpu[l.h].Exec(half, func() {
				l.attached++
				l.aliveN++
				w.checkFormed(l)
				w.maybeJoin(l)
			})
		})
	})
}

// maybeJoin is the end of waitLocals: with every local rank attached the
// leader joins the seed (the seed itself only starts gossiping).
func (w *World) maybeJoin(l *leader) {
	if l.joined || !l.listening || l.attached < w.cfg.PerHost-1 {
		return
	}
	l.joined = true
	w.startGossip(l)
	w.startProbes(l)
	if l.h == 0 {
		w.checkFormed(l)
		return
	}
	w.joinSeed(l, 10*time.Millisecond)
}

// joinSeed is form's join loop.
func (w *World) joinSeed(l *leader, backoff time.Duration) {
	seed := w.leaders[0]
	if !seed.listening {
		w.s.After(w.s.Jitter(backoff), func() { w.joinSeed(l, min(2*backoff, 500*time.Millisecond)) })
		return
	}
	w.pushPull(l, seed, nil)
	w.scheduleRejoin(l)
}

func (w *World) scheduleRejoin(l *leader) {
	w.s.After(w.s.Jitter(w.cfg.Rdzv.RejoinInterval), func() {
		if l.formed || l.silent {
			return
		}
		peer := w.leaders[0]
		if w.s.rng.IntN(2) == 1 {
			if t := w.randomTargets(l, 1); len(t) == 1 && t[0] != 0 {
				peer = w.leaders[t[0]]
			}
		}
		w.pushPull(l, peer, nil)
		w.scheduleRejoin(l)
	})
}

// view is a snapshot of a member's state as a push-pull carries it.
type view struct{ hosts, ranks []bool }

func (w *World) snapshot(l *leader) (view, int) {
	w.Count.PushPullStates++
	v := view{hosts: append([]bool(nil), l.knowsHost...), ranks: append([]bool(nil), l.knowsRank...)}
	nodes, withRanks := 0, 0
	for h := range v.hosts {
		if v.hosts[h] {
			nodes++
		}
		if v.ranks[h] {
			withRanks++
		}
	}
	c := &w.cfg.Costs
	w.Count.StateNodes += int64(nodes)
	w.Count.StateRanks += int64(withRanks * (w.cfg.PerHost - 1))
	return v, nodes*c.StateNodeBytes + withRanks*(w.cfg.PerHost-1)*c.StateRankBytes
}

// pushPull is memberlist's pushPullNode from a to b: a sends its state, b
// reads it, answers with its own, then merges; a merges b's. done runs at
// a when the exchange is over. A silent b never answers: a gives up after
// TCPTimeout.
func (w *World) pushPull(a, b *leader, done func()) {
	c := &w.cfg.Costs
	w.Count.PushPulls++
	va, na := w.snapshot(a)
	// Over real TCP between processes each end pays half the connection
	// and half of each of the two states' messages: one message's worth
	// (sockEnd), charged when it sends, and the bytes' copies, half at
	// each end as they cross.
	sockEnd := w.sock(c.SockConnect/2 + c.SockMsg)
	w.cpu[a.h].Exec(c.PushPull+sockEnd+time.Duration(na)*(c.StateByte+w.sock(c.SockByte)/2), func() {
		w.Count.StateBytes += int64(na)
		w.net.Send(a.h, b.h, na, "pushpull", func() {
			if b.silent {
				w.s.After(w.cfg.Rdzv.TCPTimeout, func() {
					if done != nil {
						done()
					}
				})
				return
			}
			vb, nb := w.snapshot(b)
			w.cpu[b.h].Exec(c.PushPull+sockEnd+time.Duration(na+nb)*(c.StateByte+w.sock(c.SockByte)/2), func() {
				w.Count.StateBytes += int64(nb)
				w.net.Send(b.h, a.h, nb, "pushpull", func() {
					w.cpu[a.h].Exec(time.Duration(nb)*(c.StateByte+w.sock(c.SockByte)/2), func() {
						w.merge(a, vb)
						if done != nil {
							done()
						}
					})
				})
				w.merge(b, va)
			})
		})
	})
}

// merge is memberlist's mergeState with rendezvous's MergeRemoteState:
// attached ranks first (pending until their leader is alive), then the
// nodes, each new one re-broadcast.
func (w *World) merge(l *leader, v view) {
	for h := range v.ranks {
		if v.ranks[h] && !l.knowsRank[h] {
			l.knowsRank[h] = true
			if l.knowsHost[h] {
				l.aliveN += w.cfg.PerHost - 1
			}
		}
	}
	for h := range v.hosts {
		if v.hosts[h] {
			w.learnAlive(l, h, l.inc[h])
		}
	}
	w.checkFormed(l)
}

// learnAlive is aliveNode for news that host h's leader is alive with
// incarnation inc, and the World's NotifyJoin.
func (w *World) learnAlive(l *leader, h, inc int) {
	if l.knowsHost[h] && inc <= l.inc[h] {
		return
	}
	if inc > l.inc[h] {
		l.suspectAt[h] = 0 // a refutation ends a suspicion
	}
	l.inc[h] = inc
	if l.knowsHost[h] {
		return
	}
	w.setKnows(l, h, true)
	l.aliveN++
	if l.knowsRank[h] {
		l.aliveN += w.cfg.PerHost - 1
	}
	w.queueBroadcast(l, msgAlive, h, inc)
}

// checkFormed is the end of markAliveLocked: the world formed in l's view.
func (w *World) checkFormed(l *leader) {
	if l.formed || l.aliveN < w.n {
		return
	}
	l.formed = true
	c := &w.cfg.Costs
	// Each table frame crosses a Unix stream between processes: half of
	// a message and of its bytes at the leader (per rank), half at the
	// rank.
	frame := w.sock(c.UnixMsg+time.Duration(w.n*c.TableEntryBytes)*c.SockByte) / 2
	w.cpu[l.h].Exec(time.Duration(w.n)*c.TableEntry+time.Duration(w.cfg.PerHost-1)*frame, func() {
		w.setFormed(w.rank(l.h, 0))
		for i := 1; i < w.cfg.PerHost; i++ {
			r := w.rank(l.h, i)
			w.Count.TableEntries += int64(w.n)
			w.s.After(w.localHop(l.h), func() {
				w.cpu[l.h].Exec(time.Duration(w.n)*c.TableEntry+frame, func() { w.setFormed(r) })
			})
		}
	})
	if l.h == 0 {
		w.pushTable(l)
	} else if share := w.pushShare[l.h]; len(share) > 0 {
		w.pushTo(l, share)
	}
}

// pushTable is the seed's push of its state to every leader,
// PushConcurrency at a time. With WorldConfig.PushTree (rendezvous's
// pushPlan, less its small-world threshold) the seed pushes to √H leaders
// only and each of them, once formed, pushes to its contiguous share of
// the rest, so no host sends the whole state H times.
func (w *World) pushTable(seed *leader) {
	var targets []*leader
	for h, k := range seed.knowsHost {
		if k && h != seed.h {
			targets = append(targets, w.leaders[h])
		}
	}
	if w.cfg.PushTree && len(targets) > 1 {
		width := 1
		for width*width < len(targets) {
			width++
		}
		rest := targets[width:]
		per := (len(rest) + width - 1) / width
		w.pushShare = map[int][]*leader{}
		for k, t := range rest {
			p := targets[k/per]
			w.pushShare[p.h] = append(w.pushShare[p.h], t)
		}
		targets = targets[:width]
	}
	w.pushTo(seed, targets)
}

// pushTo pushes from's state to targets, PushConcurrency at a time.
func (w *World) pushTo(from *leader, targets []*leader) {
	next := 0
	var launch func()
	launch = func() {
		if next >= len(targets) {
			return
		}
		t := targets[next]
		next++
		w.pushPull(from, t, launch)
	}
	for range min(w.cfg.Rdzv.PushConcurrency, len(targets)) {
		launch()
	}
}

// setKnows records whether l's memberlist view holds host h alive.
func (w *World) setKnows(l *leader, h int, alive bool) {
	if l.knowsHost[h] == alive {
		return
	}
	l.knowsHost[h] = alive
	if alive {
		l.nKnown++
		if !l.everKnown[h] {
			l.everKnown[h] = true
			l.known = append(l.known, h)
		}
	} else {
		l.nKnown--
	}
}
