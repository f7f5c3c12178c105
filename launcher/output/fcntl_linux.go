package output

import "golang.org/x/sys/unix"

func fcntlGetfl(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0) }

// pipeBuffered is how many bytes wait unread in the pipe fd (0 on error).
func pipeBuffered(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0
	}
	return n
}
