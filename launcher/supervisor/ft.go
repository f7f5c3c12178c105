package supervisor

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/launcher/wire"
	"github.com/gorun-hpc/gorun/rankenv"
)

// The supervisor's part of --fault-tolerant: it keeps what it needs to
// start a rank again (the rank's spec and its output pipes, and the
// collateral pipe's write end) and, on gorun's "respawn", starts the
// rank's next incarnation in place, same rank id and output streams, with
// IncarnationEnv set. gorun decides; the supervisor only obeys: it keeps
// a rank's pipes until gorun says "release" (the rank ended for good:
// exit 0, or the job is being stopped), so an exited rank awaiting
// gorun's decision still holds its streams open and the supervisor does
// not finish.
//
// A respawned rank gets what every rank gets except what belongs to the
// first start alone: no PMI descriptor (a replacement cannot join an MPI
// world that formed; fault-tolerant programs use package ft), no shared
// hardware topology (it discovers its own) and no CPU binding; its stdin
// is /dev/null. Whether it is exec'd or forked from the fork server
// (forkserver.go), it gets the same argv, environment, directory and
// descriptors.

// ftKeeper is the supervisor's fault-tolerant state; nil when the job is
// not fault-tolerant (every method is then a no-op). Owned by the
// supervisor's goroutine.
type ftKeeper struct {
	ranks map[int]*keptRank
	collW *os.File // our own copy of the collateral pipe's write end; nil when none
	// fork is the host's fork server (forkserver.go); nil when the ranks
	// did not ask for one. Stopped with the last kept rank's release.
	fork *forkServer
}

// keptRank is one rank the supervisor can start again.
type keptRank struct {
	spec           wire.SupervisorRank
	stdout, stderr *os.File // our copies; nil: /dev/null
	inc            int
}

// newFTKeeper keeps a copy of the collateral pipe's write end (collW may
// be nil).
func newFTKeeper(collW *os.File) *ftKeeper {
	k := &ftKeeper{ranks: map[int]*keptRank{}}
	if collW != nil {
		if fd, err := syscall.Dup(int(collW.Fd())); err == nil {
			syscall.CloseOnExec(fd)
			k.collW = os.NewFile(uintptr(fd), "collateral")
		}
	}
	return k
}

// keep records rank r's spec and copies of its output pipes (before the
// supervisor closes its own).
func (k *ftKeeper) keep(r wire.SupervisorRank, stdout, stderr *os.File) {
	if k == nil {
		return
	}
	dup := func(f *os.File) *os.File {
		if f == nil || f.Name() == os.DevNull {
			return nil
		}
		fd, err := syscall.Dup(int(f.Fd()))
		if err != nil {
			return nil
		}
		syscall.CloseOnExec(fd)
		return os.NewFile(uintptr(fd), f.Name())
	}
	k.ranks[r.Rank] = &keptRank{spec: r, stdout: dup(stdout), stderr: dup(stderr)}
}

// release closes the kept pipes of ranks (all when empty): they will not
// be started again.
func (k *ftKeeper) release(ranks []int) {
	if k == nil {
		return
	}
	for rk, kr := range k.ranks {
		if len(ranks) > 0 && !slices.Contains(ranks, rk) {
			continue
		}
		for _, f := range []*os.File{kr.stdout, kr.stderr} {
			if f != nil {
				f.Close()
			}
		}
		delete(k.ranks, rk)
	}
	if len(k.ranks) == 0 && k.collW != nil {
		k.collW.Close()
		k.collW = nil
	}
	if len(k.ranks) == 0 && k.fork != nil {
		k.fork.stop()
		k.fork = nil
	}
}

// forkReaped reports whether pid, just reaped, was the fork server's
// process; it died during the job (the job's end stops it through
// release first), so it is started again for the next replacement.
func (k *ftKeeper) forkReaped(pid int) bool {
	if k == nil || k.fork == nil || k.fork.pid != pid {
		return false
	}
	k.fork.died()
	return true
}

// pollFork reads the fork server's ready message if it came.
func (k *ftKeeper) pollFork() {
	if k != nil {
		k.fork.poll()
	}
}

// idle reports whether no rank awaits gorun's decision.
func (k *ftKeeper) idle() bool { return k == nil || len(k.ranks) == 0 }

// respawn starts the next incarnation (c.Incarnation) of each of
// c.Ranks that this supervisor keeps and that is not running.
func (a *supervisor) respawn(c wire.Cmd) {
	for _, rk := range c.Ranks {
		kr := a.ft.ranksOf(rk)
		i := slices.IndexFunc(a.ranks, func(s supervisorRankState) bool { return s.rank == rk })
		if kr == nil || i < 0 {
			continue // another supervisor's rank
		}
		if a.ranks[i].running || a.killing || a.tearing {
			a.emit(wire.Event{Ev: "failed", Rank: rk, Err: fmt.Sprintf("rank %d cannot be started again here (not kept, still running, or the job is ending)", rk)})
			continue
		}
		kr.inc = c.Incarnation
		register := func(pid int) {
			a.ranks[i] = supervisorRankState{rank: rk, pid: pid, running: true, freezeAfter: freezeAfter(kr.spec.Env)}
			a.byPID[pid] = i
			a.running++
			// A report of the dead incarnation must not mark the new one's
			// exit collateral.
			delete(a.coll, rk)
			a.emit(wire.Event{Ev: "started", Rank: rk, PID: pid})
		}
		if err := a.startKept(kr, register); err != nil {
			a.emit(wire.Event{Ev: "failed", Rank: rk, Err: err.Error()})
		}
	}
}

func (k *ftKeeper) ranksOf(rk int) *keptRank {
	if k == nil {
		return nil
	}
	return k.ranks[rk]
}

// startKept starts a kept rank's next incarnation in its own session, as
// startAll starts the first: forked from the fork server when there is
// one that can (forkserver.go), else as a new process. register records
// the new pid before the replacement runs.
func (a *supervisor) startKept(kr *keptRank, register func(pid int)) error {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	or := func(f *os.File) *os.File {
		if f == nil {
			return devnull
		}
		return f
	}
	env := slices.DeleteFunc(slices.Clone(kr.spec.Env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == ft.IncarnationEnv || name == rankenv.CollateralFD || strings.HasPrefix(name, "PMI_")
	})
	if kr.spec.GPU != nil {
		env = visibleDevice(env, *kr.spec.GPU, os.Getenv(rankenv.CUDAVisibleDevices))
	}
	env = append(env, ft.IncarnationEnv+"="+strconv.Itoa(kr.inc))
	files := []*os.File{devnull, or(kr.stdout), or(kr.stderr)}
	if a.ft.collW != nil {
		env = append(env, rankenv.CollateralFD+"="+strconv.Itoa(len(files)))
		files = append(files, a.ft.collW)
	}
	if a.startForked(kr, env, files, register) {
		return nil
	}
	p, err := os.StartProcess(kr.spec.Path, kr.spec.Argv, &os.ProcAttr{
		Dir: kr.spec.Dir, Env: env, Files: files,
		Sys: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		return err
	}
	register(p.Pid)
	p.Release()
	return nil
}
