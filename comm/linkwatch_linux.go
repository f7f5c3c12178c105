package comm

import (
	"time"

	"golang.org/x/sys/unix"
)

// tcpInfoWorks: Linux reports a connection's acknowledgement state
// (TCP_INFO), which the link lease reads.
const tcpInfoWorks = true

// tcpEstablished is the kernel's TCP_ESTABLISHED state (include/net/tcp_states.h).
const tcpEstablished = 1

// ackState reads the connection's TCP_INFO: whether an acknowledgement
// from the peer's host is awaited (data in flight, or a zero-window or
// keepalive probe out) and how old the last one is. One getsockopt on the
// watcher's goroutine, never on the frame path. A socket that cannot be
// read (closed) or is past ESTABLISHED awaits nothing here: its reader
// sees why.
func (s *tcpStream) ackState() (awaiting bool, sinceAck time.Duration) {
	if s.rc == nil {
		return false, 0
	}
	var info *unix.TCPInfo
	var err error
	if cerr := s.rc.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); cerr != nil || err != nil || info.State != tcpEstablished {
		return false, 0
	}
	// Two probes out, not one: in the first second of a closed window
	// the kernel was measured (Linux 6.18, loopback) to keep one
	// zero-window probe counted out for a whole probe interval although
	// the peer answered; a cut leaves the count climbing.
	return info.Unacked > 0 || info.Probes >= 2, time.Duration(info.Last_ack_recv) * time.Millisecond
}
