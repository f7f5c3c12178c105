package hostagent

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/wire"
)

// An agent whose connection gorun closes before the handshake ends (as
// gorun's flooded port evicts unproven connections) dials again and gets
// in; a wrong secret is final and not retried.
func TestConnectAuthReconnectsWhenCut(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close() // before the wait: ends the accept loop on failure
	accepted := 0
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted++
			if accepted <= 3 {
				c.Close() // evicted before a word
				continue
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := wire.AcceptAuth(c, secret, "job1", func(h string) bool { return h == "n1" }); err != nil {
				t.Errorf("gorun side: %v", err)
			}
			c.Close()
			return
		}
	})
	start := time.Now()
	c, _, err := connectAuth(ln.Addr().String(), secret, "job1", "n1", zerolog.Nop())
	if err != nil {
		t.Errorf("agent after 3 cut connections: %v", err)
		return
	}
	c.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("3 reconnects took %v, want well under a second", d)
	}
	wg.Wait()
	if accepted != 4 {
		t.Errorf("gorun saw %d connections, want 4", accepted)
	}

	// A wrong secret is an answer, not a cut: one attempt, then an error.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	n := 0
	wg.Go(func() {
		for {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			n++
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _, _ = wire.AcceptAuth(c, []byte("another secret"), "job1", func(string) bool { return true })
			c.Close()
		}
	})
	if _, _, err := connectAuth(ln2.Addr().String(), secret, "job1", "n1", zerolog.Nop()); err == nil {
		t.Fatal("an agent with the wrong secret got in")
	}
	ln2.Close()
	wg.Wait()
	if n != 1 {
		t.Errorf("a refused agent dialed %d times, want 1", n)
	}
}
