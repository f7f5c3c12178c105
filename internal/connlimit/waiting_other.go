//go:build !linux

package connlimit

import "net"

// waiting is the Linux receive-buffer check; elsewhere only Spoke counts.
func waiting(net.Conn) bool { return false }
