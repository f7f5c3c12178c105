package main

import (
	"testing"
	"time"
)

// The socket costs come from real messages between this process and a
// peer process (about 2 s): every figure is above a microsecond (two
// system calls and a parked process woken cost more) and below a
// millisecond, and a new connection with its exchange costs more than the
// exchange's two messages on an open stream (the connect, accept and
// close are work). A machine this loaded cannot order finer figures.
func TestSocketCostsMeasured(t *testing.T) {
	if testing.Short() {
		t.Skip("real sockets between processes, about 2 s")
	}
	f, err := measureSocketsOnce(200, 93, 26)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("udp %v, tcp msg %v, tcp 64 KiB %v, tcp conn %v, unix msg %v, unix conn %v", f.udp, f.msg, f.big, f.conn, f.umsg, f.uconn)
	for name, d := range map[string]time.Duration{"udp": f.udp, "tcp message": f.msg, "tcp connection": f.conn, "unix message": f.umsg, "unix connection": f.uconn} {
		if d <= time.Microsecond || d >= time.Millisecond {
			t.Errorf("%s: %v per message, want in (1µs, 1ms)", name, d)
		}
	}
	if f.conn <= 2*f.msg || f.uconn <= 2*f.umsg {
		t.Errorf("a connection and its exchange (tcp %v, unix %v) cost no more than two messages (tcp %v, unix %v)", f.conn, f.uconn, f.msg, f.umsg)
	}
}
