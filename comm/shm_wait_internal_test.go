//go:build linux

package comm

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"
	"unsafe"
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

// A producer that finds its ring empty past wrapFrom starts the next frame
// at the ring's beginning, so light traffic stays within wrapFrom plus a
// frame; frames sent while the ring holds unread data go on where they are.
// Every frame arrives intact either way, and a skip leaves room for the two
// unread frames of up to EagerLimit that Send promises to take.
func TestShmRingRestartsWhenEmpty(t *testing.T) {
	const ringBytes = 4 << 20
	// Every frame on the ring: small ones would go to fast slots.
	fastLimit.Store(-1)
	defer fastLimit.Store(fastMaxPayload)
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
	a := newShmLink(c1, bufio.NewReader(c1), seg, 1, true)
	b := newShmLink(c2, bufio.NewReader(c2), peerSeg, 1, false)
	defer func() { _ = a.Close(); _ = b.Close() }()

	payload := func(seq, n int) []byte {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(seq*31 + j)
		}
		return p
	}
	send := func(seq, n int) {
		t.Helper()
		if err := a.Send(&Header{Frame: frameData, Seq: uint64(seq), Len: uint64(n)}, payload(seq, n)); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(seq, n int) {
		t.Helper()
		h, got := recvFrame(t, b)
		if h.Seq != uint64(seq) || !bytes.Equal(got, payload(seq, n)) {
			t.Fatalf("frame %d: got seq %d, %d bytes (want %d), payload equal %v", seq, h.Seq, h.Len, n, bytes.Equal(got, payload(seq, n)))
		}
	}
	eager := a.EagerLimit()
	sizes := []int{100 << 10, 7, 0, 150 << 10, 33, eager, 1, 64 << 10}
	maxFrame := uint64(eager + 2*HeaderSize)
	if a.wrapFrom()+maxFrame >= ringBytes {
		t.Fatal("the test needs a ring larger than wrapFrom and a frame")
	}
	skips := 0
	for i := range 80 {
		n := sizes[i%len(sizes)]
		skip := a.tx.pos&a.tx.mask >= a.wrapFrom() // the ring is empty here
		send(i, n)
		if end := a.tx.pos & a.tx.mask; end > a.wrapFrom()+maxFrame {
			t.Fatalf("frame %d ends %d bytes into the ring although the ring was empty", i, end)
		}
		if !skip {
			recv(i, n)
			continue
		}
		// Right after a skip the consumer has not read the skip record:
		// a second frame of EagerLimit must still go in without it
		// reading (a hang here is the deadlock wrapFrom prevents).
		skips++
		send(1000+i, eager)
		recv(i, n)
		recv(1000+i, eager)
	}
	if skips == 0 {
		t.Fatal("no frame skipped to the ring's beginning")
	}
	// Two frames in flight: the second finds unread data and follows the
	// first, wherever that is.
	for i := 100; i < 140; i += 2 {
		var before uint64
		for k := range 2 {
			n := sizes[(i+k)%len(sizes)]
			send(i+k, n)
			if want := uint64(HeaderSize + (n+7)&^7); k == 1 && a.tx.pos-before != want {
				t.Fatalf("frame %d took %d bytes of the ring with unread data before it, want %d", i+k, a.tx.pos-before, want)
			}
			before = a.tx.pos
		}
		recv(i, sizes[i%len(sizes)])
		recv(i+1, sizes[(i+1)%len(sizes)])
	}
}

// Frames of a message at least as long as the ring go on through the ring
// even when the peer has read everything, so a long message laps all of it
// rather than rewriting the lines at the ring's beginning that the peer has
// just read; frames of shorter messages still skip back (lapsRing).
func TestShmRingLongMessageGoesOn(t *testing.T) {
	const ringBytes = 1 << 20
	a, b := newShmPair(t, ringBytes)
	seg := a.EagerLimit()
	frame := uint64(HeaderSize + seg) // seg is a multiple of 8: no padding
	for _, tc := range []struct {
		total int
		skips bool
	}{
		{total: ringBytes - 1, skips: true},
		{total: ringBytes, skips: false},
		{total: 64 << 20, skips: false},
	} {
		start := a.tx.pos
		skipped := false
		for i := range 3 * ringBytes / seg { // three laps' worth
			p := testPayload(i, seg)
			if err := a.Send(&Header{Frame: frameData, Seq: uint64(i), Aux: uint64(tc.total), Len: uint64(seg)}, p); err != nil {
				t.Fatal(err)
			}
			// Each frame follows the last one unless the link skipped
			// back to the ring's beginning.
			if a.tx.pos-start != uint64(i+1)*frame {
				skipped = true
				start = a.tx.pos - uint64(i+1)*frame
			}
			h, got := recvFrame(t, b)
			if h.Seq != uint64(i) || h.Aux != uint64(tc.total) || !bytes.Equal(got, p) {
				t.Fatalf("message of %d bytes, frame %d: got seq %d aux %d, payload equal %v", tc.total, i, h.Seq, h.Aux, bytes.Equal(got, p))
			}
		}
		if skipped != tc.skips {
			t.Errorf("frames of a %d-byte message on a %d-byte ring: skipped back %v, want %v", tc.total, ringBytes, skipped, tc.skips)
		}
	}
}

// A crowded link yields the core only to a peer in its own scheduling
// group (one autogroup), and sleeps otherwise: markCrowded reads both
// sides' tags from the segment, where each side wrote its own when it
// mapped it.
func TestShmYieldsOnlyWithinOneSession(t *testing.T) {
	const mine = 77
	for _, tc := range []struct {
		name      string
		ranks     int    // ranks on the host
		peerSid   uint32 // the peer's tag
		crowded   bool
		wantYield bool
	}{
		{"crowded, one group", 1 << 20, mine, true, true},
		{"crowded, peer in another group", 1 << 20, mine + 1, true, false},
		{"peer published nothing", 1 << 20, 0, true, false},
		{"one rank per CPU", 1, mine, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newShmPair(t, 1<<16)
			if a.seg.session(0) != schedGroup() || a.seg.session(1) != schedGroup() {
				t.Fatalf("tags published %d and %d, want this process's (%d) twice", a.seg.session(0), a.seg.session(1), schedGroup())
			}
			*(*uint32)(unsafe.Pointer(&a.seg.mem[sidCtlOff])) = mine
			*(*uint32)(unsafe.Pointer(&a.seg.mem[sidCtlOff+cacheLine])) = tc.peerSid
			markCrowded([]Link{a, b}, tc.ranks)
			for _, l := range []*shmLink{a, b} {
				if l.crowded != tc.crowded || l.yieldOK != tc.wantYield {
					t.Errorf("side %d: crowded %v, yields %v; want %v, %v", l.side, l.crowded, l.yieldOK, tc.crowded, tc.wantYield)
				}
			}
		})
	}
}

// The tag follows the scheduler: the cpu cgroup below the hierarchy's
// root, else the autogroup when it is on, one group when it is off, the
// session id only without the proc files, and nothing when even that is
// hidden (a session leader outside this PID namespace, as in a container
// entered with exec).
func TestSchedGroupTag(t *testing.T) {
	for _, tc := range []struct {
		enabled, autogroup string
		sid                int
		want               uint32
	}{
		{"1\n", "/autogroup-66899 nice 0\n", 30712, 66900},
		{"1\n", "/autogroup-66899 nice 0\n", 0, 66900},
		{"0\n", "/autogroup-66899 nice 0\n", 0, 1},
		{"", "", 30712, 30712 | 1<<31},
		{"1\n", "garbage", 30712, 30712 | 1<<31},
		{"", "", 0, 0},
	} {
		if got := schedGroupTag(tc.enabled, tc.autogroup, "", tc.sid); got != tc.want {
			t.Errorf("schedGroupTag(%q, %q, %d) = %d, want %d", tc.enabled, tc.autogroup, tc.sid, got, tc.want)
		}
	}
	// Below the root of the cpu hierarchy the cgroup is the group, whatever
	// the session or autogroup: one tag for one cgroup, another for another.
	a := schedGroupTag("1\n", "/autogroup-66899 nice 0\n", "v1:/gorun-sched-job1", 30712)
	b := schedGroupTag("1\n", "/autogroup-7 nice 0\n", "v1:/gorun-sched-job1", 99)
	c := schedGroupTag("0\n", "", "v1:/gorun-sched-job2", 0)
	if a != b || a == c || a == 0 || c == 0 || a == 66900 || a&(1<<31) != 0 {
		t.Errorf("cgroup tags: same cgroup %d and %d, other %d", a, b, c)
	}
	if schedGroup() == 0 {
		t.Log("this machine tells no scheduling group: crowded links sleep instead of yielding")
	}
}

// With foreign callers (libgorun), a waiter yields the P only where one of
// this process's goroutines must run for the call to progress; Go's own
// threads always may. Dropping the foreign-caller rows' writer cases (the
// rule before: never yield with foreign callers) left a 4-rank ring
// all-reduce from C at two thirds of native speed (goschedOK's comment).
func TestGoschedOnlyWhereNeededWithForeignCallers(t *testing.T) {
	for _, tc := range []struct {
		foreign bool
		mode    int
		writers int32
		want    bool
	}{
		{false, waitRxAny, 0, true},
		{false, waitRxRing, 0, true},
		{false, waitTxFast, 0, true},
		{false, waitTxRing, 0, true},
		{true, waitRxAny, 0, false},  // the C caller polls its own receive side
		{true, waitRxRing, 0, false}, // likewise, inside a ring frame
		{true, waitTxFast, 0, false}, // a small send waiting for a slot: nothing of ours to run
		{true, waitTxRing, 0, true},  // a ring writer waiting for room
		{true, waitRxAny, 1, true},   // a goroutine of ours is writing what the peer may wait for
		{true, waitRxRing, 2, true},
	} {
		if got := goschedOK(tc.foreign, tc.mode, tc.writers); got != tc.want {
			t.Errorf("goschedOK(foreign %v, mode %d, writers %d) = %v, want %v", tc.foreign, tc.mode, tc.writers, got, tc.want)
		}
	}
}
