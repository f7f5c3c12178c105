package rendezvoustest

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreeSeed returns "127.0.0.1:PORT" for a port that was free a moment ago for
// both TCP and UDP: a rendezvous seed (memberlist) binds the port on both, so a
// port checked for TCP alone can still fail the seed's bind. Tests that start
// real processes use it for the seed address.
func FreeSeed(t testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// FreePort is FreeSeed's port alone. It is picked at random below the
// kernel's ephemeral range (net.ipv4.ip_local_port_range), from which the
// kernel hands out ports for binds to port 0 and for outgoing connections:
// a port found free there and released could be taken by any other
// process's connection before the test binds it again (TestWorld/srun in
// CI: "bind: address already in use" on its seed port while other
// packages' tests ran). Below the range only another test that picks the
// same port at the same moment can take it. Where the range starts too low
// to leave room, the port comes from the kernel as before.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := 20000, ephemeralStart()
	for range 50 {
		port := 0
		if hi-lo >= 1000 {
			port = lo + rand.IntN(hi-lo)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			if port == 0 {
				t.Fatal(err)
			}
			continue // in use: another try
		}
		port = l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("rendezvoustest: no port free for both TCP and UDP in 50 tries")
	return 0
}

// ephemeralStart is the first port of the kernel's ephemeral range (32768,
// Linux's default, where it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
