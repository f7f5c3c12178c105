package launcher

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/plural"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/pmi"
	"github.com/gorun-hpc/gorun/rankenv"
)

// How gorun serves MPI's process-management interface (package pmi) to the
// ranks, and where each piece runs:
//
//   - The per-job supervisor on each host (supervisor.go) is the PMI server for
//     the ranks it starts. In the default mode it makes one socketpair per
//     rank and hands the rank its end as descriptor 3, with PMI_FD=3 — the
//     way Hydra does; in the port mode it listens on loopback and gives each
//     rank PMI_PORT and a random PMI_ID. Everything a rank asks about itself
//     is answered there.
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
// refuses Open MPI programs before any rank starts (mpilib.go).

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
	switch m := PMIMode(s); m {
	case PMIFD, PMIPort, PMINone:
		return m, nil
	}
	return "", fmt.Errorf("launcher: --pmi %q: expected fd, port or none", s)
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

// pmiRankFD is the descriptor number a rank finds its PMI socket at.
const pmiRankFD = 3

// supervisorPMI is a supervisor's PMI server and the per-rank descriptors
// it hands out. Only the supervisor's main goroutine calls its methods;
// the connection servers are goroutines it owns (wg).
type supervisorPMI struct {
	srv   *pmi.Server
	job   wire.PMIJob
	first int // the lowest rank served, named in fence events
	// ends are the ranks' ends of their socketpairs until they started.
	ends map[int]*os.File
	// served closes when the rank's connection server returns (fd mode).
	served map[int]chan struct{}
	addr   string // port mode: the listener's address
	// waiter holds the sockets of the ranks that have not spoken yet
	// (fd mode; pmiwait.go); nil when each is served from the start.
	waiter *pmiWaiter
	wg     sync.WaitGroup
}

// serveEach starts a connection server per socket in fds (the ranks' by
// index) right away: the way without an epoll set. It takes fds, closing
// them on failure.
func (sp *supervisorPMI) serveEach(fds, ranks []int, log zerolog.Logger) error {
	for i, fd := range fds {
		r := ranks[i]
		f := os.NewFile(uintptr(fd), "pmi-server")
		c, err := net.FileConn(f) // a duplicate; ours is closed next
		f.Close()
		if err != nil {
			closeFDs(fds[i+1:])
			return fmt.Errorf("launcher: PMI socket: %w", err)
		}
		served := sp.served[r]
		sp.wg.Go(func() {
			defer close(served)
			if err := sp.srv.ServeConn(r, c); err != nil {
				log.Warn().Err(err).Int("rank", r).Msg("PMI connection ended with an error")
			}
		})
	}
	return nil
}

// closeFDs closes raw descriptors.
func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// newSupervisorPMI starts serving PMI for ranks. In the fd mode every
// rank's socketpair exists before any rank starts, so a rank can never
// find its descriptor unserved.
func newSupervisorPMI(job wire.PMIJob, ranks []wire.SupervisorRank, log zerolog.Logger) (*supervisorPMI, error) {
	nums := make([]int, len(ranks))
	for i, r := range ranks {
		nums[i] = r.Rank
	}
	srv, err := pmi.NewServer(pmi.Config{
		KVSName: job.KVSName, Size: job.Size, Ranks: nums, ProcessMapping: job.Mapping,
		Fetch:  true,
		Logger: log.With().Str("part", "pmi").Logger(),
	})
	if err != nil {
		return nil, err
	}
	sp := &supervisorPMI{srv: srv, job: job, first: nums[0], ends: map[int]*os.File{}, served: map[int]chan struct{}{}}
	for _, r := range nums {
		sp.first = min(sp.first, r)
	}
	if job.Port {
		// Loopback: the ranks are on this host, and nothing else should
		// reach the job's key-value space.
		if sp.addr, err = srv.Listen("127.0.0.1:0"); err != nil {
			srv.Close()
			return nil, err
		}
		return sp, nil
	}
	mine := make([]int, 0, len(nums))
	for _, r := range nums {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			closeFDs(mine)
			sp.close()
			return nil, fmt.Errorf("launcher: PMI socketpair: %w", err)
		}
		mine = append(mine, fds[0])
		sp.ends[r] = os.NewFile(uintptr(fds[1]), "pmi-rank-"+strconv.Itoa(r))
		sp.served[r] = make(chan struct{})
	}
	if sp.waiter, err = newPMIWaiter(srv, mine, nums, sp.served, &sp.wg, log); err != nil {
		// No epoll set: a connection server per rank from the start.
		log.Debug().Err(err).Msg("PMI sockets served by a goroutine each")
		if err := sp.serveEach(mine, nums, log); err != nil {
			sp.close()
			return nil, err
		}
	}
	return sp, nil
}

// rankSetup returns the extra descriptor for rank (nil in the port mode)
// and its environment with the PMI variables of the mode set and the other
// mode's removed. Inherited PMI_FD, PMI_PORT and PMI_ID (gorun itself run
// under another process manager) never pass through: they would point a
// rank at the wrong server, and an empty value is not the same as unset
// (MPICH reads an empty PMI_FD as descriptor 0).
//
// Every rank served PMI also gets openMPIRefusal, in place of any value the
// user set, so that an Open MPI rank fails in MPI_Init however Open MPI was
// loaded (see openMPIRefusal).
func (sp *supervisorPMI) rankSetup(rank int, env []string) (*os.File, []string) {
	env = withoutVars(env, append([]string{rankenv.PMIFD, rankenv.PMIPort, rankenv.PMIID}, openMPIRefusalVars...)...)
	for _, v := range openMPIRefusalVars {
		env = append(env, v+"="+openMPIRefusal)
	}
	if sp.job.Port {
		return nil, append(env, rankenv.PMIPort+"="+sp.addr, rankenv.PMIID+"="+strconv.Itoa(sp.srv.ID(rank)))
	}
	return sp.ends[rank], append(env, rankenv.PMIFD+"="+strconv.Itoa(pmiRankFD))
}

// openMPIRefusalVars make every Open MPI rank that gorun serves PMI fail
// in its start-up with an error naming gorun, instead of running as a
// silent one-rank singleton: the check of the program's libraries
// (mpilib.go) cannot see Open MPI loaded at run time (python3 with an
// mpi4py built for Open MPI, a dlopen). Open MPI reads its MCA parameters
// from OMPI_MCA_<name>; told to use a component that does not exist, it
// stops, prints "A requested component was not found ... Framework: F,
// Component: <openMPIRefusal>" and the rank exits 1. Two frameworks, for
// two generations:
//
//   - schizo, opened first thing in orte_init (Open MPI 3 and 4), before
//     a singleton forks its helper daemon: a later failure (pml) is
//     printed through that daemon, which loses the message (seen with
//     Debian's Open MPI 4.1 under gorun: "ORTE_ERROR_LOG: Out of
//     resource in show_help.c" and no text);
//   - pml, opened by every MPI_Init (Open MPI 3 to 5; Open MPI 5's
//     start-up moved to PRRTE and ignores an OMPI_MCA_schizo).
//
// MPICH and every non-MPI program ignore both. A comma would split the
// text into a list of components, so there is none. With --pmi none no
// rank gets them, and an Open MPI program runs as the singletons the user
// asked for.
var openMPIRefusalVars = []string{"OMPI_MCA_schizo", "OMPI_MCA_pml"}

const openMPIRefusal = "gorun_does_not_serve_Open_MPI:run_it_with_Open_MPI's_mpirun_or_build_it_with_MPICH"

// withoutVars returns env without the variables named.
func withoutVars(env []string, names ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(names, k) {
			out = append(out, kv)
		}
	}
	return out
}

// scrubLaunchEnv drops from a base environment (gorun's own, or a host
// agent's) the variables by which another launcher described its launch:
// gorun run inside an mpiexec or mpirun rank, say. Passed on, they would
// point the ranks at that launcher's PMI or PMIx server and claim a world
// that is not theirs. User settings of those libraries (OMPI_MCA_*,
// PMIX_MCA_*) stay; -x exports are applied after this, so they still win.
func scrubLaunchEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == rankenv.PMIRank, k == rankenv.PMISize, k == rankenv.PMIFD, k == rankenv.PMIPort,
			k == rankenv.PMIID, k == "PMI_SPAWNED", k == "PMI_JOBID",
			strings.HasPrefix(k, "OMPI_COMM_WORLD_"),
			strings.HasPrefix(k, "PMIX_") && !strings.HasPrefix(k, "PMIX_MCA_"):
			continue
		}
		out = append(out, kv)
	}
	return out
}

// started drops the supervisor's copy of rank's socket end: the rank has
// its own, and ours would keep the server from seeing the rank's EOF.
func (sp *supervisorPMI) started(rank int) {
	if f := sp.ends[rank]; f != nil {
		f.Close()
		delete(sp.ends, rank)
	}
}

// settle waits, at most d, until the server has read all that rank sent
// before it exited (its connection's EOF; fd mode only). A client that
// aborts and exits at once (Slurm's libpmi2) can be reaped before its abort
// is read; settled first, the abort is queued before the exit is told.
func (sp *supervisorPMI) settle(rank int, d time.Duration) {
	if sp == nil {
		return
	}
	if ch := sp.served[rank]; ch != nil {
		select {
		case <-ch:
		case <-time.After(d):
		}
	}
}

// requests is the server's request channel; nil (never ready) without
// PMI.
func (sp *supervisorPMI) requests() <-chan pmi.Request {
	if sp == nil {
		return nil
	}
	return sp.srv.Requests()
}

// event turns a server request into the supervisor event gorun acts on.
func (sp *supervisorPMI) event(req pmi.Request) wire.Event {
	switch req.Kind {
	case pmi.Abort:
		return wire.Event{Ev: "pmi-abort", Rank: req.Rank, Code: req.Code, Err: req.Message}
	case pmi.Get:
		return wire.Event{Ev: "pmi-get", Rank: sp.first, Key: req.Key}
	}
	return wire.Event{Ev: "pmi-fence", Rank: sp.first, Epoch: req.Epoch, KVS: req.Puts}
}

// release applies gorun's "pmi-release" command.
func (sp *supervisorPMI) release(c wire.Cmd, log zerolog.Logger) {
	if sp == nil {
		return
	}
	if err := sp.srv.Release(c.Epoch, c.KVS); err != nil {
		log.Warn().Err(err).Msg("PMI release refused")
	}
}

// answer applies gorun's "pmi-value" command: the answer to a "pmi-get",
// with the batch that came with it (pmi.Store.Get) in KVS.
func (sp *supervisorPMI) answer(c wire.Cmd, log zerolog.Logger) {
	if sp == nil {
		return
	}
	if err := sp.srv.AnswerBatch(c.Key, pmi.Answer{Value: c.Value, Found: c.Found, Batched: c.Batched, More: c.KVS}); err != nil {
		log.Warn().Err(err).Msg("PMI value refused")
	}
}

// unfinalized reports whether rank started PMI but never finalized it.
func (sp *supervisorPMI) unfinalized(rank int) bool {
	if sp == nil {
		return false
	}
	in, fin := sp.srv.State(rank)
	return in && !fin
}

// close stops the server and waits for its connection servers; safe on
// nil and twice.
func (sp *supervisorPMI) close() {
	if sp == nil {
		return
	}
	for r, f := range sp.ends {
		f.Close()
		delete(sp.ends, r)
	}
	if sp.waiter != nil {
		sp.waiter.close()
	}
	sp.srv.Close()
	sp.wg.Wait()
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

// MPIError reports a rank that ended the job through MPI's process
// management: it called MPI_Abort, or it exited 0 after MPI_Init without
// MPI_Finalize (its peers would have waited for it forever).
type MPIError struct {
	Rank int
	Host string
	PID  int
	// Aborted is true for MPI_Abort; Code is then the code it passed.
	Aborted bool
	Code    int
	// Message is the abort's message, when the library sent one.
	Message string
	// Stopped is the number of other ranks gorun had to stop.
	Stopped int
}

func (e *MPIError) Error() string {
	cause := "exited before MPI_Finalize (it left the PMI job after MPI_Init without finalizing)"
	if e.Aborted {
		cause = fmt.Sprintf("called MPI_Abort with code %d", e.Code)
		if e.Message != "" {
			cause += " (" + e.Message + ")"
		}
	}
	return fmt.Sprintf("rank %d (host %s, pid %d) %s; stopped %d other %s",
		e.Rank, e.Host, e.PID, cause, e.Stopped, plural.Noun(e.Stopped, "rank", "ranks"))
}

// ExitCode is the abort code as a process exit status (its low byte, as
// the shell sees an exit code), or 1 for a rank that left without
// finalizing.
func (e *MPIError) ExitCode() int {
	if e.Aborted {
		return e.Code & 0xff
	}
	return 1
}

// errPMIProtocol marks a supervisor that broke the fence protocol.
var errPMIProtocol = errors.New("launcher: PMI fence protocol broken")
