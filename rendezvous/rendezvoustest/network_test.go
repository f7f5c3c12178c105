package rendezvoustest

import (
	"errors"
	"testing"

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
	if _, err := a.DialTimeout(b.Addr(), 0); !errors.Is(err, ErrRefused) {
		t.Fatalf("dial closed: %v", err)
	}
}
