// Package launcher owns starting an SPMD job: it plans which rank runs on
// which host (a pure function of hosts, slots and flags), then starts, watches
// and tears down the rank processes, so that the first failure ends the job,
// no process outlives it, and the user learns which rank failed, where, and
// why.
//
// Parsing command-line flags and mapping errors to exit codes belong to
// cmd/gorun; forming process groups between the ranks belongs to rendezvous.
//
// # Words
//
// One word per thing: the *supervisor* is the per-job process that is the
// parent of a host's ranks (package launcher/supervisor); a *host agent*
// (`gorun agent`, package launcher/hostagent) relays between gorun and the
// supervisor of another host; a *starter* is the command that brings a host
// agent up (ssh, srun or a plain exec; starter.go). A *job* is what the user asks for (Job); the
// *job loop* applies the failure rules to it (jobloop.go).
//
// # Pieces, from the top
//
//   - Launch and LaunchReport (launch.go) are every job's entry point:
//     LaunchReport runs the job's worlds (launchWorlds, elastic.go), and
//     each world decides where the ranks live and hands over: every host
//     is this machine → launchLocal and RunLocal; otherwise launchOnHosts
//     (remote.go). SLURM allocations are read here too (SlurmHosts).
//   - Planning (package launcher/plan, pure): plan.New maps a plan.Config
//     — hosts, -np, GPUs, exports, job id, secret, ports — to a Plan with
//     one RankSpec per rank and its full environment (rankenv names). Host
//     lists come from launcher/hostfile; plan.ResolveExports turns -x
//     values into NAME=VALUE.
//   - Edges (local.go, gpus.go, package launcher/ports): which names are
//     this machine, job identity, two free ports held until the ranks
//     start, GPU count from launcher.GPUProbe (the CUDA driver in gorun).
//   - Limits (package launcher/limits): a rank count is refused before
//     anything is allocated for it when it exceeds MaxRanks or a limit of
//     the machine that would run it (descriptors, processes, the cgroup's
//     pids), on the launching machine for a local job and in each host's
//     hello for a multi-host one.
//   - The job loop (jobloop.go) is the one event loop of every job:
//     jobLoop.run is begin, a loop of next, and verdict over a liveJob,
//     the job's state, whose methods are the named steps (onEvent and one
//     method per event kind, onTimeout, inject, onSignal, stop, kill). It sees
//     the ranks through a rankHome — "where ranks live": localHome (this
//     machine's supervisor, runlocal.go), hostsHome (the hosts' supervisors
//     through their host agents, remote.go), or the scripted fakeHome of
//     loop_test.go — and the world it runs in through worldHooks
//     (elastic.go's worldRun: injections, checkpoint cues, the fault
//     report), and applies the failure rules: the first failure
//     stops the others (SIGTERM to each rank's process group, SIGKILL after
//     Config.Grace), signals are forwarded, --timeout ends the job.
//     The verdict follows causality, not arrival order: a rank whose
//     runtime reported, before exiting, that a peer was lost or aborted
//     (internal/collateral, through a pipe every rank inherits at
//     $GORUN_COLLATERAL_FD) is collateral — counted apart in the final
//     line and never named while a rank failed on its own; a SIGKILL
//     gorun did not send is a cause even during the teardown; when every
//     failure is collateral, the line names the rank the reports blame
//     (outcome.CollateralError).
//     A supervisor beats every 200 ms; its client (gorun, a host agent)
//     SIGKILLs one silent past Config.Lease (stopped or hung), and gorun
//     and host agents are child subreapers that kill the job's leftover
//     processes (by GORUN_JOB_ID) when a supervisor died. A host agent's
//     supervisor also leases the agent (pings on its command pipe). Where
//     the host lets gorun write cgroups, the client moves the supervisor
//     into a job cgroup before its spec, and kills and removes that cgroup
//     once the supervisor exited (supervisor/cgroup_linux.go): a descendant
//     that left its session and cleared its environment is found there.
//   - The supervisor's client (supervisor.Client) is shared by RunLocal
//     and the host agent: supervisor.Pipes builds the spec and one pipe
//     per rank stream, supervisor.Start starts the process, and the client
//     sends the spec and commands and reads events. Output is made
//     line-whole to the terminal and per-rank files by package
//     launcher/output (openJobOutput, config.go), whatever brought the
//     bytes; stdin forwarding to rank 0 is in stdin.go.
//   - Host start-up (hoststartup.go), shared by jobs and Doctor: gorun
//     listens on the interface that routes to the hosts (netif), starts
//     one host agent per host through the starters, waits for each to
//     authenticate with the job secret (launcher/wire) and report its
//     interface and ports, and sends the preloaded files (launcher/preload: zstd,
//     SHA-256, skipped when present). A job stops at the first host that fails;
//     doctor.go records every host and then has each probe all the others
//     (the agent's side of it is launcher/hostagent's doctor.go).
//   - Multi-host run (remote.go; the agent is launcher/hostagent): gorun
//     plans and sends each host agent its ranks; the host agent runs them
//     under a supervisor and
//     relays output, events and commands over its one connection; a lease
//     on both ends turns a dropped or silent connection into "ranks killed"
//     on the host and "host lost" in gorun. Above Config.FanoutThreshold
//     hosts, host agents run further starters (a two-level tree). Inside a
//     SLURM allocation one srun starts every host agent (Config.Starter).
//   - Faults and restarts (inject.go, elastic.go): LaunchReport runs a
//     job as a sequence of worlds, a new one (new job id, secret and
//     ports) after a rank or host failure while --max-restarts allows.
//     Parsing --inject specs is package launcher/fault's; scheduling
//     them against the plan is pure (inject.go); the job loop owns the
//     clock and sends "inject" when one is due, and the supervisor that
//     runs the target signals its process group (and sends the SIGCONT
//     that ends a timed stop).
//     The Report records every world and injection.
//   - The supervisor (package launcher/supervisor): the same executable
//     re-run with an internal variable set; a child subreaper that is the
//     parent of every rank and kills every descendant when its client
//     dies, however it died. Its supervisor.go explains why this design
//     was chosen over the alternatives. Programs embedding the launcher
//     call supervisor.Is/supervisor.Main first thing in main.
//
// # Packages
//
// The launcher is being split along these lines into packages of one
// noun each, leaves first, so that the job loop imports the rooms and no
// room imports the loop. So far:
//
//   - launcher/hostfile: Host and the host list's two spellings (a
//     hostfile, an -H value); pure. Host stays here as an alias.
//   - launcher/fault: the --inject specs (Fault, its kinds, Parse,
//     ParseFile); pure. Its names are called by the package's name
//     (fault.Fault, fault.Kill); scheduling faults against a plan
//     stays here (inject.go, inject_chaos.go), since it needs the plan and
//     feeds the job loop and the supervisor.
//   - launcher/output: where a job's output goes (the terminal, line-whole
//     across ranks, and --output-dir's per-rank logs); it reads whatever
//     readers the launcher hands it. Its errors are output.LostError and
//     output.DirError.
//   - launcher/wire: the messages between gorun, its host agents and the
//     supervisors (SupervisorSpec, Cmd, Event over the supervisor's pipes;
//     Msg and its payloads over an agent's connection), the connection's
//     framing (Conn) and its handshake (DialAuth, AcceptAuth); no I/O of
//     its own beyond the connection it is handed. Who sends what when
//     stays here.
//   - launcher/plan: the plan (Plan, RankSpec, New, Config, Node,
//     ResolveExports, MergeEnv) and its limits and errors (MaxRanks,
//     SlotsError, CapacityError); pure. Plan and RankSpec stay here as
//     aliases (plan.go).
//   - launcher/ports: the two ports a job's rank 0 needs (Reserve), held
//     bound until the ranks start (Reservation.Release); the launcher
//     reserves them for a local job and a host agent for its host.
//   - launcher/limits: the limits of a machine that a rank count meets
//     (Machine, Read) and the refusal of a count they cannot serve
//     (Check, pure); gorun checks this machine for a local job, a host
//     agent its own host.
//   - launcher/program: the checks a rank program passes before any rank
//     starts (Resolve, as a shell finds a program; CheckOpenMPI, which
//     refuses a program linked against Open MPI) and their error,
//     program.Error.
//   - launcher/preload: moving files to the hosts before any rank starts,
//     both sides: gorun's (Source, Send) and a host's (Place, Receive).
//   - launcher/privdir: the directories private to this user that hold
//     per-user state on a host (the preload cache, ssh control sockets):
//     Make, UserState and privdir.Error.
//   - launcher/supervisor: the per-job supervisor, the process that is the
//     parent of one host's ranks, and its client (Start, Client, Pipes),
//     with what only it does: containment (the /proc walks, the job
//     cgroup and its reaper), what a rank gets at start (CPU binding,
//     sessions, the shared topology, its GPU, the PMI server for the
//     host's ranks), the faults it acts out (slow, frozen ranks) and a
//     fault-tolerant rank's respawn. It knows one host and one spec; what
//     a failure means stays here.
//   - launcher/flight: one host's flight directory, where its ranks write
//     their flight records: making it (and sweeping those of dead
//     processes), asking the ranks to dump and counting who did
//     (Dir.SignalReady, Dir.DumpedSince, Dir.DumpBeforeStop). gorun uses
//     it for a local job and every host agent for its own ranks; merging
//     the records into one table and gathering them from the hosts stay
//     here (flight.go).
//   - launcher/sshkex: the key exchange gorun's ssh connections prefer
//     (Fast), added by the starters here and by a tree parent's host
//     agent.
//   - launcher/hostagent: the host agent, the process gorun starts on
//     each host of a multi-host job (`gorun agent`; ParseArgs, Main, and
//     SecretEnv, which an srun starter sets): what it checks before any
//     rank starts and reports in its hello, the further agents a tree
//     parent starts, the relay around its host's supervisor with its
//     lease on gorun, its ranks' flight records, and doctor's probes. It
//     imports no part of this package; this package imports it for
//     SecretEnv only. gorun's side of the agent's connection stays here:
//     starting agents (starter.go, hoststartup.go), accepting them
//     (agentauth.go), and what the job loop does with what they send
//     (remote.go).
//   - launcher/outcome: how a job that did not succeed is reported: one
//     typed error per way it ends (RankExitError, CollateralError,
//     HostLostError, SupervisorError, HostError, MPIError, ...), each
//     with the data that locates the cause and the exit code gorun
//     exits with; a leaf. Which failure ended the job is the job loop's
//     call, and the --report cause record built from these errors
//     (CauseReport, cause.go) stays here.
//   - launcher/launchertest: test support (helper rank modes, a scan for
//     a test's surviving processes).
//
// Still in this package: host start-up and the multi-host run (gorun's
// side of the agents), the job loop, and elastic restarts. The edges the
// plan's caller needs (local.go, gpus.go) stay with the launcher, which
// owns I/O.
//
// The next cut is the job loop (jobloop.go), with elastic restarts
// (elastic.go) left above it. The loop already sees the ranks only
// through rankHome and the world it runs in only through worldHooks
// (injections, checkpoint cues, first steps, the fault report; elastic.go's
// worldRun implements it), reads of Config only a loopConfig (timeout,
// grace, exit policy, signals, and those hooks), and returns the errors of
// launcher/outcome. A package launcher/jobloop would take jobLoop,
// liveJob, failure and the verdict; what still ties them here: the types
// the hooks speak in (injection, checkpointCue, failure) would move with
// the loop or to a leaf; the flight table's gorun side (flightRecords)
// would move with it or behind an interface; and fault tolerance's hooks
// (ftRun's started, exited, frozen and hostLost, ft.go and fthost.go)
// reach into the loop's state (liveJob's ranks, home, plan and the count
// of supervisors left), so they need an interface of their own with that
// state behind methods. localHome and hostsHome would stay here and
// implement the loop's Home. Elastic restarts cannot be a leaf: they call
// the launch paths (launchLocal, launchOnHosts) for every world, so
// they are the top of the launcher, which is where LaunchReport already
// is.
//
// # Walking `gorun -np 2 ./prog`
//
// cmd/gorun's main parses the flags and calls launch (cmd/gorun/main.go),
// which builds a Config and a Job and calls LaunchReport (launch.go). Its
// launchWorlds (elastic.go) runs one world; every host is this machine, so
// launchLocal (launch.go) resolves the program, reserves the ports, plans
// (plan.New, launcher/plan) and calls RunLocal (runlocal.go), which makes
// the job's flight directory (flight.go, launcher/flight), starts the
// supervisor (launcher/supervisor: Pipes, Start) and sends it the spec.
// The supervisor, gorun's own executable re-run
// (supervisor.Is/supervisor.Main; supervisor.go: runSupervisor, startAll),
// starts the two ranks, each in its own process group. RunLocal then runs
// the job loop (jobloop.go: jobLoop.run) over a localHome until the
// supervisor reports "done", and its verdict is the error main maps to an
// exit code.
//
// With other hosts (-H a,b), launchWorlds calls launchOnHosts (remote.go)
// instead: host start-up (hoststartup.go, starter.go) runs `gorun agent`
// on each host, whose main hands it to launcher/hostagent (ParseArgs,
// Main: connect, hello, relay); each agent starts the same supervisor
// for its host's ranks, and gorun's job loop runs over a hostsHome that
// reaches them through the agents' connections.
//
// # A multi-host launch's ordering obligations
//
// A host's ranks start once its agent has authenticated, said hello
// (version, interface, ports, program present) and received its preloaded
// files, and rank 0's host's agent has too: rank 0's host supplies
// MASTER_ADDR and the ports, so the plan is made then, and each later
// host joins it as it comes up (a tree parent only once every host is
// up). Any host failing before every host is up ends the launch with an
// error naming it; ranks already started elsewhere are stopped and waited
// for first. The job loop runs only once every host is up; until then
// the started hosts' events queue, and no PMI barrier can complete. A
// host agent sends "done" only after the last byte of its ranks' output,
// so gorun has all output of a host when it counts that host finished.
//
// # RunLocal's ordering obligations
//
// The supervisor starts every rank before it reads any command, so a
// command that addresses "all ranks" reaches each of them even when its
// "started" event is still in flight. Ports are released after the
// supervisor is running and before the spec is sent. RunLocal returns only
// after the supervisor reported that no rank and no descendant is left,
// the supervisor was reaped, and every output stream reached EOF.
//
// Test support lives in launchertest: the helper rank modes a test binary
// runs as, and a /proc scan for a test's surviving processes.
package launcher
