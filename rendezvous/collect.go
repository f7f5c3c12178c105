package rendezvous

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Messages between members ride memberlist's reliable user messages (one
// encrypted TCP stream each). The first byte is the kind.
const (
	kindCollect byte = 'C' // one round of an all-gather
	kindFatal   byte = 'F' // a conflict found by another member: formation fails
	kindBye     byte = 'B' // the sender is leaving gracefully (see World.shutdown)
)

// slotKey names one expected message: round `round` of collective `seq` on
// the group with key `group`, sent by group rank `from`.
type slotKey struct {
	group uint64
	seq   uint64
	round int
	from  int
}

// slot holds a message that arrived before or after its reader asked for it;
// ch is closed when it arrives.
type slot struct {
	ch      chan struct{}
	arrived bool
	entries map[int][]byte // group rank → payload
}

// slotLocked returns the slot for k, creating it; w.mu is held.
func (w *World) slotLocked(k slotKey) *slot {
	s := w.slots[k]
	if s == nil {
		s = &slot{ch: make(chan struct{})}
		w.slots[k] = s
	}
	return s
}

// allgather gives every member of g every member's payload, without a
// coordinator: a dissemination all-gather, ⌈log2 n⌉ rounds; in round k each
// member sends everything it knows to the member 2^k ahead and receives from
// the member 2^k behind. After round k a member knows the payloads of the
// 2^(k+1) members ending at itself, so after the last round it knows all.
// Barrier is this with empty payloads. n·⌈log2 n⌉ messages in all.
//
// Each call takes the next sequence number of g's member list, so every
// member must run the same collectives on a group in the same order.
func (g *Group) allgather(ctx context.Context, op string, payload []byte) ([][]byte, error) {
	g.opMu.Lock()
	defer g.opMu.Unlock()
	w := g.w
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, fmt.Errorf("rendezvous: %s: %w", op, ErrClosed)
	}
	if g.err != nil {
		err := g.err
		w.mu.Unlock()
		return nil, err
	}
	if g.leaver != nil {
		// The member that left will never take part.
		err := *g.leaver
		w.mu.Unlock()
		err.Op = op
		return nil, &err
	}
	seq := w.seqs[g.key]
	w.seqs[g.key]++
	w.mu.Unlock()

	n := g.n
	got := map[int][]byte{g.rank: payload}
	for round, dist := 0, 1; dist < n; round, dist = round+1, dist*2 {
		to, from := (g.rank+dist)%n, (g.rank-dist+n)%n
		msg := encodeCollect(g.key, seq, round, g.rank, got)
		if err := g.send(ctx, op, to, msg); err != nil {
			return nil, err
		}
		entries, err := g.await(ctx, op, slotKey{g.key, seq, round, from}, from)
		if err != nil {
			return nil, err
		}
		for r, p := range entries {
			got[r] = p
		}
	}
	out := make([][]byte, n)
	for r := range out {
		p, ok := got[r]
		if !ok {
			// Cannot happen with the dissemination pattern; a bug here
			// must not look like success.
			return nil, fmt.Errorf("rendezvous: %s: internal error: no payload from group rank %d", op, r)
		}
		out[r] = p
	}
	return out, nil
}

// send delivers msg to group rank to. A failed send is retried while the
// member is still alive in our view: if it died, the failure detector fails
// the group within seconds and the LostError is returned instead of a
// connection error. If it left, the send is dropped: either it had done its
// part before leaving and needs nothing more, or it never will, which await
// reports.
func (g *Group) send(ctx context.Context, op string, to int, msg []byte) error {
	w := g.w
	wr := g.worldRank(to)
	w.mu.Lock()
	gone := w.goneChanLocked(wr)
	w.mu.Unlock()
	backoff := 20 * time.Millisecond
	var giveUp <-chan time.Time
	for {
		err := w.deliver(wr, msg)
		if err == nil {
			return nil
		}
		w.log.Debug().Err(err).Int("to", wr).Msgf("rendezvous: %s: send failed; retrying", op)
		if giveUp == nil {
			// Bounded: a member that refuses connections yet answers
			// probes must not hang us either.
			t := time.NewTimer(5 * w.cfg.TCPTimeout)
			defer t.Stop()
			giveUp = t.C
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-g.failed:
			t.Stop()
			return g.Err()
		case <-gone:
			t.Stop()
			if err := g.Err(); err != nil {
				return err
			}
			return nil
		case <-w.closedCh:
			t.Stop()
			return fmt.Errorf("rendezvous: %s: %w", op, ErrClosed)
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("rendezvous: %s: %w", op, ctx.Err())
		case <-giveUp:
			t.Stop()
			return fmt.Errorf("rendezvous: %s: send to rank %d (host %s): %w", op, wr, g.Host(to), err)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// await waits for the message k from group rank from.
func (g *Group) await(ctx context.Context, op string, k slotKey, from int) (map[int][]byte, error) {
	w := g.w
	w.mu.Lock()
	s := w.slotLocked(k)
	w.mu.Unlock()
	left := g.left
	var grace <-chan time.Time
	for {
		select {
		case <-s.ch:
			w.mu.Lock()
			delete(w.slots, k)
			w.mu.Unlock()
			return s.entries, nil
		case <-g.failed:
			return nil, g.Err()
		case <-left:
			// A member left gracefully. If it did its part before leaving
			// (the usual end of a job: barrier, then leave), the messages
			// this collective needs are already sent and arrive shortly,
			// possibly after the leave, which travels by UDP gossip while
			// they travel by TCP. Otherwise they never come.
			left = nil
			t := time.NewTimer(w.cfg.LeaveGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			w.mu.Lock()
			err := *g.leaver
			w.mu.Unlock()
			err.Op = op
			return nil, &err
		case <-w.closedCh:
			return nil, fmt.Errorf("rendezvous: %s: %w", op, ErrClosed)
		case <-ctx.Done():
			return nil, fmt.Errorf("rendezvous: %s: %w", op, ctx.Err())
		}
	}
}

// encodeCollect: kind, group key (8 bytes), uvarints seq, round, from,
// count, then count × (group rank, length, payload).
func encodeCollect(key, seq uint64, round, from int, entries map[int][]byte) []byte {
	b := []byte{kindCollect}
	b = binary.BigEndian.AppendUint64(b, key)
	b = binary.AppendUvarint(b, seq)
	b = binary.AppendUvarint(b, uint64(round))
	b = binary.AppendUvarint(b, uint64(from))
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for r, p := range entries {
		b = binary.AppendUvarint(b, uint64(r))
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

var errBadMsg = errors.New("rendezvous: malformed message")

func decodeCollect(b []byte) (slotKey, map[int][]byte, error) {
	var k slotKey
	if len(b) < 9 {
		return k, nil, errBadMsg
	}
	k.group = binary.BigEndian.Uint64(b[1:9])
	b = b[9:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	var vals [4]uint64
	for i := range vals {
		v, ok := next()
		if !ok {
			return k, nil, errBadMsg
		}
		vals[i] = v
	}
	k.seq, k.round, k.from = vals[0], int(vals[1]), int(vals[2])
	count := vals[3]
	if count > uint64(len(b)) { // each entry takes at least two bytes
		return k, nil, errBadMsg
	}
	entries := make(map[int][]byte, count)
	for range count {
		r, ok1 := next()
		l, ok2 := next()
		if !ok1 || !ok2 || l > uint64(len(b)) {
			return k, nil, errBadMsg
		}
		entries[int(r)] = append([]byte(nil), b[:l]...)
		b = b[l:]
	}
	return k, entries, nil
}

// encodeFatal carries a conflict to the members that did not see it.
func encodeFatal(ce *ConflictError) []byte {
	j, _ := json.Marshal(ce) // plain structs of strings and ints: cannot fail
	return append([]byte{kindFatal}, j...)
}

// handleMsg is memberlist's NotifyMsg: it may run concurrently from several
// stream handlers and must not block.
func (w *World) handleMsg(b []byte) {
	if len(b) == 0 {
		return
	}
	switch b[0] {
	case kindCollect:
		k, entries, err := decodeCollect(b)
		if err != nil {
			w.log.Warn().Err(err).Msg("rendezvous: dropping message")
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		s := w.slotLocked(k)
		if s.arrived {
			return // a retried send that had in fact arrived
		}
		s.arrived, s.entries = true, entries
		close(s.ch)
	case kindBye:
		r, n := binary.Uvarint(b[1:])
		if n <= 0 {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if int(r) < len(w.members) && int(r) != w.cfg.Rank {
			w.members[r].leaving = true
		}
	case kindRelay:
		w.handleRelay(b[1:])
	case kindGone:
		w.handleGone(b[1:])
	case kindNotice:
		w.handleNotice(b[1:])
	case kindFatal:
		ce := new(ConflictError)
		if err := json.Unmarshal(b[1:], ce); err != nil {
			w.log.Warn().Err(err).Msg("rendezvous: dropping malformed conflict report")
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.setFatalLocked(ce)
	default:
		w.log.Warn().Int("kind", int(b[0])).Msg("rendezvous: dropping message of unknown kind")
	}
}

// commGroup is the collective layer's Group interface, restated to check that
// World and Group satisfy it exactly.
type commGroup interface {
	Rank() int
	Size() int
	GlobalRank(r int) int
	Host(r int) string
	DataAddr(r int) string
	Failed() <-chan struct{}
	Err() error
}

var (
	_ commGroup = (*World)(nil)
	_ commGroup = (*Group)(nil)
)
