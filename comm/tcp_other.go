//go:build !linux

package comm

import (
	"net"
	"time"
)

// tcpWriter writes a large frame as two writes where writev without an
// allocation per call is not at hand.
type tcpWriter struct{ conn net.Conn }

func (w *tcpWriter) init(conn net.Conn) { w.conn = conn }

// writeFrame writes the encoded header in l.wbuf and payload. wmu held.
func (l *tcpLink) writeFrame(payload []byte) error {
	if _, err := l.conn.Write(l.wbuf[:HeaderSize]); err != nil {
		return err
	}
	_, err := l.conn.Write(payload)
	return err
}

// tcpReader reads through the netpoller.
type tcpReader struct{ conn net.Conn }

func (r *tcpReader) init(conn net.Conn, _ time.Duration) { r.conn = conn }
func (r *tcpReader) Read(p []byte) (int, error)          { return r.conn.Read(p) }
