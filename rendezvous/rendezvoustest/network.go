// Package rendezvoustest provides an in-memory network for memberlist, with
// fault injection, so that worlds of many members form, fail and heal inside
// one test process, deterministically under testing/synctest.
//
// memberlist ships a MockNetwork, but it is not safe for concurrent use
// (transports added while others run race on its maps), it blocks a sender
// forever when the receiver has shut down (unbuffered channels), and it
// cannot cut a member off. This network behaves like UDP and TCP on a LAN:
// packets are dropped rather than queued without bound, and streams to a
// closed or cut-off address are refused.
//
// Use it through rendezvous.Config.Transport: one Transport per member, the
// seed being rank 0's transport address.
package rendezvoustest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network connects Transports by address. The zero value is ready to use;
// all methods are safe for concurrent use.
type Network struct {
	mu       sync.Mutex
	nodes    map[string]*Transport    // by "ip:port"; removed on Shutdown
	isolated map[string]bool          // addresses cut off from everyone
	udpCut   map[string]bool          // addresses whose packets are lost (CutPackets)
	slow     map[string]time.Duration // addresses whose new streams are slow to open (SlowStreams)
	next     int                      // for NewTransport's automatic addresses
}

// Errors a dial returns, as a real network would report them. ErrRefused
// matches syscall.ECONNREFUSED with errors.Is, as a real refused dial does:
// nothing listens at a live host's address. A full listen queue is not a
// refusal (the kernel drops the SYN): ErrBacklog, a timeout.
var (
	ErrRefused     = fmt.Errorf("rendezvoustest: connection refused (%w)", syscall.ECONNREFUSED)
	ErrUnreachable = errors.New("rendezvoustest: network unreachable")
	ErrBacklog     = errors.New("rendezvoustest: connection timed out (listen queue full)")
)

// packetQueue is a member's receive buffer, like a UDP socket's: beyond it
// packets are dropped.
const packetQueue = 4096

// NewTransport returns a transport at addr ("ip:port"), or at a fresh
// address 10.255.x.y:7946 when addr is empty. An address in use is an error.
func (n *Network) NewTransport(addr string) (*Transport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nodes == nil {
		n.nodes = make(map[string]*Transport)
		n.isolated = make(map[string]bool)
	}
	if addr == "" {
		n.next++
		addr = fmt.Sprintf("10.255.%d.%d:7946", n.next/250, n.next%250+1)
	}
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	port, err := strconv.Atoi(ps)
	if ip == nil || err != nil {
		return nil, fmt.Errorf("rendezvoustest: bad address %q", addr)
	}
	if _, used := n.nodes[addr]; used {
		return nil, fmt.Errorf("rendezvoustest: address %s in use", addr)
	}
	t := &Transport{
		net: n, addr: addr, ip: ip, port: port,
		packetCh: make(chan *memberlist.Packet, packetQueue),
		// memberlist accepts streams one at a time and hands each to a
		// goroutine; a modest backlog, like a listen queue.
		streamCh: make(chan net.Conn, 256),
	}
	n.nodes[addr] = t
	return t, nil
}

// Isolate cuts addr off: packets to and from it are dropped and new streams
// refused, as when a host's link goes down. Streams already open continue.
func (n *Network) Isolate(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.isolated == nil {
		n.isolated = make(map[string]bool)
	}
	n.isolated[addr] = true
}

// Heal undoes Isolate, CutPackets and SlowStreams.
func (n *Network) Heal(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.isolated, addr)
	delete(n.udpCut, addr)
	delete(n.slow, addr)
}

// CutPackets drops every packet to and from addr while streams still work,
// as a firewall that drops a host's UDP does: memberlist's probes and gossip
// are lost, its TCP fallback probes and push-pulls are not.
func (n *Network) CutPackets(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.udpCut == nil {
		n.udpCut = make(map[string]bool)
	}
	n.udpCut[addr] = true
}

// SlowStreams makes every new stream to or from addr take d to open, as on
// a host too loaded to accept in time: memberlist's TCP fallback probe, due
// within one probe interval, then misses, while a push-pull (TCPTimeout)
// still gets through.
func (n *Network) SlowStreams(addr string, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.slow == nil {
		n.slow = make(map[string]time.Duration)
	}
	n.slow[addr] = d
}

// packetLost reports whether a packet from src to dst is dropped by
// CutPackets.
func (n *Network) packetLost(src, dst string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.udpCut[src] || n.udpCut[dst]
}

// streamDelay is how long a new stream from src to dst takes to open.
func (n *Network) streamDelay(src, dst string) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return max(n.slow[src], n.slow[dst])
}

// route returns the destination for a message from src to dst, or an error.
func (n *Network) route(src, dst string) (*Transport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.isolated[src] || n.isolated[dst] {
		return nil, fmt.Errorf("%w: %s -> %s", ErrUnreachable, src, dst)
	}
	t := n.nodes[dst]
	if t == nil {
		return nil, fmt.Errorf("%w: %s", ErrRefused, dst)
	}
	return t, nil
}

// Transport is one member's endpoint; it implements memberlist's
// NodeAwareTransport.
type Transport struct {
	net      *Network
	addr     string
	ip       net.IP
	port     int
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Addr returns the transport's "ip:port".
func (t *Transport) Addr() string { return t.addr }

// FinalAdvertiseAddr ignores its arguments: the transport's address is the
// only one it has.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, t.port, nil
}

// WriteTo sends a packet; like UDP it succeeds even when the packet is lost.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends a packet to a.Addr (the name is not used: two members
// with one name must stay two endpoints, as on a real network).
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dst, err := t.net.route(t.addr, a.Addr)
	if err != nil || t.net.packetLost(t.addr, a.Addr) {
		return now, nil // lost, as UDP would lose it
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: addr(t.addr), Timestamp: now}
	select {
	case dst.packetCh <- p:
	default: // receive buffer full: dropped
	}
	return now, nil
}

// PacketCh delivers incoming packets.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout opens a stream to addr.
func (t *Transport) DialTimeout(a string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: a}, timeout)
}

// DialAddressTimeout opens a stream to a.Addr: an in-memory pipe whose far
// end the destination's memberlist accepts.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if d := t.net.streamDelay(t.addr, a.Addr); d > 0 {
		if d >= timeout {
			time.Sleep(timeout)
			return nil, fmt.Errorf("%w: %s (opening takes %v)", ErrBacklog, a.Addr, d)
		}
		time.Sleep(d)
	}
	dst, err := t.net.route(t.addr, a.Addr)
	if err != nil {
		return nil, err
	}
	local, remote := net.Pipe()
	if err := t.net.enqueue(dst, conn{remote, addr(t.addr), addr(dst.addr)}); err != nil {
		local.Close()
		remote.Close()
		return nil, fmt.Errorf("%w: %s", err, a.Addr)
	}
	return conn{local, addr(dst.addr), addr(t.addr)}, nil
}

// enqueue hands a stream to dst's listener unless dst has shut down
// (ErrRefused) or its backlog is full (ErrBacklog). Under the network lock,
// so that Shutdown cannot leave a stream queued that nobody will ever
// accept (its dialer would block forever on the synchronous pipe).
func (n *Network) enqueue(dst *Transport, c net.Conn) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nodes[dst.addr] != dst {
		return ErrRefused
	}
	select {
	case dst.streamCh <- c:
		return nil
	default:
		return ErrBacklog
	}
}

// StreamCh delivers incoming streams.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown takes the address off the network: later packets to it are lost
// and streams refused, as for a process that exited.
func (t *Transport) Shutdown() error {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.net.nodes[t.addr] == t {
		delete(t.net.nodes, t.addr)
	}
	// Streams queued but never accepted are reset, as the kernel resets a
	// closed listener's backlog.
	for {
		select {
		case c := <-t.streamCh:
			c.Close()
		default:
			return nil
		}
	}
}

// addr is a net.Addr for an "ip:port" string.
type addr string

func (a addr) Network() string { return "mem" }
func (a addr) String() string  { return string(a) }

// conn is a pipe end that reports addresses (net.Pipe's say "pipe"), which
// memberlist uses in its logs and for the remote address of a stream.
type conn struct {
	net.Conn
	remote, local net.Addr
}

func (c conn) RemoteAddr() net.Addr { return c.remote }
func (c conn) LocalAddr() net.Addr  { return c.local }
