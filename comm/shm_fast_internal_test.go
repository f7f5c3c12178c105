//go:build linux

package comm

import (
	"bufio"
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// recvFrame receives the next frame on l: its header and its payload.
func recvFrame(t *testing.T, l *shmLink) (Header, []byte) {
	t.Helper()
	var h Header
	if err := l.RecvHeader(&h); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, h.Len)
	if err := l.RecvPayload(got); err != nil {
		t.Fatal(err)
	}
	return h, got
}

// newShmPair maps one segment from both sides, as a dialer and an
// acceptor would, with the handshake's connection replaced by a pipe.
func newShmPair(t *testing.T, ringBytes int) (a, b *shmLink) {
	t.Helper()
	dir := t.TempDir()
	seg, err := createShm(dir, 7, 0, 1, ringBytes)
	if err != nil {
		t.Fatal(err)
	}
	peerSeg, err := openShm(dir, seg.name, ringBytes)
	if err != nil {
		t.Fatal(err)
	}
	seg.unlink()
	c1, c2 := net.Pipe()
	a = newShmLink(c1, bufio.NewReader(c1), seg, 7, true)
	b = newShmLink(c2, bufio.NewReader(c2), peerSeg, 7, false)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

func testPayload(seq, n int) []byte {
	p := make([]byte, n)
	for j := range p {
		p[j] = byte(seq*31 + j*7 + 1)
	}
	return p
}

// Frames arrive in the order they were sent whichever path each took:
// whole small data messages through fast slots, everything else (large
// payloads, segments of a longer message, aborts) through the ring, with
// every header field and payload byte intact.
func TestShmFastSlotsKeepFrameOrder(t *testing.T) {
	a, b := newShmPair(t, 1<<20)
	type frame struct {
		h    Header
		fast bool
	}
	var frames []frame
	for i := range 200 {
		h := Header{Frame: frameData, Kind: Kind(1 + i%10), DType: Float32, Op: Sum, Root: int32(i%5 - 1),
			Group: 7, Seq: uint64(1000 + i), Count: uint64(i * 3)}
		var n int
		switch i % 7 {
		case 0:
			n = 8
		case 1:
			n = 100 << 10 // ring
		case 2:
			n = 0
		case 3:
			n = fastMaxPayload
		case 4:
			n = fastMaxPayload + 1 // one byte too many: ring
		case 5:
			n = 24 // a segment of a longer message: ring
			h.Aux = 4096
		case 6:
			n = 17
			h.Frame, h.Kind, h.DType, h.Op, h.Root, h.Seq, h.Count = frameAbort, 0, 0, 0, 0, 0, 0
			h.Aux = 2
		}
		h.Len = uint64(n)
		if h.Aux == 0 && h.Frame == frameData {
			h.Aux = h.Len
		}
		frames = append(frames, frame{h: h, fast: h.Frame == frameData && h.Aux == h.Len && n <= fastMaxPayload})
	}
	errc := make(chan error, 1)
	go func() { // waited for through errc
		for i, f := range frames {
			h := f.h
			if err := a.Send(&h, testPayload(i, int(f.h.Len))); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	fast := 0
	for i, f := range frames {
		var h Header
		if err := b.RecvHeader(&h); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h != f.h {
			t.Fatalf("frame %d: header %+v, want %+v", i, h, f.h)
		}
		if f.fast != b.fastHeld {
			t.Fatalf("frame %d: from a fast slot %v, want %v", i, b.fastHeld, f.fast)
		}
		if f.fast {
			fast++
		}
		got := make([]byte, h.Len)
		if i%3 == 0 && h.Len%4 == 0 {
			// Fold it in instead (xor, which the payload check undoes).
			if err := b.RecvReduce(got, func(d, s []byte) {
				for k := range d {
					d[k] ^= s[k]
				}
			}); err != nil {
				t.Fatal(err)
			}
		} else if err := b.RecvPayload(got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, testPayload(i, int(h.Len))) {
			t.Fatalf("frame %d: payload differs", i)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if fast == 0 || fast == len(frames) {
		t.Fatalf("%d of %d frames took fast slots: the test needs both paths", fast, len(frames))
	}
}

// A sender that has filled every fast slot waits until the receiver hands
// one back, and never overwrites a frame that was not read.
func TestShmFastSlotsWaitForTheReceiver(t *testing.T) {
	a, b := newShmPair(t, 1<<16)
	send := func(i int) error {
		h := Header{Frame: frameData, Kind: KindAllReduce, Group: 7, Seq: uint64(i), Len: 8, Aux: 8}
		return a.Send(&h, testPayload(i, 8))
	}
	for i := range fastSlots {
		if err := send(i); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- send(fastSlots) }() // waited for below
	select {
	case err := <-done:
		t.Fatalf("send %d went through with every slot unread (err %v)", fastSlots, err)
	case <-time.After(50 * time.Millisecond):
	}
	for i := range fastSlots + 1 {
		var h Header
		if err := b.RecvHeader(&h); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 8)
		if err := b.RecvPayload(got); err != nil {
			t.Fatal(err)
		}
		if h.Seq != uint64(i) || !bytes.Equal(got, testPayload(i, 8)) {
			t.Fatalf("frame %d: seq %d, payload %x", i, h.Seq, got)
		}
		if i == 0 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A link closed by the peer ends a receiver waiting on the fast slots,
// after delivering what the peer sent before it went.
func TestShmFastSlotsDeliverThenFailOnClose(t *testing.T) {
	a, b := newShmPair(t, 1<<16)
	h := Header{Frame: frameData, Kind: KindBarrier, Group: 7, Seq: 1}
	if err := a.Send(&h, nil); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	var got Header
	if err := b.RecvHeader(&got); err != nil || got.Seq != 1 {
		t.Fatalf("frame sent before close: %+v, %v", got, err)
	}
	if err := b.RecvPayload(nil); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.RecvHeader(&got) }() // waited for below
	select {
	case err := <-errc:
		if err == nil {
			t.Fatalf("a frame after close: %+v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("receiver still waiting 10 s after the peer closed")
	}
}

// The receiver looks at the fast slot, finds nothing, and reads a ring
// header that was sent after a fast frame published in between: it must
// deliver the fast frame first and the ring frame next.
func TestShmFastFrameOvertakenOnTheRing(t *testing.T) {
	a, b := newShmPair(t, 1<<16)
	fast := Header{Frame: frameData, Kind: KindAllReduce, Group: 7, Seq: 1, Len: 8, Aux: 8}
	ring := Header{Frame: frameData, Kind: KindAllReduce, Group: 7, Seq: 2, Len: 8, Aux: 64}
	for _, h := range []Header{fast, ring} {
		if err := a.Send(&h, testPayload(int(h.Seq), 8)); err != nil {
			t.Fatal(err)
		}
	}
	// Hide the fast frame until the receiver has decided to read the ring.
	flag := flagOf(b.frx.slot(0))
	saved := *flag
	*flag = 0
	testBeforeRingHeader = func(*shmLink) { *flag = saved }
	defer func() { testBeforeRingHeader = nil }()
	for _, want := range []Header{fast, ring} {
		h, got := recvFrame(t, b)
		if h != want || !bytes.Equal(got, testPayload(int(want.Seq), 8)) {
			t.Fatalf("got %+v, want %+v", h, want)
		}
	}
}

// A producer that finds the ring empty near its end skips to the beginning
// with a skip record (see Send). Where the record itself would not fit
// before the end, writing it wrapped the producer into the next lap, and the
// skip then put it a whole ring (and more) ahead of the consumer: free space
// underflowed and the next large frame overwrote unread bytes, the skip
// record among them, so the consumer read payload as a header ("ring frame
// 1073741824 while frame 1368 is not in its fast slot", once in about 200
// runs of TestLargeMessagesDoNotDeadlock). Every position that leaves less
// than a header before the end (and the one that leaves exactly one) is
// tried: a frame of three rings must wait for the reader, and arrive intact.
func TestShmSkipRecordNeverWraps(t *testing.T) {
	const ring = 64 << 10
	for left := 8; left <= HeaderSize+8; left += 8 {
		a, b := newShmPair(t, ring)
		// One ring frame that leaves the producer `left` bytes before the
		// ring's end, read whole, so the ring is empty there.
		first := testPayload(1, ring-left-HeaderSize)
		h := Header{Frame: frameData, Kind: 1, DType: Uint8, Op: Sum, Group: 7, Seq: 1, Len: uint64(len(first)), Aux: uint64(len(first))}
		if err := a.Send(&h, first); err != nil {
			t.Fatal(err)
		}
		var got Header
		if err := b.RecvHeader(&got); err != nil {
			t.Fatal(err)
		}
		if err := b.RecvPayload(make([]byte, len(first))); err != nil {
			t.Fatal(err)
		}
		if pos, tail := a.tx.pos, atomic.LoadUint64(a.tx.tail); pos != tail || pos&a.tx.mask != uint64(ring-left) {
			t.Fatalf("left %d: set-up put the producer at %d (tail %d), want %d", left, pos&a.tx.mask, tail, ring-left)
		}
		big := testPayload(2, 3*ring)
		sent := make(chan error, 1)
		go func() {
			h := Header{Frame: frameData, Kind: 1, DType: Uint8, Op: Sum, Group: 7, Seq: 2, Len: uint64(len(big)), Aux: uint64(len(big))}
			sent <- a.Send(&h, big)
		}()
		select {
		case err := <-sent:
			t.Fatalf("left %d: a frame of three rings was sent before the reader read any of it (err %v): the producer overran the ring", left, err)
		case <-time.After(100 * time.Millisecond):
		}
		if err := b.RecvHeader(&got); err != nil {
			t.Fatalf("left %d: %v", left, err)
		}
		if got.Seq != 2 || got.Len != uint64(len(big)) {
			t.Fatalf("left %d: header seq %d len %d, want seq 2 len %d", left, got.Seq, got.Len, len(big))
		}
		buf := make([]byte, len(big))
		if err := b.RecvPayload(buf); err != nil {
			t.Fatalf("left %d: %v", left, err)
		}
		if !bytes.Equal(buf, big) {
			t.Fatalf("left %d: payload corrupted", left)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		_ = a.Close()
		_ = b.Close()
	}
}
