//go:build !linux

package comm

import (
	"net"
	"time"
)

// tcpStripes: without non-blocking attempts on each socket, a link over
// several connections could block on one while the peer blocks on
// another; links use one connection here.
const tcpStripes = false

// tcpStream is a link's connection used with blocking calls.
type tcpStream struct {
	conn net.Conn
	pre  []byte // bytes the handshake read past its end; read first
	a, b []byte // pending write; guarded by the link's wmu
}

func newTCPStream(conn net.Conn, _ time.Duration, pre []byte) *tcpStream {
	return &tcpStream{conn: conn, pre: pre}
}

func (s *tcpStream) Read(p []byte) (int, error) { return s.read(p, true) }

// read blocks whatever wait says: with one connection per link nothing
// else could be done meanwhile.
func (s *tcpStream) read(p []byte, _ bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if n := takePre(&s.pre, p); n > 0 {
		return n, nil
	}
	return s.conn.Read(p)
}

func (s *tcpStream) setWrite(a, b []byte) { s.a, s.b = a, b }
func (s *tcpStream) pending() bool        { return len(s.a)+len(s.b) > 0 }
func (s *tcpStream) dropWrite()           { s.a, s.b = nil, nil }

// write writes everything pending as two writes.
func (s *tcpStream) write(bool) (int, error) {
	n, err := s.conn.Write(s.a)
	s.a = s.a[n:]
	if err != nil {
		return n, err
	}
	m, err := s.conn.Write(s.b)
	s.b = s.b[m:]
	return n + m, err
}

// setUserTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere keepalive alone.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }

// setCongestion has nothing to set here (TCP_CONGESTION is Linux's).
func setCongestion(net.Conn, string) error { return nil }
