package wire

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// ReadMsgWithin waits across pings for a message while they come within
// the lease, returns the message with the deadline cleared, and names the
// silence once they stop.
func TestReadMsgWithin(t *testing.T) {
	const lease = 100 * time.Millisecond
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	peer, w := NewConn(a, nil), NewConn(b, nil)
	go func() { // owned: ends with its writes (the pipe closes at the test's end)
		for range 6 { // pings for 3 leases, then a message
			time.Sleep(lease / 2)
			if peer.WriteFrame(FramePing) != nil {
				return
			}
		}
		_ = peer.Send(Msg{T: "spec"})
		time.Sleep(2 * lease)
		_ = peer.Send(Msg{T: "late"}) // after twice the lease: the deadline was cleared
	}()
	start := time.Now()
	m, err := w.ReadMsgWithin(lease)
	if err != nil || m.T != "spec" || time.Since(start) < 3*lease {
		t.Fatalf("ReadMsgWithin = %+v, %v after %v; want the message after the pings", m, err, time.Since(start))
	}
	if m, err := w.ReadMsg(); err != nil || m.T != "late" {
		t.Fatalf("a read after it: %+v, %v; want the late message (no deadline left behind)", m, err)
	}
	start = time.Now()
	silent := make(chan error, 1)
	go func() { // owned: returns at the lease, or when the pipe closes
		_, err := w.ReadMsgWithin(lease)
		silent <- err
	}()
	select {
	case err = <-silent:
	case <-time.After(50 * lease):
		t.Fatalf("a silent peer: still waiting after %v, want silence named after the lease (%v)", 50*lease, lease)
	}
	if err == nil || !strings.Contains(err.Error(), "no word from the other side") || !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) < lease {
		t.Fatalf("a silent peer: %v after %v, want silence named after the lease", err, time.Since(start))
	}
}
