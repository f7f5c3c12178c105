// Package outsider plays a process of another user on a job's host, as
// the chaos and security tests need one: it holds as many connections
// open to the job's ports as it is given, silent, and dials again each
// one the job closes, so that a port's gates are as full as one user can
// make them for as long as the test says.
//
// What the flood must not change (the job forms, finishes, names no
// innocent rank, stays within its bounds) belongs to the tests that use it.
package outsider

import (
	"context"
	"net"
	"sync"
	"time"
)

// Flood holds silent connections until its context ends. Its methods are
// safe for concurrent use.
type Flood struct {
	ctx context.Context
	wg  sync.WaitGroup

	mu    sync.Mutex
	dials int // connections dialed, redials included
	open  int // connections open now
	peak  int // the most open at once
}

// NewFlood returns a flood that holds its connections until ctx ends.
func NewFlood(ctx context.Context) *Flood { return &Flood{ctx: ctx} }

// Hold keeps n connections open to addr, each silent, dialing again one
// the other side closed (a failed dial is tried again after 10 ms), until
// the flood's context ends. It does not block; Wait waits. Call it
// before Wait.
func (f *Flood) Hold(addr string, n int) {
	for range n {
		f.wg.Go(func() {
			d := net.Dialer{Timeout: time.Second}
			for f.ctx.Err() == nil {
				c, err := d.DialContext(f.ctx, "tcp", addr)
				if err != nil {
					select {
					case <-f.ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				f.count(+1)
				f.keep(c)
				f.count(-1)
			}
		})
	}
}

// count records a connection opened (+1) or closed (-1).
func (f *Flood) count(delta int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if delta > 0 {
		f.dials++
	}
	f.open += delta
	f.peak = max(f.peak, f.open)
}

// keep holds c open until the other side closes it or the context ends,
// and closes it. What the other side sends is read and dropped.
func (f *Flood) keep(c net.Conn) {
	stop := context.AfterFunc(f.ctx, func() { c.Close() })
	defer func() {
		stop()
		c.Close()
	}()
	b := make([]byte, 512)
	for {
		if _, err := c.Read(b); err != nil {
			return // closed by the other side, or by the context's end
		}
	}
}

// Wait waits for the context's end and every connection's close, and
// returns how many connections were dialed in all and the most that were
// open at once.
func (f *Flood) Wait() (dials, peak int) {
	<-f.ctx.Done()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dials, f.peak
}
