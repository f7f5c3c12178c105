package rendezvous

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// peerCred returns the user and process id of a Unix socket's peer as the
// kernel recorded them at connect (SO_PEERCRED), or what a PeerCredConn
// says of its peer; ok is false for other connections (in-memory test
// streams), which carry no credentials.
func peerCred(c net.Conn) (uid, pid int, ok bool) {
	if pc, says := c.(PeerCredConn); says {
		return pc.PeerCred()
	}
	uc, isUnix := c.(*net.UnixConn)
	if !isUnix {
		return 0, 0, false
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return 0, 0, false
	}
	return int(cred.Uid), int(cred.Pid), true
}

// checkPeer refuses a Unix socket peer that runs as another user. The
// same user, or root (who can read the job secret anyway), may connect;
// the handshake then asks for the secret. A connection without credentials
// (not a Unix socket) is left to the handshake alone.
func checkPeer(c net.Conn) error {
	uid, pid, ok := peerCred(c)
	if !ok || uid == os.Getuid() || uid == 0 {
		return nil
	}
	return &PeerError{UID: uid, PID: pid, Want: os.Getuid()}
}
