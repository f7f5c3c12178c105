package comm

import (
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpWriter sends header and payload with one writev on the socket,
// waiting in the netpoller when the socket buffer is full. net.Buffers
// would do the same but allocates per call; the closure here is made once.
type tcpWriter struct {
	rc  syscall.RawConn
	iov [2]unix.Iovec // the unsent rest of the frame; guarded by wmu
	niv int
	err error
	fn  func(fd uintptr) bool
}

func (w *tcpWriter) init(conn net.Conn) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	w.rc = rc
	w.fn = w.write
}

// write runs inside RawConn.Write: false means "wait until writable".
func (w *tcpWriter) write(fd uintptr) bool {
	for w.niv > 0 {
		iov := w.iov[2-w.niv:]
		n, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			w.err = e
			return true
		}
		w.advance(int(n))
	}
	return true
}

// advance drops n written bytes from the front of the iovecs.
func (w *tcpWriter) advance(n int) {
	for n > 0 && w.niv > 0 {
		v := &w.iov[2-w.niv]
		if uint64(n) < v.Len {
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), n))
			v.Len -= uint64(n)
			return
		}
		n -= int(v.Len)
		w.niv--
	}
}

// writeFrame writes the encoded header in l.wbuf and payload. wmu held.
func (l *tcpLink) writeFrame(payload []byte) error {
	w := &l.w
	if w.rc == nil { // not a socket (tests may hand in a pipe)
		if _, err := l.conn.Write(l.wbuf[:HeaderSize]); err != nil {
			return err
		}
		_, err := l.conn.Write(payload)
		return err
	}
	w.iov[0] = unix.Iovec{Base: &l.wbuf[0], Len: HeaderSize}
	w.iov[1] = unix.Iovec{Base: unsafe.SliceData(payload), Len: uint64(len(payload))}
	w.niv, w.err = 2, nil
	if err := w.rc.Write(w.fn); err != nil {
		return err
	}
	err := w.err
	w.iov = [2]unix.Iovec{} // do not keep the payload reachable
	return err
}

// tcpReader reads the socket with raw syscalls, and when nothing has
// arrived it polls for up to spin before parking in the netpoller: a frame
// that is on its way arrives sooner than the netpoller can wake a parked
// goroutine (two context switches). Receive side only.
type tcpReader struct {
	conn net.Conn
	rc   syscall.RawConn
	spin time.Duration
	// State of the read in progress, for fn (made once: no allocation).
	dst []byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

func (r *tcpReader) init(conn net.Conn, spin time.Duration) {
	r.conn, r.spin = conn, spin
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	r.rc = rc
	r.fn = r.read
}

func (r *tcpReader) Read(p []byte) (int, error) {
	if r.rc == nil {
		return r.conn.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	r.dst, r.n, r.err = p, 0, nil
	if err := r.rc.Read(r.fn); err != nil {
		r.dst = nil
		return 0, err
	}
	r.dst = nil
	if r.n == 0 && r.err == nil {
		return 0, io.EOF
	}
	return r.n, r.err
}

// read runs inside RawConn.Read: false means "park until readable".
func (r *tcpReader) read(fd uintptr) bool {
	var deadline time.Time
	for {
		n, _, e := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&r.dst[0])), uintptr(len(r.dst)))
		switch e {
		case 0:
			r.n = int(n)
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			r.err = e
			return true
		}
		if r.spin <= 0 {
			return false
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(r.spin)
		} else if now.After(deadline) {
			return false
		}
	}
}
