package rendezvoustest

import (
	"net"
	"strconv"
	"testing"
)

// FreeSeed returns "127.0.0.1:PORT" for a port that was free a moment ago for
// both TCP and UDP: a rendezvous seed (memberlist) binds the port on both, so a
// port checked for TCP alone can still fail the seed's bind. Tests that start
// real processes use it for the seed address.
func FreeSeed(t testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// FreePort is FreeSeed's port alone.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("rendezvoustest: no port free for both TCP and UDP in 20 tries")
	return 0
}
