package connlimit

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{DefaultConfig(), true},
		{Config{Max: 1, PerSource: 1}, true},
		{Config{Max: 0, PerSource: 1}, false},
		{Config{Max: 4, PerSource: 5}, false},
		{Config{Max: 4, PerSource: -1}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
	}
}

// Silent connections from one source take at most PerSource slots; the
// ones over that are closed at once (the client reads EOF), and a
// connection from another source still gets a slot. Close closes the
// pending ones and ends Accept.
func TestGateBounds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Two "sources" on one loopback address, standing in for two hosts:
	// the test maps each client's local address to a source name before
	// it dials (mustDialAs).
	var mu sync.Mutex
	srcOf := map[string]string{}
	g, err := New(Config{Max: 4, PerSource: 2}, func(c net.Conn) string {
		mu.Lock()
		defer mu.Unlock()
		return srcOf[c.RemoteAddr().String()]
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var accepted []net.Conn
	var amu sync.Mutex
	wg.Go(func() {
		for {
			c, _, err := g.Accept(ln)
			if err != nil {
				return
			}
			amu.Lock()
			accepted = append(accepted, c)
			amu.Unlock()
		}
	})
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := 0; i < 5; i++ {
		clients = append(clients, mustDialAs(t, ln, &mu, srcOf, "a"))
	}
	waitFor(t, func() bool { s := g.Stats(); return s.Pending == 2 && s.Refused == 3 })
	// The refused ones were closed without a byte.
	closed := 0
	for _, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			closed++
		}
	}
	if closed != 3 {
		t.Errorf("%d clients saw EOF, want 3", closed)
	}
	clients = append(clients, mustDialAs(t, ln, &mu, srcOf, "b"))
	waitFor(t, func() bool { return g.Stats().Pending == 3 })
	g.Close()
	ln.Close()
	wg.Wait()
	amu.Lock()
	defer amu.Unlock()
	for _, c := range accepted {
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a pending connection is still open after Close")
		}
	}
}

// The global bound leaves connections in the backlog: with Max 1, a second
// connection is not accepted until the first is released.
func TestGateBackpressure(t *testing.T) {
	g, err := New(Config{Max: 1, PerSource: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, got, stop := listenGate(t, g, 2)
	c1, _ := net.Dial("tcp", ln.Addr().String())
	defer c1.Close()
	a1 := <-got
	c2, _ := net.Dial("tcp", ln.Addr().String())
	defer c2.Close()
	select {
	case <-got:
		t.Fatal("a second connection was accepted while the only slot was taken")
	case <-time.After(100 * time.Millisecond):
	}
	a1.rel()
	a1.rel() // idempotent
	a2 := <-got
	a1.c.Close()
	a2.c.Close()
	a2.rel()
	stop()
	if s := g.Stats(); s.Pending != 0 {
		t.Errorf("pending %d after release", s.Pending)
	}
}

// accepted is a connection the gate admitted, with its release.
type accepted struct {
	c   net.Conn
	rel func()
}

// listenGate listens on loopback and accepts through g until g or the
// listener is closed, sending each admitted connection on got (buffered:
// buf, which must hold every one the test leaves there). stop, also run at
// the test's end, closes g and the listener, waits for the accept loop and
// closes the admitted connections left in got.
func listenGate(t *testing.T, g *Gate, buf int) (ln net.Listener, got chan accepted, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got = make(chan accepted, buf)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, rel, err := g.Accept(ln)
			if err != nil {
				return
			}
			got <- accepted{c, rel}
		}
	})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			g.Close()
			ln.Close()
			wg.Wait()
			close(got)
			for a := range got {
				a.c.Close()
			}
		})
	}
	t.Cleanup(stop)
	return ln, got, stop
}

func mustDialAs(t *testing.T, ln net.Listener, mu *sync.Mutex, srcOf map[string]string, src string) net.Conn {
	t.Helper()
	// Reserve a local port by listening on it, then dial from it: the
	// mapping exists before the connection does.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	mu.Lock()
	srcOf[addr.String()] = src
	mu.Unlock()
	d := net.Dialer{LocalAddr: addr}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Admit counts connections accepted elsewhere against both bounds and
// never blocks.
func TestGateAdmit(t *testing.T) {
	g, err := New(Config{Max: 3, PerSource: 2}, func(c net.Conn) string { return c.(*namedConn).src })
	if err != nil {
		t.Fatal(err)
	}
	var rels []func()
	for i, tc := range []struct {
		src string
		ok  bool
	}{{"a", true}, {"a", true}, {"a", false}, {"b", true}, {"c", false}} {
		rel, ok := g.Admit(&namedConn{src: tc.src})
		if ok != tc.ok {
			t.Fatalf("admission %d from %s: %v, want %v", i, tc.src, ok, tc.ok)
		}
		if ok {
			rels = append(rels, rel)
		}
	}
	rels[0]()
	if _, ok := g.Admit(&namedConn{src: "c"}); !ok {
		t.Error("a released slot was not reused")
	}
	if s := g.Stats(); s.Pending != 3 || s.Refused != 2 {
		t.Errorf("stats %+v, want 3 pending and 2 refused", s)
	}
	g.Close()
}

// namedConn is a connection that only names its source.
type namedConn struct {
	net.Conn
	src string
}

func (*namedConn) Close() error { return nil }

// Under Evict, held connections give way: a newcomer over PerSource closes
// the oldest pending connection of its own source (not another source's),
// a newcomer over Max the oldest of all, and the newcomer is admitted at
// once in both cases, never refused or left in the backlog.
func TestGateEvict(t *testing.T) {
	var mu sync.Mutex
	srcOf := map[string]string{}
	g, err := New(Config{Max: 4, PerSource: 3, Evict: true}, func(c net.Conn) string {
		mu.Lock()
		defer mu.Unlock()
		return srcOf[c.RemoteAddr().String()]
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, got, stop := listenGate(t, g, 16)
	next := func() accepted {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(5 * time.Second):
			t.Fatal("a newcomer was not admitted within 5 s")
			return accepted{}
		}
	}
	// closedByGate reports whether the client's end sees EOF.
	closedByGate := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func(src string) net.Conn {
		c := mustDialAs(t, ln, &mu, srcOf, src)
		clients = append(clients, c)
		return c
	}
	b1 := dial("b")
	next()
	a1, a2, a3 := dial("a"), dial("a"), dial("a")
	next()
	next()
	next()
	// a's fourth: over PerSource, so a's oldest (a1) goes, not b's b1.
	a4 := dial("a")
	a4s := next()
	if !closedByGate(a1) || closedByGate(b1) {
		t.Errorf("over PerSource: a1 closed %v, b1 closed %v; want a1 evicted, b1 kept", closedByGate(a1), closedByGate(b1))
	}
	// Released connections are no longer pending and are never evicted.
	a4s.rel()
	// c's first: Max (4) is full (b1, a2, a3 and c1 would be 4 with a4
	// released: room), so nothing goes; c's second evicts the oldest, b1.
	c1 := dial("c")
	next()
	if closedByGate(b1) || closedByGate(a4) {
		t.Error("a connection was evicted while the gate had room")
	}
	dial("c")
	next()
	if !closedByGate(b1) || closedByGate(a2) || closedByGate(c1) {
		t.Errorf("over Max: want the oldest of all (b1) evicted, and a2, c1 kept")
	}
	if s := g.Stats(); s.Pending != 4 || s.Evicted != 2 || s.Refused != 0 {
		t.Errorf("stats %+v, want 4 pending, 2 evicted, none refused", s)
	}
	_, _ = a3, a4
	stop()
}

// Claim ends a handshake for good: a claimed connection is never evicted
// or closed by the gate, one the gate evicted or closed first cannot be
// claimed, and a claimed slot is free for the next connection.
func TestGateClaim(t *testing.T) {
	for _, evict := range []bool{true, false} {
		g, err := New(Config{Max: 2, PerSource: 2, Evict: evict}, func(net.Conn) string { return "a" })
		if err != nil {
			t.Fatal(err)
		}
		var ends []net.Conn
		conn := func() net.Conn {
			c, p := net.Pipe()
			ends = append(ends, c, p)
			return c
		}
		c1, c2 := conn(), conn()
		rel1, ok1 := g.Admit(c1)
		_, ok2 := g.Admit(c2)
		if !ok1 || !ok2 {
			t.Fatalf("evict=%v: two connections not admitted under Max 2", evict)
		}
		if !g.Claim(c2) {
			t.Fatalf("evict=%v: a pending connection could not be claimed", evict)
		}
		rel1() // c1 ends its handshake as before
		if g.Claim(c1) {
			t.Errorf("evict=%v: a released connection was claimed", evict)
		}
		// Two newcomers fill the gate again; a third evicts the oldest
		// pending one (c3), never the claimed c2.
		c3, c4, c5 := conn(), conn(), conn()
		g.Admit(c3)
		g.Admit(c4)
		if _, ok := g.Admit(c5); ok != evict {
			t.Fatalf("evict=%v: third newcomer admitted=%v", evict, ok)
		}
		if evict {
			if g.Claim(c3) {
				t.Error("an evicted connection was claimed")
			}
			if !g.Claim(c4) {
				t.Error("a pending connection was not claimed after another's eviction")
			}
			_ = c2.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
			if _, err := c2.Write([]byte{1}); errors.Is(err, io.ErrClosedPipe) {
				t.Errorf("the claimed connection was closed: %v", err)
			}
		}
		g.Close()
		if g.Claim(c5) {
			t.Errorf("evict=%v: a connection claimed after Close", evict)
		}
		if st := g.Stats(); st.Pending != 0 && evict {
			t.Errorf("evict=%v: %d pending after every claim and Close", evict, st.Pending)
		}
		for _, c := range ends {
			c.Close()
		}
	}
}

// Under Evict a full gate closes the oldest silent connection before any
// that has spoken, and the oldest that has spoken only when none is
// silent; Heard marks a connection on its first read of bytes.
func TestGateEvictsSilentFirst(t *testing.T) {
	g, err := New(Config{Max: 3, PerSource: 3, Evict: true}, func(net.Conn) string { return "a" })
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var ends []net.Conn
	defer func() {
		for _, c := range ends {
			c.Close()
		}
	}()
	conn := func() (net.Conn, net.Conn) {
		c, p := net.Pipe()
		ends = append(ends, c, p)
		if _, ok := g.Admit(c); !ok {
			t.Fatal("not admitted")
		}
		return c, p
	}
	c1, p1 := conn()
	c2, _ := conn()
	c3, _ := conn()
	// c1, the oldest, speaks (read through Heard).
	go func() { _, _ = p1.Write([]byte("hello")) }()
	if _, err := io.ReadFull(g.Heard(c1), make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	c4, _ := conn() // evicts c2, the oldest silent one
	if g.Claim(c2) {
		t.Error("the oldest silent connection was not the one evicted")
	}
	g.Spoke(c3)
	g.Spoke(c4)
	c5, _ := conn() // none silent: evicts c1, the oldest
	for _, tc := range []struct {
		c    net.Conn
		want bool
		name string
	}{{c1, false, "c1 (oldest, spoken)"}, {c3, true, "c3"}, {c4, true, "c4"}, {c5, true, "c5"}} {
		if got := g.Claim(tc.c); got != tc.want {
			t.Errorf("%s: claimed=%v, want %v", tc.name, got, tc.want)
		}
	}
	if st := g.Stats(); st.Evicted != 2 || st.Pending != 0 {
		t.Errorf("stats %+v, want 2 evicted and none pending", st)
	}
}

// A connection whose peer's bytes wait unread counts as spoken: its
// owner's goroutine has not run yet, and eviction passes it over for a
// silent one even though it is older.
func TestGateEvictsSilentBeforeUnread(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g, err := New(Config{Max: 2, PerSource: 2, Evict: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	accept := func(say string) net.Conn {
		t.Helper()
		cl, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cl)
		if say != "" {
			if _, err := cl.Write([]byte(say)); err != nil {
				t.Fatal(err)
			}
		}
		c, _, err := g.Accept(ln)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		return c
	}
	older := accept("hello") // spoke, never read
	silent := accept("")
	deadline := time.Now().Add(5 * time.Second)
	for !waiting(older) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	accept("")
	if !g.Claim(older) {
		t.Error("the older connection, whose bytes wait unread, was evicted")
	}
	if g.Claim(silent) {
		t.Error("the silent connection was not the one evicted")
	}
}
