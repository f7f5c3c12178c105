//go:build !linux

package comm

import "time"

// tcpInfoWorks: only Linux's TCP_INFO is read; elsewhere links are not
// watched and TCP's own timeouts apply.
const tcpInfoWorks = false

func (s *tcpStream) ackState() (bool, time.Duration) { return false, 0 }
