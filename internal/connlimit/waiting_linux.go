package connlimit

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// waiting reports whether bytes from c's peer wait in its receive buffer,
// unread: the peer has spoken though its owner's goroutine has not run
// yet (a starved process reads late). One ioctl, never blocking.
func waiting(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}
