package wire

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// A spare host's agent (a --fault-tolerant job's host that waits,
// rankless, to take a lost host's ranks over) has nothing to say until it
// is used, yet each side must learn within a lease that the other is gone
// or cut off, as on a host that runs ranks. gorun says "spare" once it has
// the spare's hello and a plan; from then on both sides ping every
// lease/4, and a side that hears no frame for a lease treats the other
// as gone: gorun no longer offers the spare, and the agent ends.

// ReadMsgWithin is ReadMsg on a connection whose peer pings: it fails, with
// an error that says how long it heard nothing, when no frame (pings
// included) arrives for lease. A reader that was itself late past the
// deadline (a starved process) first gives the peer as much more time, up
// to another lease, since what the peer sent may wait unread in the
// kernel's buffer. The read deadline is cleared before a message returns.
func (w *Conn) ReadMsgWithin(lease time.Duration) (Msg, error) {
	for {
		deadline := time.Now().Add(lease)
		_ = w.c.SetReadDeadline(deadline)
		_, err := w.br.Peek(1)
		if late := time.Since(deadline); err != nil && isTimeout(err) && late > lease/16 {
			_ = w.c.SetReadDeadline(time.Now().Add(min(late, lease)))
			_, err = w.br.Peek(1)
		}
		if err != nil {
			if isTimeout(err) {
				return Msg{}, fmt.Errorf("no word from the other side for %s (lease %s): %w", time.Since(deadline.Add(-lease)).Round(time.Millisecond), lease, err)
			}
			return Msg{}, err
		}
		// A frame is arriving: the rest of it gets a lease too.
		_ = w.c.SetReadDeadline(time.Now().Add(lease))
		typ, p, err := w.ReadFrame(nil)
		if err != nil {
			return Msg{}, err
		}
		if m, ok, err := setupMsg(typ, p); ok || err != nil {
			_ = w.c.SetReadDeadline(time.Time{})
			return m, err
		}
	}
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
