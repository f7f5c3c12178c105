package comm

import (
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

// maxTCPStreams bounds the connections of one link (EndpointConfig.TCPStreams).
const maxTCPStreams = 16

// tcpLink carries frames over one or more authenticated TCP connections
// (streams) to one peer.
//
// Stream 0 carries every header and every small frame. The payload of a
// frame larger than tcpEager is striped: cut into one contiguous piece per
// stream (at 8-byte boundaries, see stripe) and piece i sent on stream i,
// all pieces progressing together. Each stream is FIFO and the pieces of a
// frame are all read before the next header, so frames stay in order, and a
// desync or abort is seen on stream 0 exactly as with one connection.
//
// Receive side. Headers are read through a small read-ahead buffer so that
// a small frame (header and payload) costs one read. Large payloads are read
// straight into the destination; after one, the next header is read on its
// own, so that read-ahead does not pull the next segment's payload into the
// buffer only to copy it out again.
type tcpLink struct {
	st []*tcpStream

	// Receive side: the worker only.
	rbuf     []byte // stream 0 read-ahead; unread bytes are rbuf[rlo:rhi]
	rlo, rhi int
	bigLast  bool        // the last payload bypassed rbuf: read the next header alone
	rx       []recvPiece // per stream: the piece of the payload being received

	// wmu serializes senders (the sender goroutine and an abort frame) so
	// frames never interleave; it guards wbuf and the streams' write sides.
	wmu  sync.Mutex
	wbuf []byte

	once sync.Once

	// lease is EndpointConfig.LinkLease (0: unwatched); see linkwatch.go.
	lease time.Duration
}

var (
	_ Link           = (*tcpLink)(nil)
	_ ReduceReceiver = (*tcpLink)(nil)
)

// recvPiece is one stream's part of a large payload being received: dst is
// what is not yet filled (RecvPayload) or not yet folded (RecvReduce); in
// the latter case chunk[:have] holds received bytes not yet folded.
type recvPiece struct {
	dst   []byte
	chunk []byte // allocated on first use, reused
	have  int
}

// tcpOptions are the endpoint's TCP settings (see EndpointConfig).
type tcpOptions struct {
	spin     time.Duration // TCPSpin; <= 0: park at once
	bufBytes int           // TCPBufferBytes; 0: kernel autotuning
	// userTimeout is TCPUserTimeout; <= 0: the kernel's defaults.
	userTimeout time.Duration
	// lease is LinkLease; 0: no liveness check of the link (linkwatch.go).
	lease time.Duration
}

// newTCPLink takes over conns (stream 0 first) after their handshakes;
// pre[i] is what stream i's handshake read past its end (the peer may
// already be sending).
func newTCPLink(conns []net.Conn, pre [][]byte, o tcpOptions) *tcpLink {
	l := &tcpLink{
		st:    make([]*tcpStream, len(conns)),
		rx:    make([]recvPiece, len(conns)),
		rbuf:  make([]byte, HeaderSize+tcpEager),
		wbuf:  make([]byte, HeaderSize+tcpEager),
		lease: o.lease,
	}
	ka := keepAlive(o)
	for i, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true) // frames are whole messages; Nagle only adds latency
			if o.bufBytes > 0 {
				// Best effort: the kernel caps these at net.core.[rw]mem_max.
				_ = tc.SetWriteBuffer(o.bufBytes)
				_ = tc.SetReadBuffer(o.bufBytes)
			}
			if ka.Enable {
				_ = tc.SetKeepAliveConfig(ka)
			}
			if o.userTimeout > 0 {
				// A lost network, not a slow peer: see TCPUserTimeout.
				_ = setUserTimeout(tc, o.userTimeout)
			}
		}
		l.st[i] = newTCPStream(c, o.spin, pre[i])
	}
	return l
}

// keepAlive is the keepalive of a data connection. Keepalive probes are
// how a link with nothing in flight is still judged: the kernel probes a
// connection idle for Idle, and an unanswered probe is what the link
// lease (linkwatch.go) and TCPUserTimeout act on. With a lease, a probe
// leaves after a quarter of it, so that an idle link cut is named within
// the lease; the kernel counts these in whole seconds (Go rounds up), so
// a lease under 2 s is judged no sooner than about 1 s of idleness. A
// healthy busy link sends no probe at all: keepalive costs nothing on
// the fast path.
func keepAlive(o tcpOptions) net.KeepAliveConfig {
	ka := net.KeepAliveConfig{Count: 5}
	if o.userTimeout > 0 {
		ka.Enable, ka.Idle, ka.Interval = true, o.userTimeout/2, o.userTimeout/10
	}
	if o.lease > 0 {
		idle, intv := max(o.lease/4, time.Second), max(o.lease/8, time.Second)
		if !ka.Enable || idle < ka.Idle {
			ka.Idle = idle
		}
		if !ka.Enable || intv < ka.Interval {
			ka.Interval = intv
		}
		ka.Enable = true
	}
	return ka
}

// stripe returns piece i of k of an n-byte payload: [lo, hi), cut at
// multiples of 8 so that no element of any type straddles two pieces.
func stripe(n, k, i int) (lo, hi int) {
	lo = int(int64(n)*int64(i)/int64(k)) &^ 7
	hi = n
	if i < k-1 {
		hi = int(int64(n)*int64(i+1)/int64(k)) &^ 7
	}
	return lo, hi
}

// striped reports whether a payload of n bytes is cut across the streams.
func (l *tcpLink) striped(n int) bool { return len(l.st) > 1 && n > tcpEager }

// Send blocks until the frame is in the kernel's socket buffers. Safe for
// concurrent use; frames never interleave.
func (l *tcpLink) Send(h *Header, payload []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	h.Encode(l.wbuf[:HeaderSize])
	s0 := l.st[0]
	switch {
	case len(payload) <= tcpEager:
		n := copy(l.wbuf[HeaderSize:], payload)
		s0.setWrite(l.wbuf[:HeaderSize+n], nil)
	case !l.striped(len(payload)):
		// One writev for header and payload: half the syscalls of two
		// writes, and the header never leaves in a packet of its own.
		s0.setWrite(l.wbuf[:HeaderSize], payload)
	default:
		for i, s := range l.st {
			lo, hi := stripe(len(payload), len(l.st), i)
			if i == 0 {
				s.setWrite(l.wbuf[:HeaderSize], payload[lo:hi])
			} else {
				s.setWrite(payload[lo:hi], nil)
			}
		}
	}
	err := l.writeAll()
	for _, s := range l.st {
		s.dropWrite()
	}
	return err
}

// writeAll writes every stream's pending bytes, trying each in turn and
// parking on the first unfinished one only when none took anything, so
// that one full socket buffer does not hold up the others. wmu held.
func (l *tcpLink) writeAll() error {
	if len(l.st) == 1 {
		s := l.st[0]
		for s.pending() {
			if _, err := s.write(true); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		var first *tcpStream
		progress := false
		for _, s := range l.st {
			if !s.pending() {
				continue
			}
			n, err := s.write(false)
			if err != nil {
				return err
			}
			progress = progress || n > 0
			if first == nil && s.pending() {
				first = s
			}
		}
		if first == nil {
			return nil
		}
		if !progress {
			if _, err := first.write(true); err != nil {
				return err
			}
		}
	}
}

// fill reads stream 0 until at least need bytes are buffered. The caller
// ensures rlo+need fits in rbuf.
func (l *tcpLink) fill(need int) error {
	n, err := io.ReadAtLeast(l.st[0], l.rbuf[l.rhi:], need-(l.rhi-l.rlo))
	l.rhi += n
	return err
}

// compact moves the unread bytes of rbuf to its start.
func (l *tcpLink) compact() {
	l.rhi = copy(l.rbuf, l.rbuf[l.rlo:l.rhi])
	l.rlo = 0
}

// RecvHeader blocks for the next header. Receive side: one goroutine.
func (l *tcpLink) RecvHeader(h *Header) error {
	if l.rhi-l.rlo < HeaderSize {
		// Read the whole buffer after a small frame (the next frame likely
		// follows, header and payload in one read), only the header after
		// a large one.
		l.compact()
		if l.bigLast {
			n, err := io.ReadFull(l.st[0], l.rbuf[l.rhi:HeaderSize])
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

// RecvPayload reads the current frame's payload into dst: small payloads
// through the read-ahead buffer (picking up what follows), large ones
// straight into dst.
func (l *tcpLink) RecvPayload(dst []byte) error {
	if len(dst) <= tcpEager {
		if len(dst) > l.rhi-l.rlo {
			l.compact()
			if err := l.fill(len(dst)); err != nil {
				return err
			}
		}
		l.rlo += copy(dst, l.rbuf[l.rlo:])
		l.bigLast = false
		return nil
	}
	return l.recvLarge(dst, nil)
}

// RecvReduce folds the current frame's payload into dst with f as it
// arrives, in pieces of whole 8-byte words (except the last) read into a
// cache-sized staging buffer: the reduction reads bytes the kernel has just
// written instead of a segment-sized scratch buffer.
func (l *tcpLink) RecvReduce(dst []byte, f func(dst, src []byte)) error {
	if len(dst) <= tcpEager {
		if len(dst) > l.rhi-l.rlo {
			l.compact()
			if err := l.fill(len(dst)); err != nil {
				return err
			}
		}
		f(dst, l.rbuf[l.rlo:l.rlo+len(dst)])
		l.rlo += len(dst)
		l.bigLast = false
		return nil
	}
	return l.recvLarge(dst, f)
}

// recvLarge receives a payload larger than the read-ahead buffer, from
// every stream at once if it is striped: into dst when f is nil, else
// folded into dst with f.
func (l *tcpLink) recvLarge(dst []byte, f func(dst, src []byte)) error {
	k := 1
	if l.striped(len(dst)) {
		k = len(l.st)
	}
	for i := range k {
		lo, hi := stripe(len(dst), k, i)
		p := &l.rx[i]
		p.dst, p.have = dst[lo:hi], 0
		if f != nil && p.chunk == nil {
			p.chunk = make([]byte, tcpChunk)
		}
	}
	// What read-ahead holds of stream 0 starts with piece 0; anything past
	// the piece is the next frame and stays.
	p0 := &l.rx[0]
	if f == nil {
		n := copy(p0.dst, l.rbuf[l.rlo:l.rhi])
		p0.dst = p0.dst[n:]
		l.rlo += n
	} else {
		p0.have = copy(p0.chunk[:min(len(p0.chunk), len(p0.dst))], l.rbuf[l.rlo:l.rhi])
		l.rlo += p0.have
		p0.fold(f)
	}
	l.bigLast = true
	err := l.readAll(k, f)
	for i := range k {
		l.rx[i].dst = nil // do not keep the caller's buffer reachable
	}
	return err
}

// readAll completes the first k pieces, trying each stream in turn and
// waiting on the first unfinished one only when none had anything.
func (l *tcpLink) readAll(k int, f func(dst, src []byte)) error {
	for {
		first := -1
		progress := false
		for i := range k {
			p := &l.rx[i]
			if len(p.dst) == 0 {
				continue
			}
			// One stream: nothing else to try, so wait on it at once.
			n, err := p.read(l.st[i], k == 1, f)
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
			progress = progress || n > 0
			if first < 0 && len(p.dst) > 0 {
				first = i
			}
		}
		if first < 0 {
			return nil
		}
		if !progress {
			if _, err := l.rx[first].read(l.st[first], true, f); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
	}
}

// read reads what s has of the piece (waiting for something if wait) and,
// with f, folds what it can. It returns the bytes read.
func (p *recvPiece) read(s *tcpStream, wait bool, f func(dst, src []byte)) (int, error) {
	if f == nil {
		n, err := s.read(p.dst, wait)
		p.dst = p.dst[n:]
		return n, err
	}
	n, err := s.read(p.chunk[p.have:min(len(p.chunk), len(p.dst))], wait)
	p.have += n
	p.fold(f)
	return n, err
}

// fold reduces every whole word staged (every byte if the piece is then
// complete) into dst and keeps a partial word for the next read.
func (p *recvPiece) fold(f func(dst, src []byte)) {
	k := p.have &^ 7
	if p.have == len(p.dst) {
		k = p.have
	}
	if k == 0 {
		return
	}
	f(p.dst[:k], p.chunk[:k])
	p.dst = p.dst[k:]
	p.have = copy(p.chunk, p.chunk[k:p.have])
}

func (l *tcpLink) EagerLimit() int { return tcpEager }
func (l *tcpLink) Kind() string    { return "tcp" }

// Close closes every connection, unblocking both sides. Idempotent.
func (l *tcpLink) Close() error {
	l.once.Do(func() {
		for _, s := range l.st {
			_ = s.conn.Close()
		}
	})
	return nil
}

// takePre moves the bytes a stream's handshake read past its end (*pre)
// into p first, reporting how many; 0 once they are used up.
func takePre(pre *[]byte, p []byte) int {
	n := copy(p, *pre)
	*pre = (*pre)[n:]
	return n
}
