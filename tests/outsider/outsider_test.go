package outsider

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// A server that closes the first connections it accepts sees them dialed
// again, holds n open at once and never more, and sees every one closed
// soon after the flood's context ends; Wait counts the dials.
func TestFloodHoldsRedialsAndEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const n, refused = 4, 3
	var wg sync.WaitGroup
	defer func() {
		ln.Close()
		wg.Wait()
	}()
	held := make(chan net.Conn, n+refused)
	ended := make(chan struct{}, n+refused)
	wg.Go(func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if i < refused {
				c.Close() // the gate turns it away: the outsider must dial again
				continue
			}
			held <- c
			wg.Go(func() {
				_, _ = io.Copy(io.Discard, c) // returns when the outsider closes it
				c.Close()
				ended <- struct{}{}
			})
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	f := NewFlood(ctx)
	f.Hold(ln.Addr().String(), n)
	var conns []net.Conn
	for range n {
		select {
		case c := <-held:
			conns = append(conns, c)
		case <-time.After(10 * time.Second):
			cancel()
			t.Fatal("the flood did not hold n connections after the first were closed")
		}
	}
	select {
	case <-held:
		t.Error("the flood opened more than n connections at once")
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	var dials, peak int
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		dials, peak = f.Wait()
	}()
	select {
	case <-waited:
	case <-time.After(2 * time.Second):
		for _, c := range conns {
			c.Close() // let the flood's goroutines end
		}
		<-waited
		t.Fatal("Wait did not return within 2 s of the context's end")
	}
	for range n {
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatal("a held connection was not closed after the flood ended")
		}
	}
	if dials != n+refused || peak != n {
		t.Errorf("dials %d, peak %d; want %d and %d", dials, peak, n+refused, n)
	}
}
