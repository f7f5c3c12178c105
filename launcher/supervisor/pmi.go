package supervisor

import (
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

	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/pmi"
	"github.com/gorun-hpc/gorun/rankenv"
)

// The supervisor's part of serving MPI's PMI (package launcher's pmi.go
// tells the whole story): it is the PMI server of the ranks it starts,
// turns their barriers, gets and aborts into events for gorun, and applies
// gorun's answers.

// pmiRankFD is the descriptor number a rank finds its PMI socket at.
const pmiRankFD = 3

// PMI is a supervisor's PMI server and the per-rank descriptors
// it hands out. Only the supervisor's main goroutine calls its methods;
// the connection servers are goroutines it owns (wg).
type PMI struct {
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
func (sp *PMI) serveEach(fds, ranks []int, log zerolog.Logger) error {
	for i, fd := range fds {
		r := ranks[i]
		f := os.NewFile(uintptr(fd), "pmi-server")
		c, err := net.FileConn(f) // a duplicate; ours is closed next
		f.Close()
		if err != nil {
			closeFDs(fds[i+1:])
			return fmt.Errorf("supervisor: PMI socket: %w", err)
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

// NewPMI starts serving PMI for ranks. In the fd mode every
// rank's socketpair exists before any rank starts, so a rank can never
// find its descriptor unserved.
func NewPMI(job wire.PMIJob, ranks []wire.SupervisorRank, log zerolog.Logger) (*PMI, error) {
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
	sp := &PMI{srv: srv, job: job, first: nums[0], ends: map[int]*os.File{}, served: map[int]chan struct{}{}}
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
			sp.Close()
			return nil, fmt.Errorf("supervisor: PMI socketpair: %w", err)
		}
		mine = append(mine, fds[0])
		sp.ends[r] = os.NewFile(uintptr(fds[1]), "pmi-rank-"+strconv.Itoa(r))
		sp.served[r] = make(chan struct{})
	}
	if sp.waiter, err = newPMIWaiter(srv, mine, nums, sp.served, &sp.wg, log); err != nil {
		// No epoll set: a connection server per rank from the start.
		log.Debug().Err(err).Msg("PMI sockets served by a goroutine each")
		if err := sp.serveEach(mine, nums, log); err != nil {
			sp.Close()
			return nil, err
		}
	}
	return sp, nil
}

// RankSetup returns the extra descriptor for rank (nil in the port mode)
// and its environment with the PMI variables of the mode set and the other
// mode's removed. Inherited PMI_FD, PMI_PORT and PMI_ID (gorun itself run
// under another process manager) never pass through: they would point a
// rank at the wrong server, and an empty value is not the same as unset
// (MPICH reads an empty PMI_FD as descriptor 0).
//
// Every rank served PMI also gets openMPIRefusal, in place of any value the
// user set, so that an Open MPI rank fails in MPI_Init however Open MPI was
// loaded (see openMPIRefusal).
func (sp *PMI) RankSetup(rank int, env []string) (*os.File, []string) {
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
// (launcher/program) cannot see Open MPI loaded at run time (python3 with an
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

// Started drops the supervisor's copy of rank's socket end: the rank has
// its own, and ours would keep the server from seeing the rank's EOF.
func (sp *PMI) Started(rank int) {
	if f := sp.ends[rank]; f != nil {
		f.Close()
		delete(sp.ends, rank)
	}
}

// settle waits, at most d, until the server has read all that rank sent
// before it exited (its connection's EOF; fd mode only). A client that
// aborts and exits at once (Slurm's libpmi2) can be reaped before its abort
// is read; settled first, the abort is queued before the exit is told.
func (sp *PMI) settle(rank int, d time.Duration) {
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

// Requests is the server's request channel; nil (never ready) without
// PMI.
func (sp *PMI) Requests() <-chan pmi.Request {
	if sp == nil {
		return nil
	}
	return sp.srv.Requests()
}

// Event turns a server request into the supervisor Event gorun acts on.
func (sp *PMI) Event(req pmi.Request) wire.Event {
	switch req.Kind {
	case pmi.Abort:
		return wire.Event{Ev: "pmi-abort", Rank: req.Rank, Code: req.Code, Err: req.Message}
	case pmi.Get:
		return wire.Event{Ev: "pmi-get", Rank: sp.first, Key: req.Key}
	}
	return wire.Event{Ev: "pmi-fence", Rank: sp.first, Epoch: req.Epoch, KVS: req.Puts}
}

// Release applies gorun's "pmi-Release" command.
func (sp *PMI) Release(c wire.Cmd, log zerolog.Logger) {
	if sp == nil {
		return
	}
	if err := sp.srv.Release(c.Epoch, c.KVS); err != nil {
		log.Warn().Err(err).Msg("PMI release refused")
	}
}

// Answer applies gorun's "pmi-value" command: the Answer to a "pmi-get",
// with the batch that came with it (pmi.Store.Get) in KVS.
func (sp *PMI) Answer(c wire.Cmd, log zerolog.Logger) {
	if sp == nil {
		return
	}
	if err := sp.srv.AnswerBatch(c.Key, pmi.Answer{Value: c.Value, Found: c.Found, Batched: c.Batched, More: c.KVS}); err != nil {
		log.Warn().Err(err).Msg("PMI value refused")
	}
}

// unfinalized reports whether rank started PMI but never finalized it.
func (sp *PMI) unfinalized(rank int) bool {
	if sp == nil {
		return false
	}
	in, fin := sp.srv.State(rank)
	return in && !fin
}

// Close stops the server and waits for its connection servers; safe on
// nil and twice.
func (sp *PMI) Close() {
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
