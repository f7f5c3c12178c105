package rendezvous

import (
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The attach handshake is bounded (TCPTimeout) so that a stranger cannot
// hold a leader's slot, but the bound is judged on time this process
// could run: a leader stalled 1.6 s of the 2 s bound still completes the
// handshake with a rank that answers at 3 s; one that ran on time gives
// up at 2 s.
func TestHandshakeExcusesOwnStalls(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	for _, tc := range []struct {
		name    string
		stalled bool
		wantErr bool
	}{
		{"on time", false, true},
		{"stalled", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, b := net.Pipe()
				var wg sync.WaitGroup
				defer wg.Wait()
				defer a.Close()
				log := &stallLog{}
				pc := &patientConn{Conn: a, stalls: log, limit: time.Minute}
				start := time.Now()
				if tc.stalled {
					wg.Go(func() {
						time.Sleep(1900 * time.Millisecond)
						log.add(start.Add(300*time.Millisecond), start.Add(1900*time.Millisecond))
					})
				}
				wg.Go(func() {
					defer b.Close()
					time.Sleep(3 * time.Second)
					_ = handshake(b, key, false, 10*time.Second)
				})
				err := handshake(pc, key, true, 2*time.Second)
				took := time.Since(start)
				switch {
				case tc.wantErr && !errors.Is(err, os.ErrDeadlineExceeded):
					t.Errorf("handshake: %v after %v; want the deadline at 2s", err, took)
				case tc.wantErr && took != 2*time.Second:
					t.Errorf("gave up after %v, want 2s", took)
				case !tc.wantErr && err != nil:
					t.Errorf("handshake: %v after %v; want it done once the rank answered at 3s", err, took)
				}
			})
		})
	}
}
