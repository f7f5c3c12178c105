package sim

import (
	"slices"
	"time"
)

// Gossip and probing, as memberlist runs them under rendezvous's
// memberlistConfig: every GossipInterval a member with queued broadcasts
// sends GossipNodes random members each a packet of up to UDPBufferSize
// bytes of messages, those sent fewest times first (TransmitLimitedQueue);
// a message is dropped after retransmitLimit sends; every ProbeInterval it
// probes the next member of its shuffled list (probe), and one that does not
// answer within the interval (direct and indirect probes) is suspected
// (suspectNode), declared dead suspicionTimeout later unless it refutes
// (deadNode), and lost to the World GossipLease − SuspicionTimeout after
// that (doubt.go).

func (w *World) queueBroadcast(l *leader, kind, id, inc int) {
	key := [2]int{kind, id}
	if kind == msgAlive || kind == msgSuspect || kind == msgDead {
		// memberlist's node messages about one node invalidate each
		// other (and an older one of the same kind).
		for _, k := range []int{msgAlive, msgSuspect, msgDead} {
			if b, ok := l.queued[[2]int{k, id}]; ok {
				delete(l.queued, [2]int{k, id})
				b.dropped = true
			}
		}
	} else if _, ok := l.queued[key]; ok {
		return
	}
	b := &bcast{kind: kind, id: id, inc: inc}
	l.queued[key] = b
	l.push(b)
}

// takeShare takes up to n queued messages for one packet in
// TransmitLimitedQueue's order: fewest sends first, newest first among
// equals (buckets by send count, each a stack). The caller sends them and
// gives them back with putBack.
func (l *leader) takeShare(n int) []*bcast {
	var out []*bcast
	for t := 0; t < len(l.buckets) && len(out) < n; t++ {
		for len(l.buckets[t]) > 0 && len(out) < n {
			b := l.buckets[t][len(l.buckets[t])-1]
			l.buckets[t] = l.buckets[t][:len(l.buckets[t])-1]
			if b.dropped {
				continue
			}
			out = append(out, b)
		}
	}
	l.queueN -= len(out)
	return out
}

// putBack counts one more send of each message and requeues those below
// the retransmit limit.
func (l *leader) putBack(sent []*bcast, limit int) {
	for _, b := range sent {
		b.transmits++
		if b.transmits >= limit || b.dropped {
			if l.queued[[2]int{b.kind, b.id}] == b {
				delete(l.queued, [2]int{b.kind, b.id})
			}
			continue
		}
		l.push(b)
	}
}

func (l *leader) push(b *bcast) {
	for len(l.buckets) <= b.transmits {
		l.buckets = append(l.buckets, nil)
	}
	l.buckets[b.transmits] = append(l.buckets[b.transmits], b)
	l.queueN++
}

func (l *leader) queueLen() int { return l.queueN }

// startGossip starts l's gossip ticker at a random phase.
func (w *World) startGossip(l *leader) {
	iv := w.cfg.Rdzv.GossipInterval
	var tick func()
	tick = func() {
		if l.silent {
			return
		}
		w.gossipRound(l)
		w.s.After(iv, tick)
	}
	w.s.After(time.Duration(w.s.rng.Int64N(int64(iv))), tick)
}

func (w *World) gossipRound(l *leader) {
	if l.queueLen() == 0 {
		return
	}
	targets := w.randomTargets(l, w.cfg.Rdzv.GossipNodes)
	if len(targets) == 0 {
		return
	}
	limit := w.retransmitLimit(l.nKnown)
	per := max(1, (w.udpBuf-12)/(w.cfg.Costs.AliveBytes+2))
	// Each target gets the least sent messages at that moment
	// (GetBroadcasts once per target), so a new message goes to every
	// target of the round.
	for _, t := range targets {
		share := l.takeShare(per)
		if len(share) == 0 {
			return
		}
		msgs := make([]bcast, len(share))
		for j, b := range share {
			msgs[j] = *b
		}
		l.putBack(share, limit)
		bytes := 12 + len(msgs)*(w.cfg.Costs.AliveBytes+2)
		w.Count.GossipMsgs += int64(len(msgs))
		to := w.leaders[t]
		w.sendPacket(l, to, bytes, "gossip", func() {
			w.cpu[to.h].Exec(time.Duration(len(msgs))*w.cfg.Costs.GossipMsg, func() {
				for _, m := range msgs {
					w.receiveMsg(to, m)
				}
			})
		})
	}
}

// randomTargets is kRandomNodes over the members l knows alive (l.known
// holds every host l ever knew; the dead are skipped).
func (w *World) randomTargets(l *leader, k int) []int {
	if l.nKnown-1 <= k {
		var out []int
		for _, h := range l.known {
			if h != l.h && l.knowsHost[h] {
				out = append(out, h)
			}
		}
		return out
	}
	out := make([]int, 0, k)
	for tries := 0; len(out) < k && tries < 8*len(l.known); tries++ {
		h := l.known[w.s.rng.IntN(len(l.known))]
		if h != l.h && l.knowsHost[h] && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// sendPacket charges a UDP packet: half of Packet at the sender, the other
// half at the receiver before fn; a silent receiver drops it.
func (w *World) sendPacket(from, to *leader, bytes int, kind string, fn func()) {
	c := &w.cfg.Costs
	w.Count.Packets++
	w.Count.PacketBytes += int64(bytes)
	end := c.Packet/2 + w.sock(c.SockPacket)/2
	w.cpu[from.h].Exec(end, nil)
	w.net.Send(from.h, to.h, bytes, kind, func() {
		if to.silent {
			return
		}
		w.cpu[to.h].Exec(end, fn)
	})
}

func (w *World) receiveMsg(l *leader, m bcast) {
	switch m.kind {
	case msgAlive:
		had := l.knowsHost[m.id]
		w.learnAlive(l, m.id, m.inc)
		if !had {
			w.checkFormed(l)
		}
	case msgSuspect:
		if m.id == l.h {
			// Refute: a new incarnation (memberlist's refute).
			l.myInc = max(l.myInc, m.inc) + 1
			w.queueBroadcast(l, msgAlive, l.h, l.myInc)
			return
		}
		w.suspect(l, m.id, m.inc)
	case msgDead:
		w.declareDead(l, m.id, m.inc)
	case msgGone:
		w.handleGone(l, m.id)
	}
}

// suspect is suspectNode: start the suspicion timer and gossip it.
func (w *World) suspect(l *leader, h, inc int) {
	if !l.knowsHost[h] || inc < l.inc[h] || l.suspectAt[h] != 0 {
		return
	}
	l.suspectAt[h] = w.s.now
	if w.leaders[h].silent && w.firstSuspicion < 0 {
		w.firstSuspicion = w.s.now
	}
	w.queueBroadcast(l, msgSuspect, h, inc)
	since := w.s.now
	w.s.After(w.suspicionTimeout(), func() {
		if l.suspectAt[h] == since && l.knowsHost[h] {
			w.declareDead(l, h, l.inc[h])
		}
	})
}

// declareDead is deadNode and the World's NotifyLeave: the member is
// doubted for GossipLease − SuspicionTimeout, then lost with its host's
// ranks.
func (w *World) declareDead(l *leader, h, inc int) {
	if !l.knowsHost[h] || inc < l.inc[h] || l.silent {
		return
	}
	w.setKnows(l, h, false)
	w.queueBroadcast(l, msgDead, h, inc)
	rc := &w.cfg.Rdzv
	w.s.After(rc.GossipLease-rc.SuspicionTimeout, func() {
		if l.knowsHost[h] {
			return // refuted meanwhile
		}
		w.hostLost(l, h)
	})
}

// hostLost: the World counts host h's ranks lost and tells its own ranks
// (frameGone), each frame charged as one packet's half.
func (w *World) hostLost(l *leader, h int) {
	c := &w.cfg.Costs
	w.cpu[l.h].Exec(c.Packet/2, func() {
		w.noteLost(w.rank(l.h, 0))
		for i := 1; i < w.cfg.PerHost; i++ {
			r := w.rank(l.h, i)
			w.s.After(w.localHop(l.h), func() { w.cpu[l.h].Exec(c.Packet/2+w.sock(c.UnixMsg), func() { w.noteLost(r) }) })
		}
	})
}

func (w *World) noteLost(r int) {
	w.setLost(r, w.s.now)
}

// startProbes starts l's probe ticker (memberlist's probe) at a random
// phase.
func (w *World) startProbes(l *leader) {
	iv := w.cfg.Rdzv.ProbeInterval
	var tick func()
	tick = func() {
		if l.silent {
			return
		}
		w.probeNext(l)
		w.s.After(iv, tick)
	}
	w.s.After(time.Duration(w.s.rng.Int64N(int64(iv))), tick)
}

func (w *World) probeNext(l *leader) {
	for range len(l.perm) {
		if l.probeIdx >= len(l.perm) {
			l.probeIdx = 0
			w.s.rng.Shuffle(len(l.perm), func(i, j int) { l.perm[i], l.perm[j] = l.perm[j], l.perm[i] })
		}
		h := l.perm[l.probeIdx]
		l.probeIdx++
		if h != l.h && l.knowsHost[h] {
			w.probe(l, h)
			return
		}
	}
}

// probe is probeNode: a ping, an ack; no ack within ProbeTimeout brings
// IndirectChecks indirect probes; none by the end of the interval, a
// suspicion. The ack needs the target's CPU: a starved target is
// suspected as a silent one is.
func (w *World) probe(l *leader, h int) {
	rc := &w.cfg.Rdzv
	c := &w.cfg.Costs
	t := w.leaders[h]
	start := w.s.now
	inc := l.inc[h]
	acked := false
	w.sendPacket(l, t, c.PingBytes, "probe", func() {
		w.sendPacket(t, l, c.PingBytes, "probe", func() {
			if w.s.now-start <= rc.ProbeInterval {
				acked = true
			}
		})
	})
	w.s.After(rc.ProbeTimeout, func() {
		if acked {
			return
		}
		for _, k := range w.randomTargets(l, rc.IndirectChecks) {
			if k == h {
				continue
			}
			w.sendPacket(l, w.leaders[k], c.PingBytes, "probe", func() {
				w.sendPacket(w.leaders[k], t, c.PingBytes, "probe", func() {
					w.sendPacket(t, w.leaders[k], c.PingBytes, "probe", func() {
						w.sendPacket(w.leaders[k], l, c.PingBytes, "probe", func() {
							if w.s.now-start <= rc.ProbeInterval {
								acked = true
							}
						})
					})
				})
			})
		}
	})
	w.s.After(rc.ProbeInterval, func() {
		if acked || l.silent {
			return
		}
		if !w.leaders[h].silent {
			w.Count.FalseSuspicions++
		}
		w.suspect(l, h, inc)
	})
}
