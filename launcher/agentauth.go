package launcher

import (
	"errors"
	"net"

	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// acceptAgent is wire.AcceptAuth with an authenticated agent of another
// protocol reported as its host's *outcome.VersionError, the error users see for
// any host running another gorun.
func acceptAgent(c net.Conn, secret []byte, job string, known func(host string) bool) (*wire.Conn, string, error) {
	w, host, err := wire.AcceptAuth(c, secret, job, known)
	var pe *wire.ProtocolError
	if errors.As(err, &pe) {
		return nil, host, &outcome.VersionError{Host: pe.Host, Remote: "protocol " + pe.Remote, Local: "protocol " + pe.Local}
	}
	return w, host, err
}
