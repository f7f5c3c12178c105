//go:build !linux

package pmi

import "net"

// checkPortPeer has no socket owner table to read off Linux; the random
// PMI ids alone guard the port there.
func checkPortPeer(net.Conn) error { return nil }
