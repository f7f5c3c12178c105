//go:build linux

package comm

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"
)

// The waiter turns to yielding at once after one wait that found the peer
// on its CPU, and back to
// spinning first only after fastWaitsToSpin quick waits in a row.
func TestWaiterAdaptsToSlowPeer(t *testing.T) {
	var r ring
	r.noteWait(time.Microsecond, false)
	if r.slowPeer {
		t.Fatal("slow after a quick wait")
	}
	r.noteWait(time.Microsecond, true)
	if !r.slowPeer {
		t.Fatal("not slow after a wait that found the peer on our CPU")
	}
	for i := range fastWaitsToSpin - 1 {
		r.noteWait(time.Microsecond, false)
		if i == fastWaitsToSpin/2 {
			r.noteWait(yieldAfter.get()+time.Microsecond, false) // neither quick nor slow: no reset, no count
		}
	}
	if !r.slowPeer {
		t.Fatalf("spinning again after %d quick waits", fastWaitsToSpin-1)
	}
	r.noteWait(time.Microsecond, false)
	if r.slowPeer {
		t.Fatalf("still slow after %d quick waits", fastWaitsToSpin)
	}
}

// A producer that finds its ring empty past shmHotBytes starts the next
// frame at the ring's beginning, so light traffic stays within the first
// shmHotBytes plus a frame; frames sent while the ring holds unread data go
// on where they are. Every frame arrives intact either way.
func TestShmRingRestartsWhenEmpty(t *testing.T) {
	const ringBytes = 1 << 20
	dir := t.TempDir()
	seg, err := createShm(dir, 1, 0, 1, ringBytes)
	if err != nil {
		t.Fatal(err)
	}
	peerSeg, err := openShm(dir, seg.name, ringBytes)
	if err != nil {
		t.Fatal(err)
	}
	seg.unlink()
	c1, c2 := net.Pipe()
	a := newShmLink(c1, bufio.NewReader(c1), seg, true)
	b := newShmLink(c2, bufio.NewReader(c2), peerSeg, false)
	defer func() { _ = a.Close(); _ = b.Close() }()

	payload := func(i, n int) []byte {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*31 + j)
		}
		return p
	}
	recv := func(i, n int) {
		t.Helper()
		var h Header
		if err := b.RecvHeader(&h); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, h.Len)
		if err := b.RecvPayload(got); err != nil {
			t.Fatal(err)
		}
		if h.Seq != uint64(i) || !bytes.Equal(got, payload(i, n)) {
			t.Fatalf("frame %d: seq %d, %d bytes, payload differs: %v", i, h.Seq, h.Len, !bytes.Equal(got, payload(i, n)))
		}
	}
	sizes := []int{100 << 10, 7, 0, 150 << 10, 33, 200 << 10, 1, 64 << 10}
	maxFrame := 200<<10 + 2*HeaderSize
	if shmHotBytes+maxFrame >= ringBytes {
		t.Fatal("the test needs a ring larger than shmHotBytes and a frame")
	}
	for i := range 60 {
		n := sizes[i%len(sizes)]
		if err := a.Send(&Header{Frame: frameData, Seq: uint64(i), Len: uint64(n)}, payload(i, n)); err != nil {
			t.Fatal(err)
		}
		if end := a.tx.pos & a.tx.mask; end > shmHotBytes+uint64(maxFrame) {
			t.Fatalf("frame %d ends %d bytes into the ring although the ring was empty", i, end)
		}
		recv(i, n)
	}
	// Two frames in flight: the second finds unread data and follows the
	// first, wherever that is.
	for i := 60; i < 70; i += 2 {
		var before uint64
		for k := range 2 {
			n := sizes[(i+k)%len(sizes)]
			if err := a.Send(&Header{Frame: frameData, Seq: uint64(i + k), Len: uint64(n)}, payload(i+k, n)); err != nil {
				t.Fatal(err)
			}
			if want := uint64(HeaderSize + (n+7)&^7); k == 1 && a.tx.pos-before != want {
				t.Fatalf("frame %d took %d bytes of the ring with unread data before it, want %d", i+k, a.tx.pos-before, want)
			}
			before = a.tx.pos
		}
		recv(i, sizes[i%len(sizes)])
		recv(i+1, sizes[(i+1)%len(sizes)])
	}
}
