package comm

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpStripes is whether this platform can stripe a link over several
// connections: it needs non-blocking attempts on each socket.
const tcpStripes = true

// tcpStream is one connection of a TCP link, driven with raw syscalls on
// the non-blocking socket through RawConn, so that the link can try each
// of its connections in turn without blocking, and so that no call
// allocates (net.Buffers does per writev).
//
// The read side belongs to the link's receiver and the write side to the
// holder of the link's wmu; each has its own state, and the callbacks
// handed to RawConn are made once.
//
// The calls are RawSyscall: the socket is non-blocking, so a call lasts as
// long as its copy (tens of µs for a segment) and never waits. With
// Syscall, a copy longer than sysmon's 20 µs tick let it hand the P to
// another thread, which on a 2-core host running two ranks tripled the
// context switches (≈300 → ≈100 per 16 MiB all-reduce) for a few percent
// more CPU per call.
type tcpStream struct {
	conn net.Conn
	rc   syscall.RawConn // nil if conn is not a socket: plain blocking calls
	spin time.Duration   // how long a waiting read polls before parking
	pre  []byte          // bytes the handshake read past its end; read first
	// yield: a waiting read yields the CPU between polls and polls for
	// tcpYieldSpin (set once by setCrowded, before use). yielding: this
	// read does (receiver only); yieldSkip waits poll without yielding
	// after a slow yield, and yieldBack is the next such skip (see
	// tcpYieldSlow).
	yield                bool
	yielding             bool
	yieldSkip, yieldBack int

	// Read in progress (receiver only).
	rp    []byte
	rn    int
	rerr  error
	rwait bool
	rfn   func(fd uintptr) bool

	// Write in progress (wmu): the unsent rest is iov[2-niv:].
	iov   [2]unix.Iovec
	niv   int
	wn    int
	werr  error
	wwait bool
	wfn   func(fd uintptr) bool
}

func newTCPStream(conn net.Conn, spin time.Duration, pre []byte) *tcpStream {
	s := &tcpStream{conn: conn, spin: spin, pre: pre}
	s.rfn, s.wfn = s.doRead, s.doWrite
	if sc, ok := conn.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			s.rc = rc
		}
	}
	return s
}

// Read blocks until it has read at least one byte into p (io.Reader).
func (s *tcpStream) Read(p []byte) (int, error) { return s.read(p, true) }

// read reads into p. With wait it returns at least one byte or an error,
// polling for spin and then parking in the netpoller; without, it returns
// what the socket holds now, possibly nothing.
func (s *tcpStream) read(p []byte, wait bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if n := takePre(&s.pre, p); n > 0 {
		return n, nil
	}
	if s.rc == nil {
		return s.conn.Read(p)
	}
	s.rp, s.rn, s.rerr, s.rwait = p, 0, nil, wait
	s.yielding = s.yield && s.yieldSkip == 0
	if wait && s.yieldSkip > 0 {
		s.yieldSkip--
	}
	err := s.rc.Read(s.rfn)
	s.rp = nil
	if err != nil {
		return 0, err
	}
	return s.rn, s.rerr
}

// doRead runs inside RawConn.Read: false means "park until readable".
func (s *tcpStream) doRead(fd uintptr) bool {
	var deadline time.Time
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&s.rp[0])), uintptr(len(s.rp)))
		switch e {
		case 0:
			s.rn = int(n)
			if n == 0 {
				s.rerr = io.EOF
			}
			if s.yielding && !deadline.IsZero() {
				s.yieldBack = 0 // yielding answered: no slow yield this wait
			}
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			s.rerr = os.NewSyscallError("read", e)
			return true
		}
		if !s.rwait {
			return true
		}
		// A frame on its way arrives sooner than the netpoller can wake
		// a parked goroutine (two context switches): poll a little first.
		if s.spin <= 0 {
			return false
		}
		spin := s.spin
		now := time.Now()
		if s.yielding {
			// The rank we wait for may be queued behind us on this
			// core: let it run (see tcpYieldSpin).
			t0 := now
			schedYield()
			if now = time.Now(); now.Sub(t0) > tcpYieldSlow {
				// The core went to something that kept it, not to a
				// rank that answers: park, and poll without yielding
				// for the next waits (see tcpYieldSlow).
				s.yieldBack = min(max(2*s.yieldBack, 256), 8192)
				s.yieldSkip, s.yielding = s.yieldBack, false
				return false
			}
			spin = tcpYieldSpin
		}
		if deadline.IsZero() {
			deadline = now.Add(spin)
		} else if now.After(deadline) {
			return false
		}
	}
}

// tcpYieldSpin is how long a waiting read polls before it parks on a
// crowded host (more of the group's ranks than CPUs) when this rank shares
// its session, and so its scheduling group, with the job's other ranks
// (gorun starts oversubscribed ranks so, launcher/supervisor/bind.go):
// between polls it calls sched_yield, which hands the core to a rank
// queued behind it, often the one it waits for. A busy poll holds the core
// the peer needs for its whole spin, and a park costs a wake-up through
// the netpoller.
// Measured on the 2-core reference host, 4 ranks over TCP, `gorun bench
// allreduce` medians of 3 interleaved rounds (notes/tcp-latency.md):
// polling 20 µs then parking 120 µs at 8 B and 296 µs at 32 KiB; parking
// at once 68 and 225 µs; yielding for 20 µs 70 and 132 µs, for 200 µs 45
// and 126 µs, for 1 ms 54 and 114 µs; Open MPI (which yields when
// oversubscribed) 40 and 95-117 µs.
const tcpYieldSpin = 200 * time.Microsecond

// tcpYieldSlow: a sched_yield that kept this rank off the core longer than
// this handed it to something other than a rank that answers, most likely
// a CPU-bound process of the same session (a program's own helper
// processes, or a benchmark's load). Such a process keeps the core for
// its whole time slice at every yield: with a busy loop pinned on each
// core in the ranks' session (scripts/bench-latency.sh's hog), 4 ranks
// over TCP took 2.1-2.3 ms per small all-reduce yielding against
// 0.17-0.23 ms polling then parking (where the woken rank preempts the
// loop). So after a slow yield the wait parks, and the next waits poll
// without yielding, 256 at first, twice as many after each further slow
// yield (at most 8192); a yielding wait that ends without one starts the
// count again. Same hogs, 3 interleaved rounds: 16 waits at first gave
// 0.41-0.48 ms, 256 gave 0.24-0.32 ms; quiet, both as without the
// skip (notes/tcp-latency.md).
const tcpYieldSlow = time.Millisecond

// schedYield gives up the CPU (a variable so that tests can slow it).
var schedYield = func() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// sharedSession reports whether this process is not its session's leader:
// it then shares the session, and with the kernel's autogroup scheduling
// the scheduling group, with its launcher's other children, so a
// sched_yield can hand the core to one of them. A session leader is alone
// in its group, where a yield hands the core to nobody. A session id of 0
// means the leader lives outside this PID namespace (a container entered
// with exec): this process is not the leader, so it shares the session.
var sharedSession = sync.OnceValue(func() bool {
	sid, err := unix.Getsid(0)
	return err == nil && sid != os.Getpid()
})

// setCrowded tells the link whether the host runs more of the group's
// ranks than it has CPUs (markCrowded, before the link is used).
func (l *tcpLink) setCrowded(crowded bool) {
	on := crowded && sharedSession()
	for _, s := range l.st {
		s.yield = on
	}
}

// setWrite makes a then b the stream's pending bytes. wmu held.
func (s *tcpStream) setWrite(a, b []byte) {
	s.niv = 0
	for _, p := range [2][]byte{b, a} {
		if len(p) > 0 {
			s.niv++
			s.iov[2-s.niv] = unix.Iovec{Base: unsafe.SliceData(p), Len: uint64(len(p))}
		}
	}
}

// pending reports whether setWrite's bytes are not all written. wmu held.
func (s *tcpStream) pending() bool { return s.niv > 0 }

// dropWrite forgets the pending bytes, so the payload is not kept
// reachable after Send returns. wmu held.
func (s *tcpStream) dropWrite() { s.iov, s.niv = [2]unix.Iovec{}, 0 }

// write writes pending bytes with writev. With wait it parks until it has
// written something; either way it returns at the first EAGAIN after that.
// wmu held.
func (s *tcpStream) write(wait bool) (int, error) {
	if s.niv == 0 {
		return 0, nil
	}
	if s.rc == nil {
		total := 0
		for s.niv > 0 {
			v := s.iov[2-s.niv]
			n, err := s.conn.Write(unsafe.Slice(v.Base, v.Len))
			s.advance(n)
			total += n
			if err != nil {
				return total, err
			}
		}
		return total, nil
	}
	s.wn, s.werr, s.wwait = 0, nil, wait
	if err := s.rc.Write(s.wfn); err != nil {
		return s.wn, err
	}
	return s.wn, s.werr
}

// doWrite runs inside RawConn.Write: false means "park until writable".
// Polling here measured no faster: a full send buffer drains at the
// receiver's pace.
func (s *tcpStream) doWrite(fd uintptr) bool {
	for s.niv > 0 {
		iov := s.iov[2-s.niv:]
		n, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch e {
		case 0:
			s.wn += int(n)
			s.advance(int(n))
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return !s.wwait || s.wn > 0
		default:
			s.werr = os.NewSyscallError("writev", e)
			return true
		}
	}
	return true
}

// advance drops n written bytes from the front of the pending iovecs.
func (s *tcpStream) advance(n int) {
	for n > 0 && s.niv > 0 {
		v := &s.iov[2-s.niv]
		if uint64(n) < v.Len {
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), n))
			v.Len -= uint64(n)
			return
		}
		n -= int(v.Len)
		s.niv--
	}
}

// setUserTimeout sets TCP_USER_TIMEOUT: unacknowledged data (or
// unanswered keepalive probes) older than d fail the connection with
// ETIMEDOUT.
func setUserTimeout(c *net.TCPConn, d time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}

// setCongestion sets the TCP congestion control of c (TCP_CONGESTION);
// a connection that is not a socket is left alone.
func setCongestion(c net.Conn, name string) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("TCP_CONGESTION %q: %w", name, serr)
	}
	return nil
}
