package comm

import (
	"fmt"
	"time"
)

// The data plane's own liveness check on links between hosts.
//
// Gossip judges members, not links: a link cut while both of its hosts
// still reach a third is never noticed by gossip (its indirect probes
// succeed), and TCP alone retransmits for about 15 minutes (10 s with
// TCPUserTimeout) while a call waits on the link. So each communicator
// watches its own TCP links with a lease (EndpointConfig.LinkLease, the
// partition lease): a link whose peer host has acknowledged nothing for
// the lease while something awaited an acknowledgement is cut.
//
// What is read, and why it is enough. The kernel of the peer host
// acknowledges every segment whatever its process does (busy, starved,
// stopped), and every segment it sends carries an acknowledgement; the
// local kernel records when the last one came (TCP_INFO's
// tcpi_last_ack_recv). Something awaits one when data is in flight
// (tcpi_unacked), or probes go unanswered (tcpi_probes of two or more:
// zero-window probes, which a peer whose buffer is full still answers, or
// keepalive probes, which the kernel sends on a link idle for a quarter
// of the lease: see keepAlive). So on a healthy link the last acknowledgement is never
// older than the keepalive idle time plus a round trip, and on a cut one
// it ages from the cut on. No frame is added, no field of the frame path
// is touched: the check costs the fast path nothing, and it judges the
// very path the data takes, not a side channel that may take another.
//
// What it cannot tell apart: a cut network and a dead or hung peer host
// (kernel and all). Both are named as the network between the two hosts;
// a host lost as a whole is named by gorun's agent lease as a lost host.

// linkPoll is how often a link is read against a lease: a sixteenth of
// it, as the attach streams beat, but not more often than every 50 ms.
func linkPoll(lease time.Duration) time.Duration { return max(lease/16, 50*time.Millisecond) }

// watchLinks fails the communicator when one of its TCP links stays
// unacknowledged past its lease (see above). It returns at once when no
// link is watched (one host, shared memory, a Transport without TCP).
func (c *Comm) watchLinks() {
	type watched struct {
		p  *peer
		l  *tcpLink
		st []linkJudge // per connection of the link
	}
	var ws []watched
	var lease time.Duration
	for _, p := range c.peers {
		if p == nil {
			continue
		}
		if l, ok := unwrapLink(p.link).(*tcpLink); ok && l.lease > 0 && tcpInfoWorks {
			ws = append(ws, watched{p, l, make([]linkJudge, len(l.st))})
			lease = l.lease // one endpoint: one lease for every link
		}
	}
	if len(ws) == 0 {
		return
	}
	t := time.NewTicker(linkPoll(lease))
	defer t.Stop()
	for {
		select {
		case <-c.failed:
			return
		case <-c.watchStop:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, w := range ws {
			for i, s := range w.l.st {
				awaiting, sinceAck := s.ackState()
				if w.st[i].judge(now, awaiting, sinceAck, w.l.lease) {
					c.fail(c.cutErr(w.p.rank, sinceAck, w.l.lease))
					return
				}
			}
		}
	}
}

// linkJudge is the lease's memory of one connection between polls.
type linkJudge struct {
	// awaitSince is the first poll of the current run of polls that each
	// found an acknowledgement awaited (zero: the last poll found none).
	awaitSince time.Time
}

// judge takes one poll's reading (awaiting: data in flight or a probe
// out; sinceAck: the age of the last acknowledgement) and reports whether
// the connection is cut: an acknowledgement has been missing for the
// lease, and one has been awaited at every poll for a quarter of it.
//
// Why the second condition. While a peer's receive window stays closed
// (its process is not reading: busy, or stopped), the kernel's
// zero-window probes back off exponentially, to seconds apart, and each
// is answered at once; between them nothing awaits an acknowledgement.
// A poll that falls in a probe's round trip would see the last
// acknowledgement (the previous probe's) seconds old. A cut leaves the
// data or the probe unanswered at every poll from then on; a healthy
// peer answers within a round trip, far below a quarter of the lease.
func (j *linkJudge) judge(now time.Time, awaiting bool, sinceAck, lease time.Duration) bool {
	if !awaiting {
		j.awaitSince = time.Time{}
		return false
	}
	if j.awaitSince.IsZero() {
		j.awaitSince = now
	}
	return sinceAck >= lease && now.Sub(j.awaitSince) >= lease/4
}

// cutErr is the error of a link to p found cut: a PeerError (ErrPeerLost)
// naming p, its host and the network between the two hosts, first-hand
// (not "aborted"), so that gorun names the link.
func (c *Comm) cutErr(p int, silent, lease time.Duration) error {
	return &PeerError{Rank: p, WorldRank: c.g.GlobalRank(p), Host: c.g.Host(p), Err: ErrPeerLost,
		Reason: fmt.Sprintf("link cut: no acknowledgement from host %s for %v (the link lease is %v): the network between host %s and host %s is cut, or host %s is down",
			c.g.Host(p), silent.Round(time.Millisecond), lease, c.g.Host(c.me), c.g.Host(p), c.g.Host(p))}
}
