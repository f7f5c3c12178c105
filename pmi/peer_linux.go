package pmi

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// loopbackPeerUID finds the user that owns the other end of a loopback TCP
// connection: the kernel lists every socket of this network namespace with
// its owner in /proc/net/tcp and /proc/net/tcp6, and the peer's socket is
// the one whose local address is our remote one and whose remote address
// is our local one. ok is false when it is not listed (not loopback, or
// gone already).
func loopbackPeerUID(c net.Conn) (uid int, ok bool) {
	la, err1 := netip.ParseAddrPort(c.LocalAddr().String())
	ra, err2 := netip.ParseAddrPort(c.RemoteAddr().String())
	if err1 != nil || err2 != nil {
		return 0, false
	}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 8 {
				continue
			}
			l, okl := parseProcAddr(fs[1])
			r, okr := parseProcAddr(fs[2])
			if okl && okr && l == ra && r == la {
				u, err := strconv.Atoi(fs[7])
				return u, err == nil
			}
		}
	}
	return 0, false
}

// parseProcAddr reads /proc/net/tcp's "0100007F:1F90": the address as the
// kernel stores it (32-bit words in host order, little-endian here), the
// port in hex.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	raw, err2 := hex.DecodeString(h)
	if !ok || err != nil || err2 != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), true
}

// checkPortPeer refuses a PMI port connection from another user: the
// ranks run as this user, and a stranger on the host must not get to try
// PMI ids. root passes (it can read the ids anyway). A peer that cannot be
// found is refused too: a rank's socket is always listed.
func checkPortPeer(c net.Conn) error {
	uid, ok := loopbackPeerUID(c)
	switch {
	case !ok:
		return fmt.Errorf("%w: cannot tell which user %s is", ErrProtocol, c.RemoteAddr())
	case uid != os.Getuid() && uid != 0:
		return fmt.Errorf("%w: %s belongs to uid %d, not this job's user (uid %d)", ErrProtocol, c.RemoteAddr(), uid, os.Getuid())
	}
	return nil
}
