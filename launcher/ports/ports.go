package ports

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Reservation holds two ports that were free at launch: one for
// MASTER_PORT and one for the rendezvous seed. The sockets stay bound until
// Release, so two gorun jobs planning at the same time can never be given
// the same port.
//
// The unavoidable window is between Release and the moment rank 0 binds the
// port itself; the launcher releases right before it starts the ranks. The ports are
// picked below the kernel's ephemeral range (ip_local_port_range), because
// inside it anything may take a just-released port in that window: every
// outgoing connect() on the machine draws its source port from that range,
// and so does every bind to port 0. This was seen, not guessed: under a busy
// test suite the seed bind failed with "address already in use" about once
// in ten jobs. Below the range only another explicit pick of the same port
// can collide, and picks are random over thousands of ports.
type Reservation struct {
	// MasterPort is free for TCP; RdzvPort is free for both TCP and UDP,
	// since memberlist binds both on one port.
	MasterPort, RdzvPort int

	closers []interface{ Close() error }
}

// lowestQuietPort is the bottom of the range searched below the ephemeral
// ports: under it sit well-known and registered service ports.
const lowestQuietPort = 10000

// quietRange returns the ports to pick from, [lo, hi], given the contents of
// /proc/sys/net/ipv4/ip_local_port_range. ok is false when the ephemeral
// range leaves fewer than 1024 ports above lowestQuietPort (or cannot be
// read); the caller then lets the kernel pick.
func quietRange(ephemeral string) (lo, hi int, ok bool) {
	f := strings.Fields(ephemeral)
	if len(f) != 2 {
		return 0, 0, false
	}
	eph, err := strconv.Atoi(f[0])
	if err != nil || eph-1-lowestQuietPort < 1024 {
		return 0, 0, false
	}
	return lowestQuietPort, eph - 1, true
}

// candidates yields the ports to try: random picks from the quiet range,
// then 0 (the kernel's choice) as the last resort.
func candidates() []int {
	var out []int
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if lo, hi, ok := quietRange(string(b)); ok {
			for range 64 {
				out = append(out, lo+rand.IntN(hi-lo+1))
			}
		}
	}
	return append(out, 0)
}

// Reserve binds two distinct free ports on the wildcard address, so
// that any later bind to a specific address of this machine conflicts with
// them too.
func Reserve() (*Reservation, error) {
	r := &Reservation{}
	ml, port, err := reserve(false)
	if err != nil {
		return nil, fmt.Errorf("launcher: reserve MASTER_PORT: %w", err)
	}
	r.closers = append(r.closers, ml...)
	r.MasterPort = port

	// The rendezvous port must be free for UDP as well.
	rl, port, err := reserve(true)
	if err != nil {
		r.Release()
		return nil, fmt.Errorf("launcher: reserve rendezvous port: %w", err)
	}
	r.closers = append(r.closers, rl...)
	r.RdzvPort = port
	return r, nil
}

// reserve binds a free TCP port (and, with udp, the same UDP port) from the
// candidates, skipping ports in use.
func reserve(udp bool) ([]interface{ Close() error }, int, error) {
	var last error
	for _, want := range candidates() {
		tl, err := net.Listen("tcp", ":"+strconv.Itoa(want))
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
				last = err
				continue
			}
			return nil, 0, err
		}
		port := tl.Addr().(*net.TCPAddr).Port
		if !udp {
			return []interface{ Close() error }{tl}, port, nil
		}
		ul, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
		if err != nil {
			tl.Close()
			if errors.Is(err, syscall.EADDRINUSE) {
				last = err
				continue
			}
			return nil, 0, err
		}
		return []interface{ Close() error }{tl, ul}, port, nil
	}
	return nil, 0, fmt.Errorf("no free port after %d attempts: %w", 65, last)
}

// Release closes the reserving sockets so the ranks can bind the ports. It
// is idempotent.
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	for _, c := range r.closers {
		c.Close()
	}
	r.closers = nil
}
