package comm_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/comm"
)

// pairs makes the topology of point-to-point channels a torch backend
// keeps: one two-rank communicator per direction. ch[s] carries sender
// s's messages to the receiver: ch[s][0] is the receiver's end (rank 0),
// ch[s][1] the sender's (rank 1).
func pairs(t *testing.T, senders int, medium string) [][]*comm.Comm {
	t.Helper()
	ch := make([][]*comm.Comm, senders+1)
	for s := 1; s <= senders; s++ {
		switch medium {
		case "mem":
			ch[s] = newMemJob(t, 2, comm.LocalConfig()).comms
		default:
			ch[s] = newNetJob(t, 2, comm.LocalConfig(), medium == "tcp").comms
		}
	}
	return ch
}

// msg is message i of sender s: every element says who sent it and which.
func msg(s, i, n int) []int64 {
	b := make([]int64, n)
	for k := range b {
		b[k] = int64(s)<<32 | int64(i)
	}
	return b
}

// A Probe leaves the message where it is: the Recv after it receives it,
// and the next Recv the next message, in order. A second Probe while the
// message waits completes at once and keeps it too.
func TestProbeDoesNotConsume(t *testing.T) {
	for _, medium := range []string{"mem", "tcp", "shm"} {
		t.Run(medium, func(t *testing.T) {
			ch := pairs(t, 1, medium)
			rx, tx := ch[1][0], ch[1][1]
			ctx, cancel := waitCtx(t)
			defer cancel()
			// A small message, then one far above every eager limit.
			sizes := []int{3, 300_000}
			if err := tx.Send(ctx, comm.Int64s(msg(1, 0, sizes[0])), 0).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			big := tx.Send(ctx, comm.Int64s(msg(1, 1, sizes[1])), 0) // completes once received
			for range 2 {
				if err := rx.Probe(context.Background(), 1).Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for i, n := range sizes {
				got := make([]int64, n)
				if err := rx.Recv(ctx, comm.Int64s(got), 1).Wait(ctx); err != nil {
					t.Fatalf("receive %d after the probes: %v", i, err)
				}
				if want := msg(1, i, n); got[0] != want[0] || got[n-1] != want[n-1] {
					t.Fatalf("receive %d got message %x, want %x", i, got[0], want[0])
				}
				if i == 0 {
					// Probe the large message while its sender is still
					// blocked in Send.
					if err := rx.Probe(context.Background(), 1).Wait(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := big.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Two senders, each sending k messages with random pauses; the receiver
// posts 2k receives from any source, several at a time. Every message is
// received exactly once, the source reported is the sender, and each
// sender's messages arrive in the order it sent them.
func TestMatcherTwoSendersAnySource(t *testing.T) {
	for _, medium := range []string{"mem", "tcp", "shm"} {
		t.Run(medium, func(t *testing.T) {
			const k, n = 40, 5
			ch := pairs(t, 2, medium)
			m := comm.NewMatcher()
			defer m.Close()
			for s := 1; s <= 2; s++ {
				if err := m.Add(s, ch[s][0], 1); err != nil {
					t.Fatal(err)
				}
			}
			errs := onEach(t, 3, func(r int) error {
				ctx, cancel := waitCtx(t)
				defer cancel()
				if r > 0 {
					rng := rand.New(rand.NewPCG(uint64(r), 7))
					for i := range k {
						if rng.IntN(4) == 0 {
							time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
						}
						if err := ch[r][1].Send(ctx, comm.Int64s(msg(r, i, n)), 0).Wait(ctx); err != nil {
							return err
						}
					}
					return nil
				}
				return receiveAll(ctx, m, 2*k, n)
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// receiveAll posts total receives from any source, up to 4 at a time, and
// checks what they got (see TestMatcherTwoSendersAnySource).
func receiveAll(ctx context.Context, m *comm.Matcher, total, n int) error {
	next := map[int]int{} // per source: the next message index expected
	type posted struct {
		r   *comm.MatchedRecv
		buf []int64
	}
	var window []posted
	for got := 0; got < total; {
		for len(window) < 4 && got+len(window) < total {
			buf := make([]int64, n)
			window = append(window, posted{m.Recv(ctx, comm.Int64s(buf), comm.AnySource), buf})
		}
		p := window[0]
		window = window[1:]
		if err := p.r.Wait(ctx); err != nil {
			return err
		}
		src := p.r.Source()
		s, i := int(p.buf[0]>>32), int(p.buf[0]&0xffffffff)
		for _, v := range p.buf {
			if v != p.buf[0] {
				return fmt.Errorf("receive %d: mixed message %x", got, p.buf)
			}
		}
		if s != src {
			return fmt.Errorf("receive %d: message of sender %d reported from source %d", got, s, src)
		}
		if i != next[s] {
			return fmt.Errorf("receive %d: sender %d's message %d, expected %d (lost, repeated or reordered)", got, s, i, next[s])
		}
		next[s]++
		got++
	}
	return nil
}

// Receives naming a source and receives from any source are matched in
// posting order: a message goes to the first posted receive that accepts
// it, and a receive naming a source never takes another's message.
func TestMatcherNamedAndAny(t *testing.T) {
	ch := pairs(t, 2, "mem")
	m := comm.NewMatcher()
	defer m.Close()
	ctx, cancel := waitCtx(t)
	defer cancel()
	b2, bAny, b1 := make([]int64, 1), make([]int64, 1), make([]int64, 1)
	from2 := m.Recv(ctx, comm.Int64s(b2), 2)
	anyR := m.Recv(ctx, comm.Int64s(bAny), comm.AnySource)
	from1 := m.Recv(ctx, comm.Int64s(b1), 1)
	for s := 1; s <= 2; s++ {
		if err := m.Add(s, ch[s][0], 1); err != nil {
			t.Fatal(err)
		}
	}
	// Sender 1 first: its first message goes to the receive from any
	// source (posted before the one naming 1), its second to from1.
	for i := range 2 {
		if err := ch[1][1].Send(ctx, comm.Int64s(msg(1, i, 1)), 0).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := anyR.Wait(ctx); err != nil || anyR.Source() != 1 || bAny[0] != msg(1, 0, 1)[0] {
		t.Fatalf("any: %v, source %d, %x", err, anyR.Source(), bAny[0])
	}
	if err := from1.Wait(ctx); err != nil || b1[0] != msg(1, 1, 1)[0] {
		t.Fatalf("from 1: %v, %x", err, b1[0])
	}
	if from2.Done() {
		t.Fatal("the receive naming source 2 completed before source 2 sent")
	}
	if err := ch[2][1].Send(ctx, comm.Int64s(msg(2, 0, 1)), 0).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := from2.Wait(ctx); err != nil || from2.Source() != 2 || b2[0] != msg(2, 0, 1)[0] {
		t.Fatalf("from 2: %v, source %d, %x", err, from2.Source(), b2[0])
	}
}

// Close ends a Probe that waits for a message that never comes, at once,
// with ErrClosed; the peer sees an orderly close (no error from its own
// Close), and a Matcher's Close ends its unmatched receives.
func TestCloseEndsAWaitingProbe(t *testing.T) {
	for _, medium := range []string{"mem", "tcp", "shm"} {
		t.Run(medium, func(t *testing.T) {
			ch := pairs(t, 1, medium)
			rx, tx := ch[1][0], ch[1][1]
			m := comm.NewMatcher()
			if err := m.Add(1, rx, 1); err != nil {
				t.Fatal(err)
			}
			r := m.Recv(context.Background(), comm.Int64s(make([]int64, 1)), comm.AnySource)
			p := rx.Probe(context.Background(), 1)
			time.Sleep(20 * time.Millisecond) // let the probes start waiting
			m.Close()
			if err := r.Wait(context.Background()); !errors.Is(err, comm.ErrClosed) {
				t.Fatalf("unmatched receive after the Matcher's Close: %v", err)
			}
			closed := make(chan error, 1)
			go func() { closed <- rx.Close() }() // ends below, or when the job's cleanup closes tx
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close with a probe waiting: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close waits for a probe whose message never comes")
			}
			if err := p.Wait(context.Background()); !errors.Is(err, comm.ErrClosed) {
				t.Fatalf("probe after Close: %v", err)
			}
			if err := tx.Close(); err != nil {
				t.Fatalf("the peer's Close: %v", err)
			}
		})
	}
}

// A sender that closes while the receiver waits from any source fails
// the receive with the sender named; bad sources are refused.
func TestMatcherSourceFailsAndBadInput(t *testing.T) {
	ch := pairs(t, 1, "mem")
	m := comm.NewMatcher()
	defer m.Close()
	if err := m.Add(1, ch[1][0], 0); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("a source that is the receiver itself: %v", err)
	}
	if err := m.Add(1, ch[1][0], 1); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(1, ch[1][0], 1); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("a source added twice: %v", err)
	}
	if err := m.Recv(context.Background(), comm.Int64s(make([]int64, 1)), -2).Wait(context.Background()); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("receive from source -2: %v", err)
	}
	r := m.Recv(context.Background(), comm.Int64s(make([]int64, 1)), comm.AnySource)
	if err := ch[1][1].Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := waitCtx(t)
	defer cancel()
	err := r.Wait(ctx)
	if !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("receive from a sender that closed: %v", err)
	}
	t.Log(err)
}
