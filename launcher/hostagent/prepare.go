package hostagent

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/gorun-hpc/gorun/launcher/limits"
	"github.com/gorun-hpc/gorun/launcher/ports"
	"github.com/gorun-hpc/gorun/launcher/program"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/netif"
)

// prepareHost checks what this host needs before any rank starts: the
// interface, the program, two free ports.
func prepareHost(o Options, job *wire.Job, c net.Conn, programComing bool) (wire.Hello, *ports.Reservation) {
	h := wire.Hello{Version: o.Version, PID: os.Getpid()}
	h.Hostname, _ = os.Hostname()
	var choice netif.Choice
	var err error
	if job.Iface != "" {
		choice, err = netif.Override(job.Iface)
	} else {
		ap, perr := netip.ParseAddrPort(c.LocalAddr().String())
		if perr != nil {
			err = perr
		} else {
			choice, err = netif.Holding(ap.Addr())
		}
	}
	if err != nil {
		h.Err, h.ErrKind = err.Error(), "iface"
		return h, nil
	}
	h.Iface, h.Addr, h.Why = choice.Name, choice.Addr.String(), choice.Why
	if job.Ranks > 0 {
		// This host's limits, not the launching machine's, decide
		// whether its ranks can start (launcher/limits).
		if err := limits.Check(job.Ranks, limits.Read()); err != nil {
			h.Err, h.ErrKind = strings.TrimPrefix(err.Error(), "launcher: "), "capacity"
			return h, nil
		}
	}
	prog, err := program.Resolve(job.Program, rankDir(job.Dir))
	if programComing && job.Program != "" && filepath.IsAbs(job.Program) {
		// Preloaded: it arrives before the ranks start.
		prog, err = job.Program, nil
	}
	if err == nil && !job.NoPMI && !programComing {
		// Open MPI would form one singleton per rank (launcher/program).
		err = program.CheckOpenMPI(job.Program, prog)
	}
	if err != nil {
		var pe *program.Error
		if errors.As(err, &pe) {
			err = pe.Err
		}
		h.Err, h.ErrKind = err.Error(), "program"
		return h, nil
	}
	h.Program = prog
	reserved, err := ports.Reserve()
	if err != nil {
		h.Err, h.ErrKind = err.Error(), "ports"
		return h, nil
	}
	h.MasterPort, h.RdzvPort = reserved.MasterPort, reserved.RdzvPort
	return h, reserved
}

// rankDir is dir when it exists on this host, else the home directory.
func rankDir(dir string) string {
	if dir != "" {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
	}
	home, _ := os.UserHomeDir()
	return home
}
