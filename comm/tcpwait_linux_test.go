package comm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// On a crowded host (more of the group's ranks than CPUs) a TCP link's
// waiting reads yield the CPU between polls, when this process shares its
// session with the job's other ranks; otherwise they poll as before.
func TestTCPLinksYieldWhenCrowded(t *testing.T) {
	a, b := tcpPairs(t, 2)
	tx, rx := newTestTCPLink(a, 20*time.Microsecond), newTestTCPLink(b, 20*time.Microsecond)
	defer tx.Close()
	defer rx.Close()
	sid, err := unix.Getsid(0)
	shared := err == nil && sid != os.Getpid()
	for _, tc := range []struct {
		ranks int
		want  bool
	}{{1 << 20, shared}, {1, false}, {1 << 20, shared}} {
		markCrowded([]Link{nil, tx, rx}, tc.ranks)
		for _, l := range []*tcpLink{tx, rx} {
			for i, s := range l.st {
				if s.yield != tc.want {
					t.Errorf("%d local ranks, session shared %v: stream %d yields %v, want %v", tc.ranks, shared, i, s.yield, tc.want)
				}
			}
		}
	}
	if !shared {
		t.Log("this test process leads its session: crowded links keep polling without yielding")
	}
}

// A yielding wait receives what arrives at once, during its spin and after
// it has parked, and Close still ends it.
func TestTCPYieldingWaitDelivers(t *testing.T) {
	a, b := tcpPairs(t, 1)
	tx, rx := newTestTCPLink(a, 20*time.Microsecond), newTestTCPLink(b, 20*time.Microsecond)
	defer tx.Close()
	for _, s := range rx.st {
		s.yield = true
	}
	for i, delay := range []time.Duration{0, 50 * time.Microsecond, 3 * tcpYieldSpin, 5 * time.Millisecond} {
		want := bytes.Repeat([]byte{byte(i + 1)}, 100+i)
		got, err := sendAndReceive(tx, rx, delay, want)
		if err != nil {
			t.Fatalf("frame %d (sent after %v): %v", i, delay, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d (sent after %v): got %d bytes %x..., want %d bytes of %x", i, delay, len(got), got[:1], len(want), want[0])
		}
	}
	// A long wait parks after its spin: the process then uses next to no
	// CPU until Close, where a wait that kept polling would use it all.
	errc := make(chan error, 1)
	go func() { // waited for through errc
		var h Header
		errc <- rx.RecvHeader(&h)
	}()
	time.Sleep(10 * tcpYieldSpin)
	cpu0 := cpuTime(t)
	const idle = 200 * time.Millisecond
	time.Sleep(idle)
	if used := cpuTime(t) - cpu0; used > idle/4 {
		t.Errorf("a reader waiting %v used %v of CPU: it did not park", idle, used)
	}
	rx.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("RecvHeader after Close: %v, want net.ErrClosed", err)
	}
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime(t *testing.T) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A TCP link between two ranks on one host runs the congestion control
// TCPLocalCongestion names (reno by default), and a link to another host,
// or with "system", keeps the host's default; a name the kernel refuses
// leaves the link working on the default.
func TestTCPLocalCongestion(t *testing.T) {
	def, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Skip("no tcp_congestion_control to compare with:", err)
	}
	system := strings.TrimSpace(string(def))
	for _, tc := range []struct {
		name    string
		hosts   []string
		setting string
		want    string
	}{
		{"one host", []string{"h", "h"}, "", "reno"},
		{"one host, system", []string{"h", "h"}, "system", system},
		{"two hosts", []string{"h", "k"}, "", system},
		{"one host, refused", []string{"h", "h"}, "no-such-algorithm", system},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := []byte("congestion test secret")
			var eps []*Endpoint
			var addrs []string
			for range 2 {
				cfg := DefaultEndpointConfig()
				cfg.Addr, cfg.Secret, cfg.ForceTCP, cfg.TCPStreams = "127.0.0.1:0", secret, true, 2
				cfg.TCPLocalCongestion = tc.setting
				ep, err := Listen(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer ep.Close()
				eps, addrs = append(eps, ep), append(addrs, ep.Addr())
			}
			links := make([][]Link, 2)
			errs := make(chan error, 2)
			for r := range 2 {
				go func() { // waited for through errs
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					var err error
					links[r], err = eps[r].Connect(ctx, NewStaticGroup(r, addrs, tc.hosts), 7)
					errs <- err
				}()
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for r := range 2 {
				l := links[r][1-r].(*tcpLink)
				defer l.Close()
				for i, s := range l.st {
					if got := congestionOf(t, s.conn); got != tc.want {
						t.Errorf("rank %d, connection %d: congestion control %q, want %q", r, i, got, tc.want)
					}
				}
			}
		})
	}
}

func congestionOf(t *testing.T, c net.Conn) string {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var serr error
	if err := rc.Control(func(fd uintptr) {
		name, serr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return strings.TrimRight(name, "\x00")
}

// A yield that keeps the rank off the core longer than tcpYieldSlow (here
// a stand-in that sleeps) makes the wait park, and the next waits poll
// without yielding, twice as many after each further slow yield.
func TestTCPSlowYieldBacksOff(t *testing.T) {
	var calls int
	defer func(f func()) { schedYield = f }(schedYield)
	schedYield = func() { calls++; time.Sleep(2 * tcpYieldSlow) }
	a, b := tcpPairs(t, 1)
	tx, rx := newTestTCPLink(a, 20*time.Microsecond), newTestTCPLink(b, 20*time.Microsecond)
	defer tx.Close()
	defer rx.Close()
	s := rx.st[0]
	s.yield = true
	frame := func(i int, delay time.Duration) {
		t.Helper()
		want := []byte{byte(i), byte(i >> 8)}
		got, err := sendAndReceive(tx, rx, delay, want)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: got %x, want %x", i, got, want)
		}
	}
	frame(0, 5*time.Millisecond)
	if calls != 1 || s.yieldBack != 256 {
		t.Fatalf("after one slow yield: %d yields, next skip %d; want 1 and 256", calls, s.yieldBack)
	}
	for i := 1; i <= 100; i++ {
		frame(i, 100*time.Microsecond)
	}
	if calls != 1 {
		t.Fatalf("the 100 waits after a slow yield yielded %d more times, want none", calls-1)
	}
	for i := 101; i <= 400 && calls < 2; i++ {
		frame(i, 100*time.Microsecond)
	}
	if calls != 2 || s.yieldBack != 512 {
		t.Fatalf("after the skip: %d yields, next skip %d; want 2 and 512", calls, s.yieldBack)
	}
}

// sendAndReceive sends p from tx after delay, on a goroutine it waits for,
// while rx waits for the frame, and returns what rx received.
func sendAndReceive(tx, rx *tcpLink, delay time.Duration, p []byte) ([]byte, error) {
	sent := make(chan error, 1)
	go func() { // waited for through sent
		time.Sleep(delay)
		h := Header{Frame: frameData, Kind: KindAllReduce, Len: uint64(len(p))}
		sent <- tx.Send(&h, p)
	}()
	var h Header
	err := rx.RecvHeader(&h)
	var got []byte
	if err == nil {
		got = make([]byte, h.Len)
		err = rx.RecvPayload(got)
	}
	if serr := <-sent; err == nil {
		err = serr
	}
	return got, err
}
