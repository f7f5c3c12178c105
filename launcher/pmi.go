package launcher

import (
	"errors"
	"fmt"

	"github.com/gorun-hpc/gorun/internal/cliflag"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/pmi"
)

// How gorun serves MPI's process-management interface (package pmi) to the
// ranks, and where each piece runs:
//
//   - The per-job supervisor on each host (launcher/supervisor's pmi.go)
//     is the PMI server for the ranks it starts. In the default mode it
//     makes one socketpair per rank and hands the rank its end as
//     descriptor 3, with PMI_FD=3 — the way Hydra does; in the port mode
//     it listens on loopback and gives each rank PMI_PORT and a random
//     PMI_ID. Everything a rank asks about itself is answered there.
//   - A barrier is job-wide. When every rank of a host entered it, that
//     host's supervisor emits a "pmi-fence" event with the puts made on
//     the host since the previous barrier. The event travels the way every
//     supervisor event does (over the host agent's connection for other
//     hosts), and gorun's event loop counts one fence per supervisor. With
//     all of them in, gorun keeps the puts and sends every supervisor a
//     "pmi-release" command that carries no values, which lets its ranks
//     out. gorun is the only place that sees every host, so no host waits
//     on another host's agent directly.
//   - A rank's get of a key its host does not hold becomes a "pmi-get"
//     event; gorun answers that supervisor alone with "pmi-value", and the
//     supervisor keeps the value for its other ranks. So what a host
//     receives per barrier is what its ranks read, once per host, not the
//     whole job's keys: at 1,000 hosts of 8 ranks, sending the union to
//     every host would be ~8,000 business cards to each host per barrier
//     (~800 MB from gorun). The answer is a batch (pmi.Store): with the
//     key come the other keys its host put in that barrier, so a program
//     that reads every rank's key (MPICH ch4's address exchange does)
//     makes one round trip per host it reads from, not one per key.
//   - An MPI_Abort reaches the supervisor as cmd=abort and gorun as a
//     "pmi-abort" event: the job ends with the aborting rank named and its
//     code, through the same teardown as any rank failure. A rank that
//     exits 0 after PMI init but without PMI finalize is a failure too: the
//     others would wait for it in MPI's next collective forever.
//   - A rank that dies in MPI_Init or in a collective ends the job as any
//     rank death does; its peers stuck in a PMI barrier are torn down with
//     everything else, and the supervisor closes the server so nothing
//     waits on a barrier that can never complete.
//
// The protocols are MPICH's PMI-1 and PMI-2 (a client picks by the version
// it asks for); Open MPI needs PMIx, which gorun does not serve, and gorun
// refuses Open MPI programs before any rank starts (launcher/program).

// PMIMode selects how ranks reach gorun's PMI server.
type PMIMode string

const (
	// PMIFD (the default, also "") gives each rank a connected socket as
	// descriptor 3 and PMI_FD=3.
	PMIFD PMIMode = "fd"
	// PMIPort gives each rank PMI_PORT (a loopback TCP address of its
	// host's server) and a random PMI_ID; for programs that close
	// inherited descriptors before MPI_Init.
	PMIPort PMIMode = "port"
	// PMINone serves no PMI and exports no PMI_* variable: an MPI program
	// then runs as one singleton per rank, which is what the user asked.
	PMINone PMIMode = "none"
)

// ParsePMIMode accepts fd, port or none.
func ParsePMIMode(s string) (PMIMode, error) {
	return cliflag.OneOf("launcher: --pmi", s, PMIFD, PMIPort, PMINone)
}

// pmiJobFor returns the PMI description of plan, or nil when the plan's
// ranks are not told about PMI (plan.Config.NoPMI).
func pmiJobFor(plan *Plan, mode PMIMode) (*wire.PMIJob, error) {
	if !plan.PMI {
		return nil, nil
	}
	counts := make([]int, len(plan.Nodes))
	for i, n := range plan.Nodes {
		counts[i] = n.Ranks
	}
	mapping, err := pmi.ProcessMapping(counts)
	if err != nil {
		return nil, err
	}
	return &wire.PMIJob{KVSName: "gorun-" + plan.JobID, Size: plan.WorldSize, Mapping: mapping, Port: mode == PMIPort}, nil
}

// pmiFences is gorun's side of a job-wide barrier: one fence per
// supervisor per epoch, then one release to all, and the answers to the
// supervisors' gets. Owned by the event loop.
type pmiFences struct {
	// hosts is the number of supervisors that fence.
	hosts int
	epoch int
	seen  int
	// kvs holds the open barrier's puts by host and those of every
	// released barrier, which are all a get may see.
	kvs pmi.Store
}

// get answers a supervisor's "pmi-get": the key's value if a host put it
// before the last released barrier, and in KVS the batch that comes with
// it: the other keys that host put in that barrier (pmi.Store.Get); a
// key of a batch this host was sent before goes without its value.
func (f *pmiFences) get(ev wire.Event) wire.Cmd {
	a := f.kvs.Get(ev.Rank, ev.Key)
	if a.Batched {
		a.Value, a.Found = "", false // the host has it from the batch (Batched implies found)
	}
	return wire.Cmd{Op: "pmi-value", Key: ev.Key, Value: a.Value, Found: a.Found, Batched: a.Batched, KVS: a.More}
}

// add counts one supervisor's fence and returns the release command once
// every supervisor fenced epoch; ok is false until then. A fence of
// another epoch is a protocol error (supervisors cannot run ahead: each
// waits for the release before its ranks can enter the next barrier).
func (f *pmiFences) add(ev wire.Event) (cmd wire.Cmd, ok bool, err error) {
	if ev.Epoch != f.epoch {
		return wire.Cmd{}, false, fmt.Errorf("PMI fence for barrier %d while barrier %d is open", ev.Epoch, f.epoch)
	}
	f.kvs.Fence(ev.Rank, ev.KVS)
	f.seen++
	if f.seen < max(f.hosts, 1) {
		return wire.Cmd{}, false, nil
	}
	f.kvs.Release()
	cmd = wire.Cmd{Op: "pmi-release", Epoch: f.epoch}
	f.epoch, f.seen = f.epoch+1, 0
	return cmd, true, nil
}

// errPMIProtocol marks a supervisor that broke the fence protocol.
var errPMIProtocol = errors.New("launcher: PMI fence protocol broken")
