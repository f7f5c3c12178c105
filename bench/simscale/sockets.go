package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/sim"
)

// The costs of real sockets between processes, which the in-process fit
// (rendezvoustest's in-memory network and attach streams) never paid: a
// UDP datagram, a message on an open TCP stream, a TCP connection's set-up
// and tear-down, and the bytes a stream carries. Each is measured between
// this process and a peer process (this binary with sockPeerEnv set) over
// loopback, with Go's netpoller at both ends as in the real code. The
// rounds are spaced by sockGap so that both processes are parked when a
// message arrives: each message pays the wake-up of an idle process, as a
// gossip packet or an attach frame between idle ranks does. The CPU of
// both processes over the rounds, less that of the same rounds with the
// same sleeps and no messages, divided by the messages.

// sockPeerEnv makes the binary measureSockets' peer: it echoes UDP
// datagrams and TCP streams on loopback, prints its two ports, and
// answers each line "cpu" on stdin with its CPU time in nanoseconds.
const sockPeerEnv = "GORUN_SIMSCALE_SOCKPEER"

const (
	sockGap    = time.Millisecond // between rounds: both ends park
	sockRounds = 1500             // rounds per figure
	sockBig    = 64 << 10         // a large stream message (per-byte cost)
)

func sockPeerMain() int {
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "simscale sockpeer:", err)
		return 1
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		_ = u.Close()
		fmt.Fprintln(os.Stderr, "simscale sockpeer:", err)
		return 1
	}
	ux, err := net.Listen("unix", fmt.Sprintf("@gorun-simscale-sockpeer-%d", os.Getpid()))
	if err != nil {
		_ = u.Close()
		_ = ln.Close()
		fmt.Fprintln(os.Stderr, "simscale sockpeer:", err)
		return 1
	}
	fmt.Printf("%d %d %s\n", u.LocalAddr().(*net.UDPAddr).Port, ln.Addr().(*net.TCPAddr).Port, ux.Addr().String())
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := u.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = u.WriteToUDP(buf[:n], from)
		}
	})
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	serve := func(l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c) // echo until the peer closes
				_ = c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			})
		}
	}
	wg.Go(func() { serve(ln) })
	wg.Go(func() { serve(ux) })
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fmt.Println(int64(cpuTime()))
	}
	_ = u.Close()
	_ = ln.Close()
	_ = ux.Close()
	mu.Lock()
	for c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
	wg.Wait()
	return 0
}

// sockPeer is the parent's handle on a running peer process.
type sockPeer struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	out            *bufio.Scanner
	udp, tcp, unix string
}

func startSockPeer() (*sockPeer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), sockPeerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &sockPeer{cmd: cmd, stdin: stdin, out: bufio.NewScanner(out)}
	if !p.out.Scan() {
		p.stop()
		return nil, fmt.Errorf("socket peer printed no ports")
	}
	ports := strings.Fields(p.out.Text())
	if len(ports) != 3 {
		p.stop()
		return nil, fmt.Errorf("socket peer printed %q, want two ports and a socket name", p.out.Text())
	}
	p.udp, p.tcp, p.unix = "127.0.0.1:"+ports[0], "127.0.0.1:"+ports[1], ports[2]
	return p, nil
}

// cpu is the peer's CPU time so far.
func (p *sockPeer) cpu() (time.Duration, error) {
	if _, err := fmt.Fprintln(p.stdin, "cpu"); err != nil {
		return 0, err
	}
	if !p.out.Scan() {
		return 0, fmt.Errorf("socket peer: no CPU answer")
	}
	ns, err := strconv.ParseInt(p.out.Text(), 10, 64)
	return time.Duration(ns), err
}

// stop closes the peer's stdin (it exits) and reaps it.
func (p *sockPeer) stop() {
	_ = p.stdin.Close()
	_ = p.cmd.Wait()
}

// both runs round rounds times, sockGap apart, and returns the CPU of
// both processes over them.
func (p *sockPeer) both(rounds int, round func() error) (time.Duration, error) {
	pc0, err := p.cpu()
	if err != nil {
		return 0, err
	}
	c0 := cpuTime()
	for range rounds {
		time.Sleep(sockGap)
		if err := round(); err != nil {
			return 0, err
		}
	}
	c1 := cpuTime()
	pc1, err := p.cpu()
	if err != nil {
		return 0, err
	}
	return c1 - c0 + pc1 - pc0, nil
}

// sockFigures is one measurement of every socket cost, per message (both
// ends, beyond idle).
type sockFigures struct {
	udp, msg, conn, big time.Duration
	umsg, uconn         time.Duration // on a Unix stream (attach streams)
}

// measureSocketsOnce measures each figure once against one peer, over
// rounds rounds each.
func measureSocketsOnce(rounds, pingBytes, frameBytes int) (sockFigures, error) {
	var f sockFigures
	p, err := startSockPeer()
	if err != nil {
		return f, err
	}
	defer p.stop()
	idle, err := p.both(rounds, func() error { return nil })
	if err != nil {
		return f, err
	}
	per := func(cpu time.Duration, msgs int) time.Duration {
		return max(cpu-idle, 0) / time.Duration(rounds*msgs)
	}
	u, err := net.Dial("udp4", p.udp)
	if err != nil {
		return f, err
	}
	defer u.Close()
	ping, buf := make([]byte, pingBytes), make([]byte, sockBig)
	cpu, err := p.both(rounds, func() error {
		if _, err := u.Write(ping); err != nil {
			return err
		}
		_ = u.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := u.Read(buf)
		return err
	})
	if err != nil {
		return f, fmt.Errorf("udp round: %w", err)
	}
	f.udp = per(cpu, 2)
	exchange := func(c net.Conn, b []byte) error {
		if _, err := c.Write(b); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf[:len(b)])
		return err
	}
	frame, big := make([]byte, frameBytes), make([]byte, sockBig)
	stream := func(network, addr string, withBig bool) (msg, bg, conn time.Duration, err error) {
		t, err := net.Dial(network, addr)
		if err != nil {
			return 0, 0, 0, err
		}
		defer t.Close()
		cpu, err := p.both(rounds, func() error { return exchange(t, frame) })
		if err != nil {
			return 0, 0, 0, fmt.Errorf("%s round: %w", network, err)
		}
		msg = per(cpu, 2)
		if withBig {
			if cpu, err = p.both(rounds, func() error { return exchange(t, big) }); err != nil {
				return 0, 0, 0, fmt.Errorf("%s %d B round: %w", network, sockBig, err)
			}
			bg = per(cpu, 2)
		}
		cpu, err = p.both(rounds, func() error {
			c, err := net.Dial(network, addr)
			if err != nil {
				return err
			}
			defer c.Close()
			return exchange(c, frame)
		})
		if err != nil {
			return 0, 0, 0, fmt.Errorf("%s connect round: %w", network, err)
		}
		return msg, bg, per(cpu, 1), nil // one connection and one exchange per round
	}
	if f.msg, f.big, f.conn, err = stream("tcp4", p.tcp, true); err != nil {
		return f, err
	}
	f.umsg, _, f.uconn, err = stream("unix", p.unix, false)
	return f, err
}

// measureSocketCosts measures the socket costs (median of runs, each
// figure on its own) and sets them in c with their sources.
func measureSocketCosts(c *sim.Costs, runs int, logf func(string, ...any)) error {
	var all []sockFigures
	for range runs {
		f, err := measureSocketsOnce(sockRounds, c.PingBytes, c.TableEntryBytes)
		if err != nil {
			return fmt.Errorf("socket costs: %w", err)
		}
		logf("  sockets: udp %d B %v, tcp %d B %v, tcp %d B %v, tcp connect+exchange+close %v, unix %d B %v, unix connect+exchange+close %v (per message, both ends)",
			c.PingBytes, f.udp, c.TableEntryBytes, f.msg, sockBig, f.big, f.conn, c.TableEntryBytes, f.umsg, f.uconn)
		all = append(all, f)
	}
	med := func(get func(sockFigures) time.Duration) time.Duration {
		v := make([]time.Duration, len(all))
		for i, f := range all {
			v[i] = get(f)
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[(len(v)-1)/2]
	}
	udp, msg := med(func(f sockFigures) time.Duration { return f.udp }), med(func(f sockFigures) time.Duration { return f.msg })
	big, conn := med(func(f sockFigures) time.Duration { return f.big }), med(func(f sockFigures) time.Duration { return f.conn })
	c.SockPacket, c.SockMsg = max(udp, 1), max(msg, 1)
	c.SockByte = max((big-msg)/time.Duration(sockBig-c.TableEntryBytes), 1)
	c.SockConnect = max(conn-2*msg, 1)
	umsg, uconn := med(func(f sockFigures) time.Duration { return f.umsg }), med(func(f sockFigures) time.Duration { return f.uconn })
	c.UnixMsg, c.UnixConnect = max(umsg, 1), max(uconn-2*umsg, 1)
	how := fmt.Sprintf("two processes over loopback (this one and a peer process of the same binary, Go's netpoller at both ends), %d rounds %v apart so that both ends are parked when each message arrives (a wake-up each), the CPU of both processes (getrusage) less that of the same rounds with no message, median of %d", sockRounds, sockGap, runs)
	c.Source["sock_packet_ns"] = fmt.Sprintf("a %d B UDP datagram echoed: per datagram, both ends; %s", c.PingBytes, how)
	c.Source["sock_msg_ns"] = fmt.Sprintf("a %d B message echoed on an open TCP stream: per message, both ends; %s", c.TableEntryBytes, how)
	c.Source["sock_byte_ns"] = fmt.Sprintf("(a %d B message's cost − a %d B one's) ÷ the bytes between, on the same stream (%.2f ns here; a figure below 1 ns is charged as 1 ns, an upper bound); %s",
		sockBig, c.TableEntryBytes, float64(big-msg)/float64(sockBig-c.TableEntryBytes), how)
	c.Source["unix_msg_ns"] = fmt.Sprintf("a %d B message echoed on an open abstract Unix stream (an attach stream's kind): per message, both ends; %s", c.TableEntryBytes, how)
	c.Source["unix_connect_ns"] = fmt.Sprintf("an abstract Unix stream's connect, accept, one %d B exchange and close per round, less the exchange's two messages; %s", c.TableEntryBytes, how)
	c.Source["sock_connect_ns"] = fmt.Sprintf("a TCP connect, accept, one %d B exchange and close per round, less the exchange's two messages; %s", c.TableEntryBytes, how)
	return nil
}
