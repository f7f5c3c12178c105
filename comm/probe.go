package comm

import (
	"context"
	"fmt"
	"time"
)

// Probing: a non-consuming "has peer sent me something" check.
//
// A receive from any source (MPI_ANY_SOURCE, torch's recv without src)
// must take the first message that any of several peers has sent, and
// only that one: a receive posted on every link would take the next
// message of every other sender too. So a Probe waits for the next
// frame's header from one peer and keeps it (peer.stash) instead of
// passing it on; the next receive from that peer (Recv, or any call that
// reads from it) starts from the kept header, and the payload is still in
// the link, so the message is received exactly once, by that receive, in
// the order the peer sent it. Matcher (anysource.go) builds receives from
// any source on it.
//
// A Probe is a call in the communicator's order like the others, so it
// waits behind earlier calls and a later Recv waits behind it. It is not
// a message: it takes no sequence number, sends nothing and leaves no
// flight record (the watchdog sees no running call while it waits, since
// waiting for a message that may never come is what it is for), and a
// peer never sees it. Close ends a Probe that still waits (interruptProbe)
// instead of waiting for it.

// kindProbe is a Probe's call kind; it never appears in a frame.
const kindProbe Kind = 0x40

// Probe issues a call that completes once a message from peer is waiting
// to be received, without receiving it: the next Recv from peer receives
// that message. A Probe when a message is already waiting (an earlier
// Probe completed and no receive took its message) completes at once.
// The Handle's error is the communicator's failure (a lost peer, one that
// closed its communicator, Close while it waited: ErrClosed). Probing is
// for point-to-point traffic; the next frame from peer may also be a
// collective's, which a Probe reports like a message. Safe for concurrent
// use; does not block. ctx is the call's context as for every call: its end
// fails the communicator, so use one that ends with the program.
func (c *Comm) Probe(ctx context.Context, peer int) Handle {
	cl := c.newCall(kindProbe, 0)
	cl.dtype = Uint8
	c.checkRank(cl, peer, "peer")
	if peer == c.me {
		c.invalidf(cl, "probe of itself")
	}
	return c.issue(ctx, cl)
}

// probe runs a Probe of peer p. Token holder only.
func (c *Comm) probe(p int) error {
	pe := c.peers[p]
	if pe.stashed {
		return nil
	}
	// Close reads probing after it set closing; we read closing after we
	// set probing: one of the two sees the other.
	c.probing.Store(true)
	defer c.probing.Store(false)
	if c.closing.Load() {
		return ErrClosed
	}
	if err := pe.link.RecvHeader(&pe.stash); err != nil {
		if c.closing.Load() {
			return ErrClosed
		}
		if isProtocol(err) {
			return fmt.Errorf("comm: from %s: %w", c.info[p], err)
		}
		return c.linkErr(p, err)
	}
	if pe.stash.Frame != frameData {
		// The peer aborted or closed: no message will come. Fail as a
		// receive would, with its reason.
		return c.frameErr(p, &pe.stash, "a probe")
	}
	pe.stashed = true
	return nil
}

// nextHeader reads the next frame header from p: the one a Probe kept,
// else the link's next. Token holder only.
func (c *Comm) nextHeader(p int, h *Header) error {
	pe := c.peers[p]
	if pe.stashed {
		*h, pe.stashed = pe.stash, false
		return nil
	}
	return pe.link.RecvHeader(h)
}

// interruptProbe ends a Probe that waits while the communicator closes:
// the goodbye goes out first (the peers see an orderly close), then the
// communicator is marked closed, so that calls queued behind the Probe
// end with ErrClosed without touching a link, and the links are closed,
// which ends the Probe's wait.
func (c *Comm) interruptProbe() {
	c.sayBye()
	c.failOnce.Do(func() { c.failErr = ErrClosed; close(c.failed) })
	for _, p := range c.peers {
		if p != nil {
			_ = p.link.Close()
		}
	}
}

// sayBye sends every peer a goodbye frame and waits until each has left,
// bounded by AbortTimeout: a peer that stopped reading (hung, not dead)
// must not hold Close, so its link is then closed, which ends the send.
func (c *Comm) sayBye() {
	for _, p := range c.peers {
		if p != nil {
			h := Header{Frame: frameBye, Group: c.gid}
			p.sendq <- sendReq{h: h, seg: c.cfg.SegmentBytes}
		}
	}
	timeout := time.After(c.cfg.AbortTimeout)
	for _, p := range c.peers {
		if p == nil {
			continue
		}
		select {
		case <-p.sendErr:
		case <-timeout:
			_ = p.link.Close()
			<-p.sendErr
		}
	}
}
