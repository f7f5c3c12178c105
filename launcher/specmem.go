package launcher

import (
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// sendSpec sends spec with send, then drops this process's copy of the
// ranks (every rank's environment, the supervisor's now) and returns the
// start-up's transient memory; it returns send's error.
func sendSpec(send func(any) error, spec *wire.SupervisorSpec) error {
	err := send(*spec)
	spec.Ranks = nil
	supervisor.ReturnStartupMemory()
	return err
}
