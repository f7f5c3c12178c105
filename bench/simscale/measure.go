package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// The real rendezvous code, run in this process over rendezvoustest's
// in-memory network with every packet and stream byte counted: the source
// of the simulator's costs (measureCosts) and of its calibration rows.

// traffic counts what crossed the gossip network and the attach streams.
type traffic struct {
	packets, packetBytes     atomic.Int64
	streams, streamBytes     atomic.Int64
	maxStream                atomic.Int64
	attachConns, attachBytes atomic.Int64
}

// countedConn counts both directions of a stream, as seen by its dialer.
type countedConn struct {
	net.Conn
	n     atomic.Int64
	live  *atomic.Int64 // also counts here as bytes pass, when set
	close func(n int64)
	once  sync.Once
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.add(n)
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.add(n)
	return n, err
}

func (c *countedConn) add(n int) {
	c.n.Add(int64(n))
	if c.live != nil {
		c.live.Add(int64(n))
	}
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.close(c.n.Load()) })
	return c.Conn.Close()
}

// countingTransport is a gossip transport whose packets and dialled
// streams are counted.
type countingTransport struct {
	memberlist.NodeAwareTransport
	t *traffic
}

func (c *countingTransport) WriteTo(b []byte, a string) (time.Time, error) {
	c.t.packets.Add(1)
	c.t.packetBytes.Add(int64(len(b)))
	return c.NodeAwareTransport.WriteTo(b, a)
}

func (c *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	c.t.packets.Add(1)
	c.t.packetBytes.Add(int64(len(b)))
	return c.NodeAwareTransport.WriteToAddress(b, a)
}

func (c *countingTransport) stream(conn net.Conn) net.Conn {
	c.t.streams.Add(1)
	return &countedConn{Conn: conn, close: func(n int64) {
		c.t.streamBytes.Add(n)
		for {
			m := c.t.maxStream.Load()
			if n <= m || c.t.maxStream.CompareAndSwap(m, n) {
				return
			}
		}
	}}
}

func (c *countingTransport) DialTimeout(a string, d time.Duration) (net.Conn, error) {
	conn, err := c.NodeAwareTransport.DialTimeout(a, d)
	if err != nil {
		return nil, err
	}
	return c.stream(conn), nil
}

func (c *countingTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	conn, err := c.NodeAwareTransport.DialAddressTimeout(a, d)
	if err != nil {
		return nil, err
	}
	return c.stream(conn), nil
}

// countingAttach is one rank's attach network: it counts the stream's
// bytes (dialler's side) and keeps the stream, so that sever can close it
// as the rank's crash would.
type countingAttach struct {
	*rendezvoustest.AttachNet
	t    *traffic
	mu   sync.Mutex
	last net.Conn
}

func (a *countingAttach) Dial(ctx context.Context, name string) (net.Conn, error) {
	conn, err := a.AttachNet.Dial(ctx, name)
	if err != nil {
		return nil, err
	}
	a.t.attachConns.Add(1)
	c := &countedConn{Conn: conn, live: &a.t.attachBytes, close: func(int64) {}}
	a.mu.Lock()
	a.last = c
	a.mu.Unlock()
	return c, nil
}

// sever closes the rank's stream to its leader.
func (a *countingAttach) sever() {
	a.mu.Lock()
	c := a.last
	a.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// realRun is one formation of the real code: wall and CPU time of the
// formation (first Join to last return), and what crossed the wire.
type realRun struct {
	hosts, per             int
	formation, cpu         time.Duration
	packets, packetBytes   int64
	streams, streamBytes   int64
	maxStream              int64
	attachBytes            int64
	idle                   time.Duration // length of the idle window (0: none)
	idleCPU                time.Duration
	idlePackets, idleBytes int64
	detectRank, detectHost time.Duration // 0: not measured
}

// runReal forms a world of hosts × per ranks (host leaders), then, when
// idle > 0, leaves it idle that long and counts what it costs; with detect
// it then severs one attached rank's stream and cuts one host off, timing
// how long the last surviving rank takes to see each.
func runReal(hosts, per int, idle time.Duration, detect bool) (realRun, error) {
	res := realRun{hosts: hosts, per: per}
	n := hosts * per
	nw := &rendezvoustest.Network{}
	an := &rendezvoustest.AttachNet{}
	var tr traffic
	cfgs := make([]rendezvous.Config, n)
	addrs := make([]string, hosts)
	conns := make([]*countingAttach, n)
	for r := range cfgs {
		c := rendezvous.DefaultConfig()
		c.JobID, c.Rank, c.WorldSize = "simscale", r, n
		c.Host = fmt.Sprintf("h%d", r/per)
		c.LocalRank, c.LocalWorldSize = r%per, per
		c.Seed = "10.0.0.1:7946"
		c.Secret = []byte("0123456789abcdef0123456789abcdef")
		c.FormationTimeout = 60 * time.Second
		c.Logger = zerolog.New(os.Stderr).Level(zerolog.ErrorLevel + 1)
		if idle > 0 && !detect {
			// No attach beats in the idle window: what is left is
			// gossip's own traffic.
			c.AttachBeat, c.AttachLease = 10*time.Second, 30*time.Second
		}
		conns[r] = &countingAttach{AttachNet: an, t: &tr}
		c.AttachNet = conns[r]
		if r%per == 0 {
			h := r / per
			addrs[h] = fmt.Sprintf("10.%d.%d.%d:7946", h/62500, h/250%250, h%250+1)
			t, err := nw.NewTransport(addrs[h])
			if err != nil {
				return res, err
			}
			c.Transport = &countingTransport{NodeAwareTransport: t, t: &tr}
		}
		cfgs[r] = c
	}
	ws := make([]*rendezvous.World, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	cpu0, start := cpuTime(), time.Now()
	for r := range cfgs {
		wg.Go(func() { ws[r], errs[r] = rendezvous.Join(context.Background(), cfgs[r]) })
	}
	wg.Wait()
	res.formation, res.cpu = time.Since(start), cpuTime()-cpu0
	defer func() {
		var cw sync.WaitGroup
		for _, w := range ws {
			if w != nil {
				cw.Go(func() { _ = w.Close() })
			}
		}
		cw.Wait()
	}()
	for r, err := range errs {
		if err != nil {
			return res, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	res.packets, res.packetBytes = tr.packets.Load(), tr.packetBytes.Load()
	res.streams, res.streamBytes = tr.streams.Load(), tr.streamBytes.Load()
	res.maxStream, res.attachBytes = tr.maxStream.Load(), tr.attachBytes.Load()
	if idle > 0 {
		time.Sleep(time.Second) // the seed's pushes and formation's gossip drain
		p0, b0, c0 := tr.packets.Load(), tr.packetBytes.Load(), cpuTime()
		time.Sleep(idle)
		res.idle, res.idleCPU = idle, cpuTime()-c0
		res.idlePackets, res.idleBytes = tr.packets.Load()-p0, tr.packetBytes.Load()-b0
	}
	if detect {
		var err error
		victim := per + 1 // an attached rank of host 1
		if res.detectRank, err = lastToSee(ws, victim, []int{victim}, func() { conns[victim].sever() }); err != nil {
			return res, err
		}
		time.Sleep(time.Second)
		host := hosts / 2
		skip := []int{victim}
		for r := host * per; r < (host+1)*per; r++ {
			skip = append(skip, r)
		}
		res.detectHost, err = lastToSee(ws, host*per, skip, func() {
			nw.Isolate(addrs[host])
			for _, r := range skip[2:] {
				conns[r].sever()
			}
		})
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// lastToSee runs cut and returns how long the last rank outside skip took
// to get the MemberLost event for victim.
func lastToSee(ws []*rendezvous.World, victim int, skip []int, cut func()) (time.Duration, error) {
	var last atomic.Int64
	var missed atomic.Int32
	start := time.Now()
	cut()
	var wg sync.WaitGroup
	for r, w := range ws {
		if contains(skip, r) {
			continue
		}
		wg.Go(func() {
			timeout := time.After(30 * time.Second)
			for {
				select {
				case ev := <-w.Events():
					if ev.Kind != rendezvous.MemberLost || ev.Rank != victim {
						continue
					}
					d := int64(time.Since(start))
					for {
						m := last.Load()
						if d <= m || last.CompareAndSwap(m, d) {
							return
						}
					}
				case <-timeout:
					missed.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	if m := missed.Load(); m > 0 {
		return 0, fmt.Errorf("%d ranks did not see rank %d lost within 30 s", m, victim)
	}
	return time.Duration(last.Load()), nil
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// cpuTime is this process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// medianRun runs runReal rounds times and keeps the run of median CPU.
func medianRun(rounds, hosts, per int, idle time.Duration) (realRun, error) {
	var runs []realRun
	for range rounds {
		r, err := runReal(hosts, per, idle, false)
		if err != nil {
			return r, fmt.Errorf("%d×%d: %w", hosts, per, err)
		}
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].cpu < runs[j].cpu })
	return runs[(len(runs)-1)/2], nil
}
