package rendezvous

import (
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorun-hpc/gorun/internal/liveness"
)

// leaseFixture is a leasedReader on one end of a pipe (no peer
// credentials: the lease alone judges, as for a peer on another host)
// with a 1 s lease, and the other end to write frames into.
func leaseFixture(t *testing.T, limit time.Duration) (*leasedReader, net.Conn, *stallLog) {
	t.Helper()
	a, b := net.Pipe()
	cfg := DefaultConfig()
	cfg.AttachLease, cfg.AttachBeat, cfg.StarvedLimit = time.Second, 100*time.Millisecond, limit
	r := newLeasedReader(a, &cfg, make(chan struct{}), 0)
	log := &stallLog{}
	r.stalls = log // not the process's: the test says what stalled
	return r, b, log
}

// sleepOr sleeps for d unless stop closes first; it reports whether it
// slept the whole time.
func sleepOr(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// beatUntil writes a beat now and every 100 ms from c until stop closes (a peer
// that is alive); a write that fails ends it.
func beatUntil(c net.Conn, stop <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := c.Write(beatFrame); err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// A reader that was away from its stream for longer than the lease (its
// caller handled a frame: a leader routing a message that waits for a
// slow relay, an attached rank applying a table under a busy lock) must
// not blame the peer, whose beats sat unread meanwhile: before, its next
// read was given the deadline of the last byte plus the lease, already
// past, and a read whose deadline has passed reports the deadline, not
// the bytes waiting, so a live peer was declared silent.
func TestLeaseExcusesReaderAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, peer, _ := leaseFixture(t, 0)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		defer wg.Wait()
		defer func() { _ = peer.Close(); _ = r.c.Close() }()
		wg.Go(func() {
			_ = writeFrame(peer, frameMsg, []byte{1})
			beatUntil(peer, stop)
		})
		if typ, _, err := r.next(); err != nil || typ != frameMsg {
			t.Fatalf("first frame: %c, %v", typ, err)
		}
		time.Sleep(3 * time.Second) // handling it, away from the stream
		wg.Go(func() {
			time.Sleep(500 * time.Millisecond)
			close(stop)
			_ = writeFrame(peer, frameMsg, []byte{2})
		})
		typ, body, err := r.next()
		if err != nil || typ != frameMsg || len(body) != 1 || body[0] != 2 {
			t.Fatalf("after 3 s away: %c %v, %v; want the peer's second message", typ, body, err)
		}
	})
}

// The same silence of a peer is excused while this process was stalled
// (it could not have read the peer anyway), is named at the lease when
// the process ran on time, and is named whatever the stalls past
// StarvedLimit.
func TestLeaseExcusesOwnStalls(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stalled time.Duration // of the first 2.4 s of the peer's silence
		limit   time.Duration
		// silent: the reader declared the peer silent, at at, before
		// its beats resumed at 2.4 s (else it read them).
		silent bool
		at     time.Duration // when the verdict came, if silent
	}{
		{"ran on time", 0, 0, true, time.Second},
		{"stalled 1.5 s of it", 1500 * time.Millisecond, 0, false, 0},
		{"stalled, past the limit", 1500 * time.Millisecond, 1500 * time.Millisecond, true, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, peer, log := leaseFixture(t, tc.limit)
				start := time.Now()
				stop := make(chan struct{})
				var wg sync.WaitGroup
				defer wg.Wait()
				defer func() { close(stop); _ = peer.Close(); _ = r.c.Close() }()
				if tc.stalled > 0 {
					// As the link writers would record it, each at the
					// end of a stall: 0.1..0.9 s and 1.0..1.7 s.
					wg.Go(func() {
						if sleepOr(stop, 900*time.Millisecond) {
							log.add(start.Add(100*time.Millisecond), time.Now())
						}
						if sleepOr(stop, 800*time.Millisecond) {
							log.add(start.Add(1000*time.Millisecond), time.Now())
						}
					})
				}
				wg.Go(func() {
					if sleepOr(stop, 2400*time.Millisecond) {
						beatUntil(peer, stop)
					}
				})
				wg.Go(func() {
					if sleepOr(stop, 2800*time.Millisecond) {
						_ = writeFrame(peer, frameMsg, []byte{1})
					}
				})
				_, _, err := r.next()
				var se *SilenceError
				if got := errors.As(err, &se); got != tc.silent {
					t.Fatalf("next: %v; want silent %v", err, tc.silent)
				}
				if took := time.Since(start); tc.silent && took != tc.at {
					t.Errorf("declared silent after %v, want %v", took, tc.at)
				}
			})
		})
	}
}

// The stall log merges spans that overlap (many writers see one
// starvation), counts only what falls between its two moments (a span
// that reaches past the second counts up to it), and drops a span of
// another clock rather than merging across years.
func TestStallLog(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var s stallLog
	s.add(at(100), at(300))
	s.add(at(200), at(400)) // overlaps: one span 100..400
	s.add(at(1000), at(1500))
	s.add(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2000, 1, 1, 0, 0, 1, 0, time.UTC)) // dropped
	for _, tc := range []struct {
		from, now int
		want      time.Duration
	}{
		{0, 2000, 800 * time.Millisecond},
		{250, 2000, 650 * time.Millisecond},
		{0, 1200, 500 * time.Millisecond},    // 1000..1500 counts up to now
		{1200, 1400, 200 * time.Millisecond}, // within one span
		{1500, 3000, 0},
		{0, 50, 0}, // before every span
	} {
		if got := s.between(at(tc.from), at(tc.now)); got != tc.want {
			t.Errorf("between(%d ms, %d ms) = %v, want %v", tc.from, tc.now, got, tc.want)
		}
	}
	if len(s.spans) != 2 {
		t.Errorf("spans = %v, want two", s.spans)
	}
}

// The stall still going on is the log's latest span, and writers on
// other threads extend it as they run: one that read its clock just after
// the reader did may have added to it by the time the reader reads the
// log, so the span the reader finds reaches past its own now. Before,
// such a span was not counted at all, and since every overlapping stall
// is merged into it, a reader in a process stalled throughout its peer's
// silence was excused nothing (a 4,096-rank process lagging 4 s judged
// its attach streams with 0 s excused). A bubble's clock stands still
// while goroutines run, so the test writes that span's end ahead of the
// reader's clock: the process stalled from 0.1 s through the reader's
// judgement, the peer's beats resume at 2.4 s.
func TestLeaseExcusesStallStillGoing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, peer, log := leaseFixture(t, 0)
		start := time.Now()
		log.add(start.Add(100*time.Millisecond), start.Add(2400*time.Millisecond+time.Microsecond))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		defer wg.Wait()
		defer func() { close(stop); _ = peer.Close(); _ = r.c.Close() }()
		wg.Go(func() {
			if sleepOr(stop, 2400*time.Millisecond) {
				beatUntil(peer, stop)
			}
		})
		wg.Go(func() {
			if sleepOr(stop, 2800*time.Millisecond) {
				_ = writeFrame(peer, frameMsg, []byte{1})
			}
		})
		if typ, _, err := r.next(); err != nil || typ != frameMsg {
			t.Fatalf("next: %c, %v after %v; want the peer's message (its silence fell within the process's stall)", typ, err, time.Since(start))
		}
	})
}

// A leader beats to an attached rank from its hello on, also while it
// cannot yet decide on the rank (World.mu held: memberlist's callbacks
// hold it for long stretches while thousands of ranks join). Before, its
// writer started only once the rank was accepted, under the lock, while
// the rank's lease on the leader ran from its hello: a 4,096-rank
// formation failed with a leader "silent" 4 s into it while the process
// ran on time. Here the leader's lock is held for 2.5 leases (real time:
// a goroutine waiting for a mutex does not let a synctest bubble's clock
// advance).
func TestLeaderBeatsBeforeAccepting(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JobID, cfg.WorldSize, cfg.LocalWorldSize, cfg.Host = "beats", 2, 2, "h0"
	cfg.Secret = []byte("0123456789abcdef0123456789abcdef")
	cfg.AttachLease, cfg.AttachBeat = time.Second, 50*time.Millisecond
	leader := newWorld(cfg)
	rankCfg := cfg
	rankCfg.Rank, rankCfg.LocalRank = 1, 1
	a, b := net.Pipe()
	leader.mu.Lock() // busy: the rank waits for its verdict
	var wg sync.WaitGroup
	wg.Go(func() { leader.serveAttached(a, func() {}) })
	wg.Go(func() {
		time.Sleep(2500 * time.Millisecond)
		leader.mu.Unlock()
	})
	key, err := attachKey(&rankCfg)
	if err == nil {
		err = handshake(b, key, false, time.Second)
	}
	if err == nil {
		err = writeFrame(b, frameHello, encodeMeta(rankCfg.meta()))
	}
	if err != nil {
		t.Fatal(err)
	}
	lr := newLeasedReader(b, &rankCfg, nil, 0)
	typ, _, err := lr.next()
	if err != nil || typ != frameLeader {
		t.Errorf("rank's first frame from its busy leader: %c, %v; want the leader's rank after its beats", typ, err)
	}
	_ = b.Close()
	wg.Wait()
	leader.wg.Wait()
}

// credPipe is one end of an in-memory stream that names its peer's
// process, as an AttachNet's connection may (PeerCredConn).
type credPipe struct {
	net.Conn
	uid, pid int
}

func (c credPipe) PeerCred() (int, int, bool) { return c.uid, c.pid, true }

var _ PeerCredConn = credPipe{}

// A connection that names its peer's process is judged on the kernel's
// evidence about that process, as a Unix socket's is: here the peer's
// process runs (the fake kernel says so for its pid only), so its silence
// is starvation and is waited out up to StarvedLimit. Without the
// evidence (before, any stream that was not a Unix socket) the lease
// alone decided: silent at 1 s. The leader also refuses a peer it names
// as another user's.
func TestLeaseAsksAboutNamedPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := net.Pipe()
		defer func() { _ = a.Close(); _ = b.Close() }()
		cfg := DefaultConfig()
		cfg.AttachLease, cfg.AttachBeat, cfg.StarvedLimit = time.Second, 100*time.Millisecond, 5*time.Second
		var cpu time.Duration
		cfg.procSample = func(pid int) (liveness.Sample, bool) {
			if pid != 4242 {
				return liveness.Sample{}, false
			}
			cpu += time.Millisecond
			return liveness.Sample{State: 'S', CPU: cpu}, true
		}
		r := newLeasedReader(credPipe{Conn: a, uid: os.Getuid(), pid: 4242}, &cfg, make(chan struct{}), 0)
		r.stalls = &stallLog{}
		start := time.Now()
		_, _, err := r.next()
		var se *SilenceError
		if !errors.As(err, &se) || se.Verdict != liveness.Silent {
			t.Fatalf("next: %v; want silent past StarvedLimit", err)
		}
		if took := time.Since(start); took < cfg.StarvedLimit {
			t.Errorf("declared silent after %v (%v), want the peer waited for up to StarvedLimit %v", took, se.Why, cfg.StarvedLimit)
		}
		if err := checkPeer(credPipe{Conn: a, uid: os.Getuid() + 1, pid: 4242}); err == nil {
			t.Error("checkPeer accepted a peer named as another user's")
		}
	})
}
