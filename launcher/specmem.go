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

// afterStarts wraps an event handler so that the start-up's transient heap
// (the ranks' start events decoded and handled) is returned to the system
// once ranks ranks have started: from then on the launcher's memory is
// what the job holds, not what starting it took.
func afterStarts(ranks int, handle func(wire.Event)) func(wire.Event) {
	started := 0
	return func(ev wire.Event) {
		handle(ev)
		if ev.Ev == "started" {
			if started++; started == ranks {
				supervisor.ReturnStartupMemory()
			}
		}
	}
}
