package rendezvous

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// arrive fails the test if ch is not closed within a (fake) minute.
func arrive(t *testing.T, ch <-chan struct{}, who string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: no notice", who)
	}
}

// A notice reaches every other member of the group it was sent on, also
// one that asks for it only after it arrived; members of another group, and
// another topic, see nothing; only the first notice on a topic counts.
func TestNotifyReachesTheGroup(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const n = 5
		ws, _ := formMem(t, n, nil)
		defer closeAll(ws)
		ctx := context.Background()
		gs := make([]*Group, n)
		for _, w := range ws {
			g, err := w.Group([]int{4, 2, 0}) // members 0, 2, 4; group ranks 2, 1, 0
			if err == nil {
				gs[w.Rank()] = g
			}
		}
		early, _ := gs[0].Noticed("topic") // asked before, on world rank 0
		// World rank 2 (group rank 1) sends; then a second notice on the
		// same topic from world rank 4, which must not replace it.
		if err := gs[2].Notify(ctx, "topic", "first"); err != nil {
			t.Fatal(err)
		}
		// Notify returns once the notice is on its way, not delivered:
		// the second is sent once the first has arrived everywhere, or
		// two ranks' notices race (their paths through the host leader
		// are separate streams) and "first" is not first.
		arrive(t, early, "world rank 0, asked early")
		on4, _ := gs[4].Noticed("topic")
		arrive(t, on4, "world rank 4")
		if err := gs[4].Notify(ctx, "topic", "second"); err != nil {
			t.Fatal(err)
		}
		arrive(t, early, "world rank 0, asked early")
		for _, r := range []int{0, 4} {
			ch, get := gs[r].Noticed("topic") // asked after
			arrive(t, ch, fmt.Sprint("world rank ", r))
			if from, text := get(); from != 1 || text != "first" {
				t.Errorf("world rank %d: notice from group rank %d: %q, want 1 and \"first\"", r, from, text)
			}
		}
		for _, tc := range []struct {
			what string
			ch   <-chan struct{}
		}{
			{"another topic", func() <-chan struct{} { ch, _ := gs[0].Noticed("other"); return ch }()},
			{"the whole world", func() <-chan struct{} { ch, _ := ws[1].Noticed("topic"); return ch }()},
		} {
			select {
			case <-tc.ch:
				t.Errorf("%s saw the group's notice", tc.what)
			default:
			}
		}
		// The world's own notices work the same way.
		if err := ws[3].Notify(ctx, "w", fmt.Sprint("from ", 3)); err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if w.Rank() == 3 {
				continue
			}
			ch, get := w.Noticed("w")
			arrive(t, ch, fmt.Sprint("world rank ", w.Rank(), " (world notice)"))
			if from, text := get(); from != 3 || text != "from 3" {
				t.Errorf("world rank %d: %d %q", w.Rank(), from, text)
			}
		}
	})
}
