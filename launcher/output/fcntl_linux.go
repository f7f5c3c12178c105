package output

import "golang.org/x/sys/unix"

func fcntlGetfl(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0) }
