package rendezvous

// Event delivery. memberlist's callbacks must never block, and a user may
// read World.Events slowly or not at all: callbacks queue events under
// World.mu (queueEventLocked) and one dispatcher goroutine, owned by
// World.wg, hands them to the channel outside the lock. Waiters for a
// change of the member count wait on World.changed, which is closed and
// replaced (signalChangeLocked) rather than sent on, so any number of them
// wake and none can be missed.

// dispatch delivers queued events to the Events channel, so that memberlist's
// callbacks never block on a reader.
func (w *World) dispatch() {
	defer close(w.events)
	for {
		w.mu.Lock()
		evs := w.pending
		w.pending = nil
		w.mu.Unlock()
		for _, e := range evs {
			select {
			case w.events <- e:
			case <-w.stop:
				return
			}
		}
		select {
		case <-w.wake:
		case <-w.stop:
			return
		}
	}
}

// signalChangeLocked wakes everyone waiting for a change of alive.
func (w *World) signalChangeLocked() {
	// Made only when someone waits (changedLocked): forming a world of N
	// changes the count N times, and a channel each was N² channels across
	// a host's ranks.
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

// changedLocked returns the channel the next change of the member count
// closes.
func (w *World) changedLocked() <-chan struct{} {
	if w.changed == nil {
		w.changed = make(chan struct{})
	}
	return w.changed
}

// queueEventLocked hands an event to the dispatcher.
func (w *World) queueEventLocked(e Event) {
	w.pending = append(w.pending, e)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
