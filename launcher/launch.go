package launcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/hostlist"
	"github.com/gorun-hpc/gorun/launcher/fault"
	"github.com/gorun-hpc/gorun/launcher/limits"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/ports"
	"github.com/gorun-hpc/gorun/launcher/program"
)

// Launch is the one entry point above both ways a job runs. It decides
// where the ranks live and hands over:
//
//   - every host is this machine: resolve the program, reserve the ports,
//     plan, and run the plan under one local supervisor (RunLocal);
//   - a host is another machine, or Config.Starter is StartSrun: start one
//     host agent per host and run the plan through them (launchOnHosts in
//     remote.go), after host start-up (hoststartup.go) succeeded everywhere.
//
// Both end in the same job loop (jobloop.go), which sees the ranks only
// through a rankHome.

// Job is what a user asks gorun for: a program and where to run it.
type Job struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH
	// unless it contains a slash.
	Argv []string
	// NP, Hosts, Oversubscribe, GPUsPerHost and Export are as in
	// plan.Config, except that NP 0 without Hosts means one rank per CPU.
	NP            int
	Hosts         []Host
	Oversubscribe bool
	GPUsPerHost   int
	Export        []string
	// Faults are injected into the job (inject.go); MaxRestarts is how
	// many times a failed world is started again (elastic.go).
	Faults      []fault.Fault
	MaxRestarts int
	// CheckpointSignal is the signal that asks the ranks for a checkpoint
	// (0: SIGUSR1), exported to them as GORUN_CHECKPOINT_SIGNAL.
	// CheckpointBefore, when positive, makes gorun send it that long
	// before the job's --timeout, before every timed kill or kill-host
	// it injects (a preemption notice; elastic.go), and before it stops a
	// world to grow back (ReadmitEvery). The ranks must handle the signal:
	// SIGUSR1's default action ends a process.
	CheckpointSignal syscall.Signal
	CheckpointBefore time.Duration
	// MinNP and MaxNP make the job elastic (either positive; elastic.go):
	// each world runs min(MaxNP, the slots of the hosts not lost) ranks
	// (MaxNP 0: NP, or every slot), hosts past those needed are spares,
	// a host lost in one world is left out of the next, and the job fails
	// once fewer than MinNP ranks can be placed. At each later restart
	// gorun asks the lost hosts whether they answer again and takes back
	// those that do.
	MinNP, MaxNP int
	// ReadmitEvery, when positive, makes a world that runs without some
	// lost host ask those hosts that often whether they answer again;
	// when one does, the world is stopped and the next one grows back
	// with it (torchrun's restart on a membership change). Such a
	// restart does not count against MaxRestarts.
	ReadmitEvery time.Duration
	// Hostfile is the file Hosts were read from, if any. In an elastic
	// job gorun reads it again before every restart, so that hosts added
	// to it (spares, or more slots) serve the next world and hosts
	// removed from it are no longer used nor asked to come back; a world
	// already running is not touched. A file that cannot be read or
	// parsed then keeps the list it had (the report says why).
	Hostfile string
	// FaultTolerant keeps the job running through rank failures: a
	// failed rank is replaced in place and heals from the others, who
	// keep stepping (ft.go, package ft). MaxFailures is how many
	// failures it absorbs; the next one ends the job. Not with
	// MaxRestarts or MinNP/MaxNP.
	FaultTolerant bool
	MaxFailures   int
	// FTGroupSize makes replica groups of that many consecutive ranks
	// (HSDP: a shard group is one replica): a rank's failure replaces
	// its whole group. 0 or 1: every rank is a replica.
	FTGroupSize int
}

// Launch runs a job (see LaunchReport) and drops the report.
func Launch(ctx context.Context, cfg Config, job Job) error {
	_, err := LaunchReport(ctx, cfg, job)
	return err
}

// LaunchReport plans and runs a job, restarting it after a rank or host
// failure up to job.MaxRestarts times, and injecting job.Faults. When every
// host is this machine it checks that the program can run, reserves ports,
// plans, and runs the plan under one local supervisor. When a host is
// another machine (or Config.Starter is StartSrun) it starts one host agent
// per host and runs the job through them. The error is nil when every rank
// of the last world exited 0; otherwise it is the last world's: one of
// *outcome.RankExitError, *outcome.StartError, *outcome.TimeoutError, *outcome.InterruptedError,
// *program.Error, *plan.SlotsError, *plan.CapacityError, *outcome.SupervisorError,
// *outcome.HostError, *outcome.VersionError, *outcome.HostLostError, *outcome.MPIError, *outcome.FrozenError,
// *output.LostError (every rank succeeded but a log file lost output),
// *fault.SpecError, or a configuration or context error. The report is
// never nil.
func LaunchReport(ctx context.Context, cfg Config, job Job) (*Report, error) {
	rep := &Report{
		MaxRestarts: job.MaxRestarts, faults: job.Faults, horizon: randomHorizon,
		ckptSig: cmp.Or(job.CheckpointSignal, syscall.SIGUSR1), ckptBefore: job.CheckpointBefore,
		fired: map[int]bool{}, byID: map[int]int{}, Faults: []FaultReport{}, Worlds: []WorldReport{},
		lostIn: map[string]int{},
	}
	err := launchWorlds(ctx, cfg, job, rep)
	kept := rep.Faults[:0]
	for i, f := range rep.Faults {
		if f.Restart == nil {
			if i < len(rep.inj) && rep.faults[rep.inj[i].fault].Kind == fault.Random {
				// One of a random fault's week of planned kills: only
				// those that were due belong in the report.
				rep.RandomNotDue++
				continue
			}
			f.Missed = "the job ended before it was due"
		}
		kept = append(kept, f)
	}
	rep.Faults = kept
	clear(rep.byID) // indexes into the list before it was cut
	rep.Outcome = "succeeded"
	if err != nil {
		rep.Outcome = err.Error()
		rep.ExitCode = exitCodeOf(err)
		if n := len(rep.Worlds); n > 0 {
			rep.Cause = rep.Worlds[n-1].Cause
		}
	}
	return rep, err
}

// needsHostAgents reports whether the job's ranks live behind host agents:
// some host is not this machine, or SLURM must start (and track) them.
func needsHostAgents(cfg Config, hosts []Host, id LocalIdentity) bool {
	if cfg.Starter == StartSrun {
		return true
	}
	return RequireLocal(hosts, id) != nil
}

// launchLocal runs a job whose every host is this machine.
func launchLocal(ctx context.Context, cfg Config, job Job) (err error) {
	if len(job.Hosts) == 0 && job.NP == 0 {
		// No host list and no -np: one rank per CPU, as mpirun does on a
		// single machine.
		job.NP = runtime.NumCPU()
	}
	// Before anything is allocated per rank: an absurd count must not
	// grow the plan until the machine runs out of memory.
	if err := limits.Check(localRanks(job), limits.Read()); err != nil {
		var ce *plan.CapacityError
		if errors.As(err, &ce) && ce.Resource == "ranks" && job.NP == 0 {
			ce.FromSlots = true
		}
		return err
	}
	path, err := program.Resolve(job.Argv[0], cfg.Dir)
	if err != nil {
		return err
	}
	if cfg.PMI != PMINone {
		// Open MPI would form one singleton per rank (launcher/program).
		if err := program.CheckOpenMPI(job.Argv[0], path); err != nil {
			return err
		}
	}
	jobID, secret, err := NewJobIdentity()
	if err != nil {
		return err
	}
	var fr *ftRun
	if job.FaultTolerant {
		if fr, err = startFT(job, jobID, secret, "127.0.0.1:0", cfg); err != nil {
			return err
		}
		job.Export = append(slices.Clone(job.Export), fr.env()...)
		cfg.ft = fr
		defer func() {
			var rep *Report
			if cfg.world != nil {
				rep = cfg.world.rep
			}
			err = fr.finish(rep, err)
		}()
	}
	reserved, err := ports.Reserve()
	if err != nil {
		return err
	}
	defer reserved.Release()
	pl, err := plan.New(plan.Config{
		NP: job.NP, Hosts: job.Hosts, Oversubscribe: job.Oversubscribe,
		GPUsPerHost: job.GPUsPerHost, Export: job.Export,
		JobID: jobID, Secret: secret,
		// Every host is this machine, so loopback reaches rank 0 whatever
		// name the user wrote.
		MasterAddr: "127.0.0.1",
		MasterPort: reserved.MasterPort, RdzvPort: reserved.RdzvPort,
		NoPMI: cfg.PMI == PMINone,
	})
	if err != nil {
		return err
	}
	if err := cfg.world.prepare(pl); err != nil {
		return err
	}
	cfg.Logger.Info().Str("job", pl.JobID).Int("world", pl.WorldSize).Int("nodes", len(pl.Nodes)).
		Str("master", pl.MasterEndpoint()).Str("rdzv", pl.RdzvEndpoint).
		Str("program", path).Msg("launching")
	return RunLocal(ctx, cfg, pl, Program{Path: path, Argv: job.Argv}, reserved)
}

// localRanks is how many ranks a local job asks for: -np, else the slots of
// its hosts (which are all this machine).
func localRanks(job Job) int {
	if job.NP > 0 {
		return job.NP
	}
	n := 0
	for _, h := range job.Hosts {
		n += max(h.Slots, 0)
		if n > plan.MaxRanks {
			break // enough to refuse; no overflow from absurd slot counts
		}
	}
	return n
}

// Program is the resolved program every rank runs.
type Program struct {
	// Path is the executable's path (see program.Resolve).
	Path string
	// Argv is the argument list, Argv[0] as the user wrote it.
	Argv []string
}

// SlurmHosts reads the hosts of the SLURM allocation gorun runs in:
// SLURM_JOB_NODELIST (a hostlist expression) zipped with
// SLURM_TASKS_PER_NODE ("2(x3),1"), with SLURM_NODELIST and
// SLURM_JOB_CPUS_PER_NODE as the older spellings. getenv is os.Getenv in
// gorun and a map in tests. Call it only when SLURM_JOB_ID is set; an
// allocation whose variables are missing or disagree is an error naming
// them.
func SlurmHosts(getenv func(string) string) ([]Host, error) {
	nodes := getenv("SLURM_JOB_NODELIST")
	if nodes == "" {
		nodes = getenv("SLURM_NODELIST")
	}
	tasks := getenv("SLURM_TASKS_PER_NODE")
	if tasks == "" {
		tasks = getenv("SLURM_JOB_CPUS_PER_NODE")
	}
	if nodes == "" || tasks == "" {
		return nil, fmt.Errorf("launcher: inside SLURM job %s but SLURM_JOB_NODELIST or SLURM_TASKS_PER_NODE is not set (run gorun inside salloc/sbatch, or give -H/-hostfile)",
			getenv("SLURM_JOB_ID"))
	}
	nt, err := hostlist.ZipTasks(nodes, tasks)
	if err != nil {
		return nil, fmt.Errorf("launcher: SLURM allocation: %w", err)
	}
	hosts := make([]Host, 0, len(nt))
	for _, n := range nt {
		hosts = append(hosts, Host{Name: n.Name, Slots: n.Tasks})
	}
	return hosts, nil
}
