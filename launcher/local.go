package launcher

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
)

// LocalIdentity is what names this machine: host names and interface
// addresses. Until multi-host launch exists, every host of a plan must be
// one of them.
type LocalIdentity struct {
	// Names holds lower-cased host names (localhost, os.Hostname and its
	// short form).
	Names []string
	// Addrs holds the machine's interface addresses in canonical form.
	Addrs []string
}

// DetectLocal gathers the local host names and interface addresses. It reads
// no DNS: a lookup could hang, and a name that only DNS maps to this machine
// is rare enough to spell as localhost instead.
func DetectLocal() LocalIdentity {
	id := LocalIdentity{
		Names: []string{"localhost", "localhost.localdomain", "ip6-localhost"},
		Addrs: []string{"127.0.0.1", "::1"},
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		h = strings.ToLower(h)
		id.Names = append(id.Names, h)
		if short, _, ok := strings.Cut(h, "."); ok {
			id.Names = append(id.Names, short)
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				id.Addrs = append(id.Addrs, ipn.IP.String())
			}
		}
	}
	return id
}

// IsLocal reports whether name designates this machine.
func (id LocalIdentity) IsLocal(name string) bool {
	n := strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	if slices.Contains(id.Names, n) {
		return true
	}
	if ip := net.ParseIP(n); ip != nil {
		if ip.IsLoopback() {
			return true
		}
		return slices.Contains(id.Addrs, ip.String())
	}
	return false
}

// RemoteHostError reports a host that is not this machine, where only this
// machine is allowed (RequireLocal); Launch starts host agents there.
type RemoteHostError struct {
	// Host is the offending host name.
	Host string
}

func (e *RemoteHostError) Error() string {
	return fmt.Sprintf("launcher: host %q is not this machine "+
		"(localhost, 127.0.0.1, ::1, this machine's hostname or one of its addresses)", e.Host)
}

// RequireLocal returns a *RemoteHostError for the first host that is not
// local. Launch uses it to decide whether a job needs host agents.
func RequireLocal(hosts []Host, id LocalIdentity) error {
	for _, h := range hosts {
		if !id.IsLocal(h.Name) {
			return &RemoteHostError{Host: h.Name}
		}
	}
	return nil
}

// NewJobIdentity makes a job id (16 hex digits) and a job secret (32 random
// bytes, hex encoded) from the system's random source.
func NewJobIdentity() (jobID, secret string, err error) {
	var b [8 + 32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("launcher: job identity: %w", err)
	}
	return hex.EncodeToString(b[:8]), hex.EncodeToString(b[8:]), nil
}
