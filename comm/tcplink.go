package comm

import (
	"bufio"
	"io"
	"net"
	"sync"
)

// tcpEager is the TCP link's EagerLimit and the size of its coalescing
// buffer: header and payload up to this size leave in one write. Loopback
// and LAN socket buffers hold far more than two such frames.
const tcpEager = 16 << 10

// tcpLink carries frames over one authenticated TCP connection.
type tcpLink struct {
	conn net.Conn
	br   *bufio.Reader // receive side: worker only

	// wmu serializes senders (the sender goroutine and an abort frame) so
	// frames never interleave; it guards wbuf.
	wmu  sync.Mutex
	wbuf []byte

	rbuf [HeaderSize]byte // receive side: worker only

	once sync.Once
}

var _ Link = (*tcpLink)(nil)

func newTCPLink(conn net.Conn, br *bufio.Reader) *tcpLink {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // frames are whole messages; Nagle only adds latency
	}
	return &tcpLink{conn: conn, br: br, wbuf: make([]byte, HeaderSize+tcpEager)}
}

// Send blocks until the frame is in the kernel's socket buffer. Safe for
// concurrent use; frames never interleave.
func (l *tcpLink) Send(h *Header, payload []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	h.Encode(l.wbuf[:HeaderSize])
	if len(payload) <= tcpEager {
		n := copy(l.wbuf[HeaderSize:], payload)
		_, err := l.conn.Write(l.wbuf[:HeaderSize+n])
		return err
	}
	if _, err := l.conn.Write(l.wbuf[:HeaderSize]); err != nil {
		return err
	}
	_, err := l.conn.Write(payload)
	return err
}

// RecvHeader blocks for the next header. Receive side: one goroutine.
func (l *tcpLink) RecvHeader(h *Header) error {
	if _, err := io.ReadFull(l.br, l.rbuf[:]); err != nil {
		return err
	}
	return h.Decode(l.rbuf[:])
}

// RecvPayload reads the current frame's payload straight into dst (large
// reads bypass the buffer).
func (l *tcpLink) RecvPayload(dst []byte) error {
	_, err := io.ReadFull(l.br, dst)
	return err
}

func (l *tcpLink) EagerLimit() int { return tcpEager }
func (l *tcpLink) Kind() string    { return "tcp" }

// Close closes the connection, unblocking both sides. Idempotent.
func (l *tcpLink) Close() error {
	l.once.Do(func() { _ = l.conn.Close() })
	return nil
}
