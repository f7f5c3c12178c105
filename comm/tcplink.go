package comm

import (
	"bufio"
	"io"
	"net"
	"sync"
	"time"
)

// tcpEager is the TCP link's EagerLimit and the size of its coalescing
// buffer: header and payload up to this size leave in one write. Loopback
// and LAN socket buffers hold far more than two such frames.
const tcpEager = 16 << 10

// tcpChunk is the piece RecvReduce reads before folding it into the
// destination: small enough that the bytes the kernel just copied are still
// in L1/L2 when they are reduced, large enough that a read is one syscall
// per loopback skb (64 KiB) rather than several.
const tcpChunk = 64 << 10

// tcpLink carries frames over one authenticated TCP connection.
//
// Receive side. Headers are read through a small read-ahead buffer so that
// a small frame (header and payload) costs one read. Payloads larger than
// the buffer are read straight into the destination; after such a frame the
// next header is read on its own, so that read-ahead does not pull the next
// segment's payload into the buffer only to copy it out again.
type tcpLink struct {
	conn net.Conn

	// Receive side: the worker only.
	r        tcpReader
	rbuf     []byte // read-ahead; unread bytes are rbuf[rlo:rhi]
	rlo, rhi int
	bigLast  bool   // the last payload bypassed rbuf: read the next header alone
	chunk    []byte // RecvReduce staging, allocated on first use

	// wmu serializes senders (the sender goroutine and an abort frame) so
	// frames never interleave; it guards wbuf and w.
	wmu  sync.Mutex
	wbuf []byte
	w    tcpWriter

	once sync.Once
}

var (
	_ Link           = (*tcpLink)(nil)
	_ ReduceReceiver = (*tcpLink)(nil)
)

// tcpOptions are the endpoint's TCP settings (see EndpointConfig).
type tcpOptions struct {
	spin     time.Duration // TCPSpin; <= 0: park at once
	bufBytes int           // TCPBufferBytes; 0: kernel autotuning
}

// newTCPLink takes over conn after the handshake; br holds whatever the
// handshake read past its last message (the peer may already be sending).
func newTCPLink(conn net.Conn, br *bufio.Reader, o tcpOptions) *tcpLink {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // frames are whole messages; Nagle only adds latency
		if o.bufBytes > 0 {
			// Best effort: the kernel caps these at net.core.[rw]mem_max.
			_ = tc.SetWriteBuffer(o.bufBytes)
			_ = tc.SetReadBuffer(o.bufBytes)
		}
	}
	l := &tcpLink{conn: conn, wbuf: make([]byte, HeaderSize+tcpEager)}
	l.w.init(conn)
	l.r.init(conn, o.spin)
	l.rbuf = make([]byte, max(HeaderSize+tcpEager, br.Buffered()))
	l.rhi, _ = io.ReadFull(br, l.rbuf[:br.Buffered()])
	return l
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
	return l.writeFrame(payload)
}

// fill reads until at least need bytes are buffered. The caller ensures
// rlo+need fits in rbuf.
func (l *tcpLink) fill(need int) error {
	n, err := io.ReadAtLeast(&l.r, l.rbuf[l.rhi:], need-(l.rhi-l.rlo))
	l.rhi += n
	return err
}

// RecvHeader blocks for the next header. Receive side: one goroutine.
func (l *tcpLink) RecvHeader(h *Header) error {
	if l.rhi-l.rlo < HeaderSize {
		// Compact, then read: the whole buffer after a small frame (the
		// next frame likely follows, header and payload in one read), only
		// the header after a large one.
		l.rhi = copy(l.rbuf, l.rbuf[l.rlo:l.rhi])
		l.rlo = 0
		if l.bigLast {
			n, err := io.ReadFull(&l.r, l.rbuf[l.rhi:HeaderSize])
			l.rhi += n
			if err != nil {
				return err
			}
		} else if err := l.fill(HeaderSize); err != nil {
			return err
		}
	}
	err := h.Decode(l.rbuf[l.rlo : l.rlo+HeaderSize])
	l.rlo += HeaderSize
	return err
}

// buffered copies what the read-ahead buffer holds of the current payload
// into dst and returns how many bytes it copied.
func (l *tcpLink) buffered(dst []byte) int {
	n := copy(dst, l.rbuf[l.rlo:l.rhi])
	l.rlo += n
	return n
}

// RecvPayload reads the current frame's payload into dst: small payloads
// through the read-ahead buffer (picking up what follows), large ones
// straight into dst.
func (l *tcpLink) RecvPayload(dst []byte) error {
	if want := len(dst) - (l.rhi - l.rlo); want > 0 && len(dst) <= tcpEager {
		l.rhi = copy(l.rbuf, l.rbuf[l.rlo:l.rhi])
		l.rlo = 0
		if err := l.fill(len(dst)); err != nil {
			return err
		}
	}
	n := l.buffered(dst)
	l.bigLast = n < len(dst)
	if !l.bigLast {
		return nil
	}
	_, err := io.ReadFull(&l.r, dst[n:])
	return err
}

// RecvReduce folds the current frame's payload into dst with f as it
// arrives, in pieces of whole 8-byte words (except the last) read into a
// cache-sized staging buffer: the reduction reads bytes the kernel has just
// written instead of a segment-sized scratch buffer.
func (l *tcpLink) RecvReduce(dst []byte, f func(dst, src []byte)) error {
	if len(dst) <= tcpEager {
		return l.recvSmallReduce(dst, f)
	}
	if l.chunk == nil {
		l.chunk = make([]byte, tcpChunk)
	}
	buf := l.chunk
	have := copy(buf[:min(len(buf), len(dst))], l.rbuf[l.rlo:l.rhi])
	l.rlo += have
	l.bigLast = true
	off := 0
	for {
		// Fold every whole word received so far; keep a partial word.
		k := have &^ 7
		if off+have == len(dst) {
			k = have
		}
		if k > 0 {
			f(dst[off:off+k], buf[:k])
			off += k
			have = copy(buf, buf[k:have])
		}
		if off == len(dst) {
			return nil
		}
		n, err := l.r.Read(buf[have:min(len(buf), len(dst)-off)])
		have += n
		if err != nil && off+have < len(dst) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
}

// recvSmallReduce reads a small payload through the read-ahead buffer and
// folds it into dst.
func (l *tcpLink) recvSmallReduce(dst []byte, f func(dst, src []byte)) error {
	if want := len(dst) - (l.rhi - l.rlo); want > 0 {
		l.rhi = copy(l.rbuf, l.rbuf[l.rlo:l.rhi])
		l.rlo = 0
		if err := l.fill(len(dst)); err != nil {
			return err
		}
	}
	f(dst, l.rbuf[l.rlo:l.rlo+len(dst)])
	l.rlo += len(dst)
	l.bigLast = false
	return nil
}

func (l *tcpLink) EagerLimit() int { return tcpEager }
func (l *tcpLink) Kind() string    { return "tcp" }

// Close closes the connection, unblocking both sides. Idempotent.
func (l *tcpLink) Close() error {
	l.once.Do(func() { _ = l.conn.Close() })
	return nil
}
