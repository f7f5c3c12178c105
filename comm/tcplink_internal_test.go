package comm

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// tcpPair returns two connected loopback TCP connections.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { // waited for below
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { a.Close(); r.c.Close() })
	return a, r.c
}

// tcpPairs returns k connected pairs: the two sides of a k-stream link.
func tcpPairs(t *testing.T, k int) (a, b []net.Conn) {
	t.Helper()
	for range k {
		x, y := tcpPair(t)
		a, b = append(a, x), append(b, y)
	}
	return a, b
}

func newTestTCPLink(cs []net.Conn, spin time.Duration) *tcpLink {
	return newTCPLink(cs, make([][]byte, len(cs)), tcpOptions{spin: spin})
}

// xorInto is a reduction whose result shows every byte: dst starts zeroed,
// so dst ends equal to what was sent.
func xorInto(dst, src []byte) {
	for i := range dst {
		dst[i] ^= src[i]
	}
}

// Frames of every size class around the link's thresholds arrive intact and
// in order, whether read with RecvPayload or RecvReduce, with or without
// polling, over one connection or striped over several, and however the
// byte stream is cut by the kernel.
func TestTCPLinkFramesRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 7, 8, 9, 56, 100, tcpEager - 1, tcpEager, tcpEager + 1, tcpEager + 7,
		tcpChunk - 3, tcpChunk, tcpChunk + 1, 3*tcpChunk + 5, 1 << 20}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		sizes = append(sizes, rng.IntN(300<<10))
	}
	for _, tc := range []struct {
		streams int
		spin    time.Duration
	}{{1, 0}, {1, 20 * time.Microsecond}, {2, 0}, {3, 20 * time.Microsecond}, {maxTCPStreams, 0}} {
		spin := tc.spin
		a, b := tcpPairs(t, tc.streams)
		tx, rx := newTestTCPLink(a, spin), newTestTCPLink(b, spin)
		payloads := make([][]byte, len(sizes))
		for i, n := range sizes {
			payloads[i] = make([]byte, n)
			for j := range payloads[i] {
				payloads[i][j] = byte(rng.Uint32())
			}
		}
		errc := make(chan error, 1)
		go func() { // waited for through errc
			for i, p := range payloads {
				h := Header{Frame: frameData, Kind: KindAllReduce, Seq: uint64(i), Len: uint64(len(p))}
				if err := tx.Send(&h, p); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for i, p := range payloads {
			var h Header
			if err := rx.RecvHeader(&h); err != nil {
				t.Fatalf("spin %v frame %d: %v", spin, i, err)
			}
			if h.Seq != uint64(i) || h.Len != uint64(len(p)) {
				t.Fatalf("spin %v frame %d: header seq %d len %d, want %d and %d", spin, i, h.Seq, h.Len, i, len(p))
			}
			got := make([]byte, h.Len)
			var err error
			if i%2 == 0 {
				err = rx.RecvPayload(got)
			} else {
				err = rx.RecvReduce(got, xorInto)
			}
			if err != nil {
				t.Fatalf("spin %v frame %d: %v", spin, i, err)
			}
			if !bytes.Equal(got, p) {
				t.Fatalf("%d streams, spin %v, frame %d (%d bytes): payload differs", tc.streams, spin, i, len(p))
			}
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		tx.Close()
		rx.Close()
	}
}

// RecvReduce hands the reduction whole 8-byte words (but for the last
// piece), so that it never splits an element, however the stream is cut.
func TestTCPLinkRecvReduceWholeWords(t *testing.T) {
	a, b := tcpPair(t)
	rx := newTestTCPLink([]net.Conn{b}, 0)
	p := make([]byte, 1<<20+4)
	for i := range p {
		p[i] = byte(i * 7)
	}
	errc := make(chan error, 1)
	go func() { // waited for through errc
		var hb [HeaderSize]byte
		h := Header{Frame: frameData, Len: uint64(len(p))}
		h.Encode(hb[:])
		if _, err := a.Write(hb[:]); err != nil {
			errc <- err
			return
		}
		for off := 0; off < len(p); off += 999 { // odd cuts in the stream
			if _, err := a.Write(p[off:min(off+999, len(p))]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	var h Header
	if err := rx.RecvHeader(&h); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, h.Len)
	off := 0
	err := rx.RecvReduce(got, func(d, s []byte) {
		if &d[0] != &got[off] {
			t.Errorf("piece at %d handed out of order", off)
		}
		off += len(d)
		if len(d)%8 != 0 && off != len(got) {
			t.Errorf("piece of %d bytes ending at %d splits a word", len(d), off)
		}
		xorInto(d, s)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Fatal("payload differs")
	}
}

// What the handshake's reader holds when the link takes over is the start
// of the stream, not lost.
func TestTCPLinkTakesOverBufferedBytes(t *testing.T) {
	a, b := tcpPair(t)
	tx := newTestTCPLink([]net.Conn{a}, 0)
	for i := range 3 {
		h := Header{Frame: frameData, Seq: uint64(i), Len: 5}
		if err := tx.Send(&h, []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(b)
	if _, err := br.Peek(3 * (HeaderSize + 5)); err != nil { // everything is now in br
		t.Fatal(err)
	}
	rx := newTCPLink([]net.Conn{b}, [][]byte{leftover(br)}, tcpOptions{})
	for i := range 3 {
		var h Header
		if err := rx.RecvHeader(&h); err != nil || h.Seq != uint64(i) {
			t.Fatalf("frame %d: seq %d, %v", i, h.Seq, err)
		}
		got := make([]byte, 5)
		if err := rx.RecvPayload(got); err != nil || string(got) != "hello" {
			t.Fatalf("frame %d: %q, %v", i, got, err)
		}
	}
}

// Close unblocks a receive that is polling or parked, and the peer sees the
// connection end.
func TestTCPLinkCloseUnblocks(t *testing.T) {
	a, b := tcpPairs(t, 2)
	tx, rx := newTestTCPLink(a, 0), newTestTCPLink(b, time.Millisecond)
	errc := make(chan error, 1)
	go func() { // waited for through errc
		var h Header
		errc <- rx.RecvHeader(&h)
	}()
	tx.Close()
	if err := <-errc; err == nil {
		t.Fatal("RecvHeader returned nil after the peer closed")
	}
	rx.Close()

	// Our own Close: on a second pair whose peer stays open, so the read
	// can only end through Close (on the first pair it could end with the
	// peer's EOF before Close ran, whatever Close does).
	c, d := tcpPairs(t, 2)
	peer, own := newTestTCPLink(c, 0), newTestTCPLink(d, time.Millisecond)
	defer peer.Close()
	go func() { // waited for through errc
		var h Header
		errc <- own.RecvHeader(&h)
	}()
	own.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("RecvHeader after Close: %v, want net.ErrClosed", err)
	}
}

// Sending and receiving a large frame allocates nothing in steady state.
func TestTCPLinkNoAllocations(t *testing.T) {
	a, b := tcpPairs(t, 2)
	tx, rx := newTestTCPLink(a, 20*time.Microsecond), newTestTCPLink(b, 20*time.Microsecond)
	p := make([]byte, 256<<10)
	dst := make([]byte, len(p))
	small := make([]byte, 8)
	var sh, rh Header
	step := func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			sh = Header{Frame: frameData, Len: uint64(len(p))}
			_ = tx.Send(&sh, p)
			sh = Header{Frame: frameData, Len: uint64(len(small))}
			_ = tx.Send(&sh, small)
		}()
		_ = rx.RecvHeader(&rh)
		_ = rx.RecvReduce(dst, xorInto)
		_ = rx.RecvHeader(&rh)
		_ = rx.RecvPayload(small)
		<-done
	}
	step()
	// The goroutine and channel of step are two allocations; the link
	// must add none.
	n := testing.AllocsPerRun(20, step)
	t.Logf("%.1f allocations per step", n)
	if n > 3 {
		t.Errorf("%.1f allocations per large+small frame, want the test's own 2-3", n)
	}
}

// One stream of a striped link dying mid-frame fails the receive (and the
// send) instead of leaving either side waiting on the streams still up.
func TestTCPLinkStreamLostMidStripe(t *testing.T) {
	a, b := tcpPairs(t, 3)
	rx := newTestTCPLink(b, 0)
	p := make([]byte, 1<<20)
	var hb [HeaderSize]byte
	h := Header{Frame: frameData, Len: uint64(len(p))}
	h.Encode(hb[:])
	// By hand: the header and piece 0 on stream 0, half of piece 1 on
	// stream 1, then stream 1 dies; stream 2 stays up, silent.
	lo, hi := stripe(len(p), 3, 0)
	if _, err := a[0].Write(append(hb[:], p[lo:hi]...)); err != nil {
		t.Fatal(err)
	}
	lo, hi = stripe(len(p), 3, 1)
	if _, err := a[1].Write(p[lo : (lo+hi)/2]); err != nil {
		t.Fatal(err)
	}
	a[1].Close()
	var got Header
	if err := rx.RecvHeader(&got); err != nil {
		t.Fatal(err)
	}
	err := rx.RecvReduce(make([]byte, len(p)), xorInto)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("RecvReduce with a stream gone: %v, want io.ErrUnexpectedEOF", err)
	}
	// The sending side fails too: b's stream 2 peer is gone, while its
	// streams 0 and 1 are drained.
	a[2].Close()
	var wg sync.WaitGroup
	for _, c := range a[:2] {
		wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
	}
	tx := newTestTCPLink(b, 0)
	var serr error
	for range 8 {
		if serr = tx.Send(&h, p); serr != nil {
			break
		}
	}
	tx.Close()
	wg.Wait()
	if serr == nil {
		t.Fatal("Send kept succeeding with one stream's peer gone")
	}
}

// An authenticated connection whose stream fields make no sense is refused
// at the handshake: an index past the count, a count past the limit, or
// shared memory offered on a connection other than the first.
func TestEndpointRefusesBadStreams(t *testing.T) {
	secret := []byte("stream test secret")
	ep, err := Listen(EndpointConfig{Addr: "127.0.0.1:0", Secret: secret, ForceTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	client := &Endpoint{cfg: EndpointConfig{Secret: secret}}
	for _, h := range []hello{
		{streams: 2, stream: 2},
		{streams: maxTCPStreams + 1, stream: 1},
		{streams: 0, stream: 1}, // streams 0 is a status query, which has no stream index
		{streams: 2, stream: 1, shmName: "gorun-x", shmBytes: 1 << 16},
	} {
		h.gid, h.from, h.to, h.size = 1, 1, 0, 2
		conn, err := net.Dial("tcp", ep.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.clientHandshake(conn, bufio.NewReader(conn), h)
		conn.Close()
		if !errors.Is(err, ErrAuth) {
			t.Errorf("hello %+v: %v, want the connection refused", h, err)
		}
	}
	// A sound one is accepted.
	conn, err := net.Dial("tcp", ep.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ack, err := client.clientHandshake(conn, bufio.NewReader(conn), hello{gid: 1, from: 1, size: 2, streams: 2, stream: 1})
	if err != nil || ack != ackTCP {
		t.Fatalf("sound extra stream: ack %d, %v", ack, err)
	}
}

// A listener that accepts but never answers (a stopped process whose
// kernel still completes the TCP handshake) is reported as silent, not as
// an authentication failure: the stall diagnosis queries frozen ranks, and
// "authentication failed" sent users looking for a wrong secret.
func TestHandshakeSilentPeerIsNotAuth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(100 * time.Millisecond))
	client := &Endpoint{cfg: EndpointConfig{Secret: []byte("silent peer")}}
	_, err = client.clientHandshake(conn, bufio.NewReader(conn), hello{gid: 1, from: 1, size: 2, streams: 1})
	if c := <-accepted; c != nil {
		c.Close()
	}
	if err == nil || errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "did not send the server's proof in time") {
		t.Fatalf("silent listener: %v, want a timeout that is not ErrAuth and says what was not sent", err)
	}
}
