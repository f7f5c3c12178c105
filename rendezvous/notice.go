package rendezvous

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
)

// kindNotice is a notice (Group.Notify): group key (8 bytes), uvarint
// sender's group rank, uvarint topic length, topic, text.
const kindNotice byte = 'N'

// maxNoticeText bounds a notice's text: it names a reason, not a log.
const maxNoticeText = 1024

type noticeKey struct {
	group uint64
	topic string
}

// noticeBox is the first notice on one group and topic; ch is closed when
// it arrives. Later notices on the same topic are dropped: a topic is
// one event (a communicator aborted), and its first report is the cause.
type noticeBox struct {
	ch      chan struct{}
	arrived bool
	from    int
	text    string
}

func (w *World) noticeLocked(k noticeKey) *noticeBox {
	b := w.notices[k]
	if b == nil {
		b = &noticeBox{ch: make(chan struct{})}
		w.notices[k] = b
	}
	return b
}

// Notify sends text on topic to every other member of g, in parallel over
// the members' reliable streams (through host leaders where ranks are
// attached), and returns once each has it, is gone, or ctx ends. It is how
// a member that gives up on something the group shares (an NCCL
// communicator it aborted) tells the others at once instead of leaving
// them to time out; they learn of it through Noticed. Only the first
// notice per group and topic is kept, so a topic should name one event.
func (g *Group) Notify(ctx context.Context, topic, text string) error {
	if len(text) > maxNoticeText {
		text = text[:maxNoticeText]
	}
	msg := []byte{kindNotice}
	msg = binary.BigEndian.AppendUint64(msg, g.key)
	msg = binary.AppendUvarint(msg, uint64(g.rank))
	msg = binary.AppendUvarint(msg, uint64(len(topic)))
	msg = append(append(msg, topic...), text...)
	errs := make([]error, g.n)
	var wg sync.WaitGroup
	for r := range g.n {
		if r == g.rank {
			continue
		}
		wg.Go(func() { errs[r] = g.send(ctx, "notify "+topic, r, msg) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Noticed returns a channel that is closed once another member's notice on
// topic has arrived (before or after this call), and a function that
// returns the sender's group rank and the text once it has.
func (g *Group) Noticed(topic string) (<-chan struct{}, func() (from int, text string)) {
	w := g.w
	w.mu.Lock()
	b := w.noticeLocked(noticeKey{g.key, topic})
	w.mu.Unlock()
	return b.ch, func() (int, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return b.from, b.text
	}
}

// Notify is the whole world's Group.Notify.
func (w *World) Notify(ctx context.Context, topic, text string) error {
	return w.whole.Notify(ctx, topic, text)
}

// Noticed is the whole world's Group.Noticed.
func (w *World) Noticed(topic string) (<-chan struct{}, func() (from int, text string)) {
	return w.whole.Noticed(topic)
}

// handleNotice records a notice (the message after its kind byte).
func (w *World) handleNotice(b []byte) {
	if len(b) < 8 {
		w.log.Warn().Msg("rendezvous: dropping malformed notice")
		return
	}
	key := binary.BigEndian.Uint64(b[:8])
	b = b[8:]
	from, n := binary.Uvarint(b)
	if n <= 0 {
		w.log.Warn().Msg("rendezvous: dropping malformed notice")
		return
	}
	b = b[n:]
	tl, n := binary.Uvarint(b)
	if n <= 0 || tl > uint64(len(b)-n) {
		w.log.Warn().Msg("rendezvous: dropping malformed notice")
		return
	}
	b = b[n:]
	topic, text := string(b[:tl]), string(b[tl:])
	w.mu.Lock()
	defer w.mu.Unlock()
	box := w.noticeLocked(noticeKey{key, topic})
	if box.arrived {
		return
	}
	box.arrived, box.from, box.text = true, int(from), text
	close(box.ch)
}
