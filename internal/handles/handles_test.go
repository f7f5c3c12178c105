package handles

import (
	"errors"
	"strconv"
	"sync"
	"testing"
)

func TestAddGetTake(t *testing.T) {
	tb := New[string]("executor", "freed, or never made")
	a, b := tb.Add("a"), tb.Add("b")
	if a <= 0 || b <= 0 || a == b {
		t.Fatalf("handles %d, %d: want two different positive handles", a, b)
	}
	if v, err := tb.Get(a); v != "a" || err != nil {
		t.Fatalf("Get(%d) = %q, %v", a, v, err)
	}
	if v, err := tb.Take(a); v != "a" || err != nil {
		t.Fatalf("Take(%d) = %q, %v", a, v, err)
	}
	_, err := tb.Get(a)
	var ue *UnknownError
	if !errors.As(err, &ue) || ue.Handle != a || ue.Noun != "executor" {
		t.Fatalf("Get of a taken handle: %v, want an *UnknownError for %d", err, a)
	}
	if want := "no executor " + strconv.FormatInt(a, 10) + " (freed, or never made)"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	if _, err := tb.Take(a); !errors.As(err, &ue) {
		t.Errorf("second Take of %d: %v, want an *UnknownError", a, err)
	}
	if _, err := tb.Get(0); !errors.As(err, &ue) {
		t.Errorf("Get(0): %v, want an *UnknownError", err)
	}
	tb.Drop(b)
	tb.Drop(b) // harmless
	if tb.Len() != 0 {
		t.Errorf("Len after Take and Drop = %d", tb.Len())
	}
}

// Handles are never reused: not after Take, not after Clear, and not
// across Tables, so a stale handle or one of another kind names nothing.
func TestHandlesNeverReused(t *testing.T) {
	comms, reqs := New[int]("communicator", "freed"), New[int]("request", "freed")
	seen := map[int64]bool{}
	for i := range 50 {
		for _, h := range []int64{comms.Add(i), reqs.Add(i)} {
			if seen[h] {
				t.Fatalf("handle %d given out twice", h)
			}
			seen[h] = true
		}
	}
	c := comms.Add(7)
	if _, err := reqs.Get(c); err == nil {
		t.Fatalf("a communicator's handle %d named a request", c)
	}
	comms.Clear()
	if comms.Len() != 0 {
		t.Fatalf("Len after Clear = %d", comms.Len())
	}
	if _, err := comms.Get(c); err == nil {
		t.Fatalf("handle %d still names something after Clear", c)
	}
	if n := comms.Add(8); seen[n] || n == c {
		t.Fatalf("handle %d reused after Clear", n)
	}
}

func TestTakeAll(t *testing.T) {
	tb := New[int]("matcher", "freed")
	h := tb.Add(1)
	tb.Add(2)
	all := tb.TakeAll()
	if len(all) != 2 || all[0]+all[1] != 3 || tb.Len() != 0 {
		t.Fatalf("TakeAll = %v, Len after = %d", all, tb.Len())
	}
	if _, err := tb.Get(h); err == nil {
		t.Fatalf("handle %d still names something after TakeAll", h)
	}
	if len(tb.TakeAll()) != 0 {
		t.Fatal("TakeAll of an empty table returned objects")
	}
}

// Of many callers taking one handle, exactly one gets the object (a double
// free is refused, never run twice).
func TestTakeOnce(t *testing.T) {
	tb := New[int]("request", "freed")
	for range 20 {
		h := tb.Add(1)
		var wg sync.WaitGroup
		var mu sync.Mutex
		got := 0
		for range 8 {
			wg.Go(func() {
				if _, err := tb.Take(h); err == nil {
					mu.Lock()
					got++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if got != 1 {
			t.Fatalf("handle %d taken %d times", h, got)
		}
	}
}
