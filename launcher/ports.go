package launcher

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// PortReservation holds two ports that the kernel handed out as free: one
// for MASTER_PORT and one for the rendezvous seed. The sockets stay bound
// until Release, so two gorun jobs planning at the same time can never be
// given the same port: the kernel does not hand out a bound port twice.
//
// The unavoidable window is between Release and the moment rank 0 binds the
// port itself; Run releases right before it starts the ranks to keep that
// window to a few milliseconds. In that window only another bind to port 0
// could take the port, and Linux starts its search for a free port at a
// random offset, so a collision needs the same pick out of ~28000.
type PortReservation struct {
	// MasterPort is free for TCP; RdzvPort is free for both TCP and UDP,
	// since memberlist binds both on one port.
	MasterPort, RdzvPort int

	closers []interface{ Close() error }
}

// ReservePorts binds two distinct free ports on the wildcard address, so
// that any later bind to a specific address of this machine conflicts with
// them too.
func ReservePorts() (*PortReservation, error) {
	r := &PortReservation{}
	ml, err := net.Listen("tcp", ":0")
	if err != nil {
		return nil, fmt.Errorf("launcher: reserve MASTER_PORT: %w", err)
	}
	r.closers = append(r.closers, ml)
	r.MasterPort = ml.Addr().(*net.TCPAddr).Port

	// The rendezvous port must be free for UDP as well; a TCP port whose UDP
	// twin is taken is skipped (rare, so a few attempts suffice).
	for attempt := 0; attempt < 20; attempt++ {
		tl, err := net.Listen("tcp", ":0")
		if err != nil {
			r.Release()
			return nil, fmt.Errorf("launcher: reserve rendezvous port: %w", err)
		}
		port := tl.Addr().(*net.TCPAddr).Port
		ul, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
		if err != nil {
			tl.Close()
			if errors.Is(err, syscall.EADDRINUSE) {
				continue
			}
			r.Release()
			return nil, fmt.Errorf("launcher: reserve rendezvous port: %w", err)
		}
		r.closers = append(r.closers, tl, ul)
		r.RdzvPort = port
		return r, nil
	}
	r.Release()
	return nil, errors.New("launcher: reserve rendezvous port: no port free for both TCP and UDP after 20 attempts")
}

// Release closes the reserving sockets so the ranks can bind the ports. It
// is idempotent.
func (r *PortReservation) Release() {
	if r == nil {
		return
	}
	for _, c := range r.closers {
		c.Close()
	}
	r.closers = nil
}
