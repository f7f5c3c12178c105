package rendezvoustest

import (
	"errors"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestNetwork(t *testing.T) {
	var nw Network
	a, err := nw.NewTransport("10.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := nw.NewTransport("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nw.NewTransport(b.Addr()); err == nil {
		t.Fatal("address reused")
	}
	// Packets arrive with the sender's address.
	if _, err := a.WriteTo([]byte("hi"), b.Addr()); err != nil {
		t.Fatal(err)
	}
	if p := <-b.PacketCh(); string(p.Buf) != "hi" || p.From.String() != "10.0.0.1:1" {
		t.Fatalf("packet %q from %v", p.Buf, p.From)
	}
	// Streams connect both ends.
	c, err := a.DialAddressTimeout(memberlist.Address{Addr: b.Addr()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := <-b.StreamCh()
	go func() { _, _ = c.Write([]byte("x")) }()
	buf := make([]byte, 1)
	if _, err := s.Read(buf); err != nil || buf[0] != 'x' || s.RemoteAddr().String() != "10.0.0.1:1" {
		t.Fatalf("stream read %q %v from %v", buf, err, s.RemoteAddr())
	}
	c.Close()
	s.Close()
	// Isolated: packets lost, streams unreachable; healed: back.
	nw.Isolate(b.Addr())
	_, _ = a.WriteTo([]byte("lost"), b.Addr())
	if _, err := a.DialTimeout(b.Addr(), 0); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial isolated: %v", err)
	}
	nw.Heal(b.Addr())
	select {
	case p := <-b.PacketCh():
		t.Fatalf("packet %q crossed an isolation", p.Buf)
	default:
	}
	// Shut down: refused, and queued streams are reset.
	c2, err := a.DialTimeout(b.Addr(), 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = b.Shutdown()
	if _, err := c2.Write([]byte("x")); err == nil {
		t.Fatal("write to a reset stream succeeded")
	}
	if _, err := a.DialTimeout(b.Addr(), 0); !errors.Is(err, ErrRefused) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial closed: %v, want a refusal that matches ECONNREFUSED", err)
	}
}

// A packet cut loses packets only; slow streams open late or time out; a
// full listen queue is a timeout, not a refusal (which would prove the
// listener gone).
func TestNetworkCutsAndDelays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var nw Network
		a, _ := nw.NewTransport("")
		b, _ := nw.NewTransport("")
		nw.CutPackets(b.Addr())
		_, _ = a.WriteTo([]byte("lost"), b.Addr())
		_, _ = b.WriteTo([]byte("lost"), a.Addr())
		c, err := a.DialTimeout(b.Addr(), time.Second)
		if err != nil {
			t.Fatalf("stream across a packet cut: %v", err)
		}
		c.Close()
		(<-b.StreamCh()).Close()
		nw.Heal(b.Addr())
		select {
		case p := <-b.PacketCh():
			t.Fatalf("packet %q crossed a packet cut", p.Buf)
		case p := <-a.PacketCh():
			t.Fatalf("packet %q crossed a packet cut", p.Buf)
		default:
		}

		nw.SlowStreams(a.Addr(), 300*time.Millisecond)
		start := time.Now()
		if _, err := a.DialTimeout(b.Addr(), 200*time.Millisecond); !errors.Is(err, ErrBacklog) || errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("slow dial within 200ms: %v, want a timeout", err)
		}
		if d := time.Since(start); d != 200*time.Millisecond {
			t.Fatalf("slow dial gave up after %v, want its timeout", d)
		}
		start = time.Now()
		c, err = b.DialTimeout(a.Addr(), time.Second)
		if err != nil || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("slow dial within 1s: %v after %v", err, time.Since(start))
		}
		c.Close()
		(<-a.StreamCh()).Close()
		nw.Heal(a.Addr())

		for range cap(b.streamCh) {
			if _, err := a.DialTimeout(b.Addr(), 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.DialTimeout(b.Addr(), 0); !errors.Is(err, ErrBacklog) || errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial into a full queue: %v, want a timeout", err)
		}
		_ = b.Shutdown()
	})
}
