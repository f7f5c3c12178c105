//go:build !linux

package comm

import (
	"bufio"
	"errors"
	"net"
	"runtime"
)

// Shared memory is implemented for Linux only; elsewhere every link is TCP.

type shmSegment struct{ name string }

var errNoShm = errors.New("comm: shared memory is only implemented on Linux")

func createShm(string, GroupID, int, int, int) (*shmSegment, error)       { return nil, errNoShm }
func openShm(string, string, int) (*shmSegment, error)                    { return nil, errNoShm }
func (*shmSegment) unlink()                                               {}
func (*shmSegment) unmap()                                                {}
func newShmLink(net.Conn, *bufio.Reader, *shmSegment, GroupID, bool) Link { panic("unreachable") }
func sweepShm(string) int                                                 { return 0 }

// SweepShm removes leftover shared-memory segments; none exist here.
func SweepShm(string) int     { return 0 }
func markCrowded([]Link, int) {}

// onlineCPUs is the number of CPUs (Linux reads the host's online set).
func onlineCPUs() int { return runtime.NumCPU() }

// JoinSchedGroup has no scheduling group to join here (see
// schedgroup_linux.go).
func JoinSchedGroup(string, int) (string, func(), error) { return "", func() {}, nil }

// RemoveSchedGroup has nothing to remove here.
func RemoveSchedGroup(string) error { return nil }
