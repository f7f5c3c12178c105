package launcher

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// newSpareHost is gorun's end of an idle spare's connection (net.Pipe:
// no kernel buffer, so a frame is read exactly as the agent writes it)
// with its watch running; the agent's end is returned.
func newSpareHost(t *testing.T, lease time.Duration) (*spareHost, *wire.Conn, net.Conn) {
	t.Helper()
	gorunEnd, agentEnd := net.Pipe()
	t.Cleanup(func() { gorunEnd.Close(); agentEnd.Close() })
	s := &spareHost{c: &hostConn{w: wire.NewConn(gorunEnd, nil)}, stop: make(chan struct{}), done: make(chan struct{})}
	s.halt = sync.OnceFunc(func() { close(s.stop) })
	go func() { // owned: ends when the spare is taken or its connection fails
		s.lost = s.watch(lease)
		close(s.done)
	}()
	return s, wire.NewConn(agentEnd, nil), agentEnd
}

// An idle spare's watch says why it is gone: silence past the lease, or
// its connection closing.
func TestSpareWatchLoss(t *testing.T) {
	const lease = 150 * time.Millisecond
	s, _, _ := newSpareHost(t, lease)
	start := time.Now()
	<-s.done
	if took := time.Since(start); s.lost == nil || !strings.Contains(s.lost.Error(), "no word from its agent") || took < lease {
		t.Errorf("a silent spare: %v after %v, want silence named after the lease (%v)", s.lost, took, lease)
	}
	if err := s.take(); err != s.lost {
		t.Errorf("take after the loss: %v, want the loss", err)
	}

	s, _, agentEnd := newSpareHost(t, time.Minute)
	agentEnd.Close()
	<-s.done
	if s.lost == nil || !strings.Contains(s.lost.Error(), "connection to its agent closed") {
		t.Errorf("a spare whose agent hung up: %v", s.lost)
	}
}

// Taking a spare over while its agent pings stops the watch between
// frames, never within one: the frames that follow (the running host's
// reader reads them) arrive whole, and pings keep the spare alive past
// several leases before that.
func TestSpareTakeCutsNoFrame(t *testing.T) {
	const lease = 100 * time.Millisecond
	s, agent, _ := newSpareHost(t, lease)
	stop := make(chan struct{})
	var pinging, wg sync.WaitGroup
	pinging.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// A ping written byte by byte: over net.Pipe each byte is a
			// read of its own, so a watch stopped mid-frame would leave
			// the rest for the next reader.
			if _, err := agent.NetConn().Write([]byte{wire.FramePing}); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
			if _, err := agent.NetConn().Write([]byte{0, 0, 0, 0}); err != nil {
				return
			}
		}
	})
	time.Sleep(3 * lease)
	select {
	case <-s.done:
		t.Fatalf("a pinging spare was lost: %v", s.lost)
	default:
	}
	if err := s.take(); err != nil {
		t.Fatalf("take: %v", err)
	}
	close(stop)
	// The agent's next frames: the rest of the ping it was writing, then
	// a message; the new reader must see whole frames.
	wg.Go(func() {
		pinging.Wait()
		_ = agent.Send(wire.Msg{T: "event"})
	})
	for {
		typ, p, err := s.c.w.ReadFrame(nil)
		if err != nil {
			t.Fatalf("the reader after the take: %v", err)
		}
		if typ == wire.FramePing && len(p) == 0 {
			continue
		}
		if typ != wire.FrameMsg || !strings.Contains(string(p), `"t":"event"`) {
			t.Fatalf("the reader after the take read frame %q %q: a frame was cut", typ, p)
		}
		break
	}
	wg.Wait()
}
