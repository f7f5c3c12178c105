package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/internal/cliflag"
	"github.com/gorun-hpc/gorun/internal/consolelog"
	"github.com/gorun-hpc/gorun/launcher"
	"github.com/gorun-hpc/gorun/launcher/fault"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
)

// version is set at build time with -ldflags "-X main.version=..."; it is
// what hosts of one job must agree on.
var version = "dev"

// commit is the commit the binary was built from, set by make build with
// -ldflags "-X main.commit=..."; empty means the one Go stamped into the
// build (vcs.revision, absent with -buildvcs=false or outside a checkout).
var commit = ""

// versionText is what --version prints: the version and the commit, so
// that two builds can be told apart.
func versionText() string {
	var settings []debug.BuildSetting
	if info, ok := debug.ReadBuildInfo(); ok {
		settings = info.Settings
	}
	return describeVersion(version, commit, settings)
}

// describeVersion renders "dev (commit 573a5c1d2e4f)", with ", modified"
// when Go recorded uncommitted changes; a commit given at link time wins
// over the stamped one (make build marks changes with a -modified suffix).
func describeVersion(version, commit string, settings []debug.BuildSetting) string {
	modified := false
	for _, s := range settings {
		switch {
		case s.Key == "vcs.revision" && commit == "":
			commit = s.Value[:min(12, len(s.Value))]
			for _, m := range settings {
				modified = modified || m.Key == "vcs.modified" && m.Value == "true"
			}
		}
	}
	if commit == "" {
		return version + " (commit unknown: built without make build or VCS stamping)"
	}
	if modified {
		return version + " (commit " + commit + ", modified)"
	}
	return version + " (commit " + commit + ")"
}

// Exit codes of gorun itself; a job's own code passes through otherwise.
const (
	exitFailure = 1 // gorun could not run the job (bad hostfile, too many ranks...)
	exitUsage   = 2 // bad command line, as flag.ExitOnError would use
)

func main() {
	// The job agent is this same binary re-executed; it must take over
	// before anything else looks at the command line.
	if supervisor.Is() {
		os.Exit(supervisor.Main())
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// subcommands are dispatched on the first argument, before flag parsing.
// Files that add one register it in an init function.
var subcommands = map[string]func(args []string, stdout, stderr io.Writer) int{
	"bench":  benchMain,
	"agent":  hostAgentMain,
	"doctor": doctorMain,
	"trace":  traceMain,
}

// subcommandSummaries is the one line `gorun --help` prints for each
// subcommand meant for users (the host agent is not one).
var subcommandSummaries = map[string]string{
	"bench":  "collective microbenchmark in the nccl-tests layout (run it under gorun -np N)",
	"doctor": "pre-flight checks of every host: agent, version, interface, ports, all pairs, GPUs",
	"trace":  "merge the ranks' --trace files into one Chrome/Perfetto trace",
	"plan":   "run the step-graph passes offline and print buckets, exposure and memory",
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if sub, ok := subcommands[args[0]]; ok {
			return sub(args[1:], stdout, stderr)
		}
	}
	return launch(args, stdin, stdout, stderr)
}

// writeSubcommands lists the subcommands that exist in this build, with
// their summaries, for the usage text.
func writeSubcommands(w io.Writer) {
	var names []string
	for name := range subcommands {
		if subcommandSummaries[name] != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	fmt.Fprintln(w, "Subcommands (gorun SUBCOMMAND --help for their flags):")
	for _, name := range names {
		fmt.Fprintf(w, "  %-8s %s\n", name, subcommandSummaries[name])
	}
	fmt.Fprintln(w)
}

// parseFlags parses args with fs and reports a bad command line in one
// line, not with the whole usage: the flag's name, the closest flag when
// it was mistyped, and where to read more. -h and --help print the usage
// (to stderr) and return done with code 0.
func parseFlags(fs *flag.FlagSet, args []string, prog string, stderr io.Writer) (code int, done bool) {
	fs.SetOutput(stderr)
	switch err := cliflag.Parse(fs, args); {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		return 0, true
	default:
		fmt.Fprintf(stderr, "%s: %s; see %s --help\n", prog, err, prog)
		return exitUsage, true
	}
}

// repeated is a flag.Value collecting every occurrence (-x A -x B=1).
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(s string) error { *r = append(*r, s); return nil }

type options struct {
	np            int
	hostList      string
	hostfile      string
	oversubscribe bool
	exports       repeated
	bindTo        string
	session       string
	topology      string
	tagOutput     bool
	timestamp     bool
	outputDir     string
	timeout       time.Duration
	grace         time.Duration
	gpus          int
	exitPolicy    string
	pmi           string
	version       bool
	logFormat     string
	verbose       bool
	veryVerbose   bool
	launchAgent   string
	agentPath     string
	iface         string
	lease         time.Duration
	launchTimeout time.Duration
	launcher      string
	fanout        int
	preloadBinary bool
	preloadFiles  string
	sshMultiplex  time.Duration
	sshKex        string
	injects       repeated
	injectFile    string
	maxRestarts   int
	faultTolerant bool
	maxFailures   int
	ftGroup       int
	ckptSignal    string
	minNP, maxNP  int
	readmitEvery  time.Duration
	rdzvTimeout   time.Duration
	ckptBefore    time.Duration
	report        string
}

func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gorun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.np, "np", 0, "number of ranks (default: one per slot; one per CPU without -H/-hostfile)")
	fs.IntVar(&o.np, "n", 0, "same as -np")
	fs.StringVar(&o.hostList, "H", "", "hosts as `host[:slots],...`; SLURM hostlists like node[01-04] work")
	fs.StringVar(&o.hostList, "host", "", "same as -H")
	fs.StringVar(&o.hostfile, "hostfile", "", "Open MPI style hostfile (`FILE`: host slots=N max_slots=M)")
	fs.StringVar(&o.hostfile, "machinefile", "", "same as -hostfile")
	fs.BoolVar(&o.oversubscribe, "oversubscribe", false, "allow more ranks than slots (up to max_slots)")
	fs.Var(&o.exports, "x", "export `NAME[=VALUE]` to every rank (repeatable)")
	fs.StringVar(&o.topology, "topology", "auto", "hardware topology for ranks that use hwloc (MPICH's MPI_Init): auto (each host discovers it once and hands it to its ranks, which then skip their own discovery) or off")
	fs.StringVar(&o.bindTo, "bind-to", "auto", "CPU binding of ranks: auto (when a host runs no more ranks than CPUs, each rank gets its own equal share of them, as mpirun binds 2 ranks to cores; with more, ranks share one session and get GOMAXPROCS=1) or none")
	fs.StringVar(&o.session, "session", "auto", "sessions of oversubscribed ranks (more ranks than CPUs, --bind-to auto): auto (ranks of Go programs on gorun's runtime share one session, where a waiting rank can yield its core to a peer; other programs' ranks lead their own), shared (every program's: e.g. Python ranks on the torch backend gorun) or own")
	fs.BoolVar(&o.tagOutput, "tag-output", false, "prefix every output line with [rank] ([rank,host] in multi-host jobs)")
	fs.BoolVar(&o.timestamp, "timestamp-output", false, "prefix every output line with a timestamp")
	fs.StringVar(&o.outputDir, "output-dir", "", "write rank.N.log per rank into `DIR` (terminal output is tagged)")
	fs.DurationVar(&o.timeout, "timeout", 0, "end the job after `DUR` with exit code 124 (0: never)")
	fs.DurationVar(&o.grace, "grace", launcher.DefaultGrace, "delay between SIGTERM and SIGKILL when stopping ranks")
	fs.IntVar(&o.gpus, "gpus-per-host", -1, "GPUs per host, one per local rank round robin (default: the devices the CUDA driver shows, else 0)")
	fs.StringVar(&o.exitPolicy, "exit-policy", "first", "which failure sets the exit code: first, lowest or max")
	fs.StringVar(&o.pmi, "pmi", "fd", "how MPICH-family MPI programs reach gorun's PMI-1/PMI-2 server: fd (PMI_FD, as Hydra), port (PMI_PORT and PMI_ID) or none (no PMI_* variables; MPI programs then run as singletons)")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.StringVar(&o.logFormat, "log-format", "console", "gorun's own log on stderr: console or json")
	fs.BoolVar(&o.verbose, "v", false, "log more (info)")
	fs.BoolVar(&o.veryVerbose, "vv", false, "log everything (debug)")
	fs.StringVar(&o.launchAgent, "launch-agent", "ssh", "`COMMAND` that runs a command on another host; {host} is replaced by the host name, else it is appended (e.g. 'ssh -p 2222', 'ip netns exec {host}')")
	fs.StringVar(&o.agentPath, "agent-path", "", "`PATH` of gorun on the other hosts (default: this gorun's own path)")
	fs.StringVar(&o.iface, "iface", "", "network interface for gorun and the ranks on every host, by `NAME or CIDR` (default: the route between the hosts)")
	fs.DurationVar(&o.lease, "lease", launcher.DefaultLease, "a host silent this long counts as lost; its agent kills its ranks after the same silence")
	fs.DurationVar(&o.launchTimeout, "launch-timeout", launcher.DefaultLaunchTimeout, "how long every host's agent has to connect")
	fs.IntVar(&o.fanout, "fanout-threshold", launcher.DefaultFanoutThreshold, "above this many hosts, agents start further agents (a tree of ≈√N ssh per level); -1 never")
	fs.BoolVar(&o.preloadBinary, "preload-binary", false, "copy PROGRAM to every host (zstd, hash-checked, skipped when the host has it) before starting")
	fs.BoolVar(&o.preloadBinary, "s", false, "same as --preload-binary")
	fs.StringVar(&o.preloadFiles, "preload-files", "", "copy `FILES` (comma-separated) to the ranks' working directory on every host before starting")
	fs.DurationVar(&o.sshMultiplex, "ssh-multiplex", 0, "keep ssh master connections to the hosts for `DUR` after the job so the next job skips the handshakes (0: off)")
	fs.StringVar(&o.sshKex, "ssh-kex", "fast", "ssh key exchange for starting agents: fast (curve25519-sha256 first; ~0.25 s less CPU per host than OpenSSH 9's post-quantum default, which protects nothing that outlives the job here) or default (ssh's own choice)")
	fs.Var(&o.injects, "inject", "inject a fault: `SPEC` kill:rank=R:at=DUR[:sig=SIG], stop:rank=R:at=DUR[:for=DUR], cont:rank=R:at=DUR, kill-host:host=H:at=DUR[:sig=SIG] or random:mtbf=DUR:seed=N[:sig=SIG], slow:rank=R:at=DUR[:for=DUR][:duty=F][:period=DUR], drop:rank=R[:peer=P]:at=DUR, delay:rank=R[:peer=P]:ms=N:at=DUR[:for=DUR], corrupt:rank=R[:peer=P]:at=DUR or partition:ranks=A-B:at=DUR[:for=DUR][:lease=DUR]; after-steps=N instead of at= fires when the target rank reports finishing step N (repeatable; times from the job's start)")
	fs.StringVar(&o.injectFile, "inject-file", "", "read --inject specs from `FILE`, one per line (# comments)")
	fs.IntVar(&o.maxRestarts, "max-restarts", 0, "after a rank or host fails, stop every rank and start the job again, up to `N` times (torchrun's --max-restarts; ranks get GORUN_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT)")
	fs.BoolVar(&o.faultTolerant, "fault-tolerant", false, "keep the job running through rank failures: a failed rank is started again in place and heals its state from the live ranks, which keep stepping (programs use package ft: a per-step quorum, should-commit, heal; GORUN_FT_ADDR and GORUN_FT_INCARNATION); not with --max-restarts")
	fs.IntVar(&o.ftGroup, "fault-tolerant-group", 1, "with --fault-tolerant: replica groups of `N` consecutive ranks (HSDP's shard groups): a rank's failure replaces its whole group, which heals from the other groups (GORUN_FT_GROUP_SIZE)")
	fs.IntVar(&o.maxFailures, "max-failures", 3, "with --fault-tolerant: how many rank failures the job absorbs; the next one stops it (`N`)")
	fs.IntVar(&o.minNP, "min-np", 0, "elastic: with --max-restarts, a world that lost a host restarts without it, on spare hosts of the host list or on fewer ranks, down to `N`; a -hostfile is read again before each restart, so hosts added to it or removed from it count from the next world")
	fs.DurationVar(&o.readmitEvery, "readmit-every", 0, "elastic: while a world runs without a lost host, ask it every `DUR` whether it answers again, and when it does, restart the world to grow back with it (not counted against --max-restarts; 0: only at restarts)")
	fs.DurationVar(&o.rdzvTimeout, "rdzv-timeout", 0, "how long the ranks wait for every rank to join the world (`DUR`; GORUN_RDZV_TIMEOUT, default 2m): a rank that hangs before it calls Init is named when this runs out, as nothing tells it from one slow to start")
	fs.IntVar(&o.maxNP, "max-np", 0, "elastic: at most `N` ranks per world (default -np, else every slot); hosts past those needed are spares")
	fs.StringVar(&o.ckptSignal, "checkpoint-signal", "USR1", "the `SIGNAL` that asks the ranks for a checkpoint (ranks find it in GORUN_CHECKPOINT_SIGNAL); gorun forwards it when it receives it")
	fs.DurationVar(&o.ckptBefore, "checkpoint-signal-before", 0, "send the checkpoint signal `DUR` before --timeout, before every timed kill or kill-host --inject (a preemption notice, as SLURM's --signal) and before a world is stopped to grow back (--readmit-every); 0: never on its own")
	fs.StringVar(&o.report, "report", "", "write what was injected, when, and what the job did as JSON to `FILE`")
	fs.StringVar(&o.launcher, "launcher", "auto", "how agents start on other hosts: auto (srun inside a SLURM allocation, else ssh), ssh or srun")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: gorun [flags] [--] PROGRAM [ARGS...]

Starts PROGRAM as an SPMD job of N ranks. Every rank gets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, PMI_* and GORUN_* in its environment;
MPICH-family MPI programs (MPICH, Intel MPI, MVAPICH) form one world through
gorun's PMI server. Open MPI programs are refused (they need a PMIx
server). The first rank to fail ends the job; gorun exits with its code
(128+signal for a signal death).

Examples:
  gorun -np 4 ./app                       4 ranks on this machine
  gorun -np 2 ./train -lr 0.1             flags after PROGRAM belong to it
  gorun -H localhost:8 -x OMP_NUM_THREADS=1 --tag-output ./app
  gorun -hostfile hosts --output-dir logs --timeout 1h ./trainer
  gorun -np 16 --oversubscribe /bin/true  more ranks than cores
  gorun -hostfile hosts --tag-output ./app  across hosts, agents over ssh
  gorun -H n[1-4]:8 --iface 10.0.0.0/8 ./trainer
  salloc -N 4 gorun ./trainer             inside SLURM: hosts from the allocation, agents via srun
  gorun doctor -hostfile hosts            pre-flight checks of every host

`)
		writeSubcommands(stderr)
		fmt.Fprint(stderr, "Flags (one or two dashes):\n")
		fs.PrintDefaults()
	}
	return fs
}

// launch is `gorun [flags] PROGRAM [ARGS...]`: it checks the flags
// (checkLaunch), builds the launcher's Config (launchConfig) and Job, runs
// the job, and maps its end to an exit code, the summaries and --report.
func launch(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var o options
	fs := newFlagSet(&o, stderr)
	if code, done := parseFlags(fs, args, "gorun", stderr); done {
		return code
	}
	if o.version {
		fmt.Fprintf(stdout, "gorun %s\n", versionText())
		return 0
	}
	c, code := checkLaunch(fs, &o, stderr)
	if code != 0 {
		return code
	}
	ctx := context.Background()
	if o.gpus < 0 {
		o.gpus = launcher.DetectGPUs(ctx)
	}

	sigs := make(chan os.Signal, 4)
	// The checkpoint signal too, when it is another: gorun forwards what
	// it catches (on demand: kill -USR1 <gorun>).
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, c.ckptSig)
	defer signal.Stop(sigs)
	// A closed stdout (`gorun ... | head`) must not kill gorun with
	// SIGPIPE, which Go's runtime does for a write to fd 1 or 2 unless the
	// program asked for the signal: the launcher then sees EPIPE, says so
	// once and discards the rest (launcher/output). A handler, unlike
	// ignoring it, is not inherited by the ranks.
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)

	cfg := launchConfig(o, c, stdin, stdout, stderr, sigs)
	rep, err := launcher.LaunchReport(ctx, cfg, launcher.Job{
		Argv: c.argv, NP: o.np, Hosts: c.hosts, Oversubscribe: o.oversubscribe,
		GPUsPerHost: o.gpus, Export: c.exports, Faults: c.faults, MaxRestarts: o.maxRestarts,
		CheckpointSignal: c.ckptSig, CheckpointBefore: o.ckptBefore, MinNP: o.minNP, MaxNP: o.maxNP, ReadmitEvery: o.readmitEvery,
		Hostfile:      o.hostfile, // read again before each elastic restart
		FaultTolerant: o.faultTolerant, MaxFailures: o.maxFailures, FTGroupSize: o.ftGroup,
	})
	code = exitCode(err, stderr)
	writeSummaries(stderr, len(c.faults) > 0, rep)
	if o.report != "" {
		if werr := writeReport(o.report, rep); werr != nil {
			fmt.Fprintf(stderr, "gorun: --report: %v\n", werr)
			if code == 0 {
				code = exitFailure
			}
		}
	}
	return code
}

// checkedLaunch is what checkLaunch made of the flags, beyond options.
type checkedLaunch struct {
	argv        []string
	log         zerolog.Logger
	policy      launcher.ExitPolicy
	pmiMode     launcher.PMIMode
	hosts       []launcher.Host
	inSlurm     bool
	launchAgent []string
	exports     []string // NAME=VALUE, the policies first
	faults      []fault.Fault
	ckptSig     syscall.Signal
}

// checkLaunch checks the flags a launch was given and turns their
// spellings into values; on a flag it refuses it prints why and returns a
// non-zero exit code.
func checkLaunch(fs *flag.FlagSet, o *options, stderr io.Writer) (c checkedLaunch, code int) {
	usage := func(format string, a ...any) (checkedLaunch, int) {
		fmt.Fprintf(stderr, "gorun: "+format+"\n", a...)
		return checkedLaunch{}, exitUsage
	}
	npSet := ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "np" || f.Name == "n" {
			npSet = f.Name
		}
	})
	if npSet != "" && o.np < 1 {
		return usage("-%s %d: the number of ranks must be at least 1 (leave -np out for one rank per slot)", npSet, o.np)
	}
	if c.argv = fs.Args(); len(c.argv) == 0 {
		return usage("no program given (see gorun --help)")
	}
	var err error
	if c.log, err = newLogger(*o, stderr); err != nil {
		return usage("%v", err)
	}
	if c.policy, err = launcher.ParseExitPolicy(o.exitPolicy); err != nil {
		return usage("%v", err)
	}
	if c.pmiMode, err = launcher.ParsePMIMode(o.pmi); err != nil {
		return usage("%v", err)
	}
	if c.hosts, c.inSlurm, c.launchAgent, code = resolveHosts(*o, "gorun", stderr); code != 0 {
		return checkedLaunch{}, code
	}
	if c.exports, code = launchExports(*o, stderr); code != 0 {
		return checkedLaunch{}, code
	}
	if c.faults, err = readFaults(*o); err != nil {
		return usage("%s", strings.TrimPrefix(err.Error(), "launcher: "))
	}
	c.ckptSig, err = launcher.ParseSignal(o.ckptSignal)
	if err != nil || c.ckptSig == syscall.SIGKILL || c.ckptSig == syscall.SIGSTOP {
		return usage("--checkpoint-signal %s: not a signal a program can catch (write e.g. USR1)", o.ckptSignal)
	}
	if o.ckptBefore < 0 {
		return usage("--checkpoint-signal-before %s: must not be negative", o.ckptBefore)
	}
	if msg := restartUsage(o); msg != "" {
		return usage("%s", msg)
	}
	return c, 0
}

// launchExports is the job's -x list with the supervisor's policies
// (--bind-to, --session, --topology, --rdzv-timeout) in front, resolved to
// NAME=VALUE. The agents read the policies from each rank's environment,
// so they reach every host with the job; an explicit -x GORUN_BIND,
// GORUN_SESSION or GORUN_TOPOLOGY wins. On a value it refuses it prints
// why and returns a non-zero exit code.
func launchExports(o options, stderr io.Writer) ([]string, int) {
	usage := func(format string, a ...any) ([]string, int) {
		fmt.Fprintf(stderr, "gorun: "+format+"\n", a...)
		return nil, exitUsage
	}
	bind, err := supervisor.ParseBind(o.bindTo)
	if err != nil {
		return usage("%v", err)
	}
	topology, err := supervisor.ParseTopology(o.topology)
	if err != nil {
		return usage("%v", err)
	}
	session, err := supervisor.ParseSession(o.session)
	if err != nil {
		return usage("%v", err)
	}
	policies := repeated{"GORUN_BIND=" + bind}
	if session != supervisor.SessionAuto {
		policies = append(policies, "GORUN_SESSION="+session)
	}
	if topology != supervisor.TopologyAuto {
		policies = append(policies, "GORUN_TOPOLOGY="+topology)
	}
	if o.rdzvTimeout < 0 {
		return usage("--rdzv-timeout %s: must not be negative", o.rdzvTimeout)
	}
	if o.rdzvTimeout > 0 {
		policies = append(policies, "GORUN_RDZV_TIMEOUT="+o.rdzvTimeout.String())
	}
	exports, err := plan.ResolveExports(append(policies, o.exports...), os.LookupEnv)
	if err != nil {
		return usage("%s", strings.TrimPrefix(err.Error(), "launcher: "))
	}
	for _, kv := range exports {
		if v, ok := strings.CutPrefix(kv, "GORUN_SESSION="); ok {
			if _, err := supervisor.ParseSession(v); err != nil {
				return usage("-x GORUN_SESSION=%s: expected auto, shared or own", v)
			}
		}
	}
	// The fork server is on only for exactly 1: any other word (yes,
	// true) would leave it off without a word, so it is refused.
	fork, set := os.LookupEnv(supervisor.ForkServerEnv)
	where := "the environment's "
	for _, kv := range exports {
		if v, ok := strings.CutPrefix(kv, supervisor.ForkServerEnv+"="); ok {
			fork, set, where = v, true, "-x "
		}
	}
	if set && fork != "" && fork != "0" && fork != "1" {
		return usage("%s%s=%s: expected 1 (fork Python replacements from a server) or 0", where, supervisor.ForkServerEnv, fork)
	}
	return exports, 0
}

// launchConfig is the launcher's Config for the flags.
func launchConfig(o options, c checkedLaunch, stdin io.Reader, stdout, stderr io.Writer, sigs chan os.Signal) launcher.Config {
	cfg := launcher.DefaultConfig()
	cfg.Logger = c.log
	cfg.Stdin = stdin
	cfg.Stdout, cfg.Stderr = stdout, stderr
	cfg.TagOutput, cfg.TimestampOutput, cfg.OutputDir = o.tagOutput, o.timestamp, o.outputDir
	cfg.Timeout, cfg.Grace, cfg.ExitPolicy = o.timeout, o.grace, c.policy
	cfg.PMI = c.pmiMode
	cfg.Signals = sigs
	cfg.Version = version
	cfg.StarterCommand, cfg.RemoteGorun, cfg.Iface = c.launchAgent, o.agentPath, o.iface
	cfg.Lease, cfg.LaunchTimeout, cfg.FanoutThreshold = o.lease, o.launchTimeout, o.fanout
	cfg.PreloadBinary, cfg.SSHMultiplex = o.preloadBinary, o.sshMultiplex
	cfg.SSHDefaultKex = o.sshKex == "default"
	if o.preloadFiles != "" {
		cfg.PreloadFiles = strings.Split(o.preloadFiles, ",")
	}
	if c.inSlurm || o.launcher == "srun" {
		cfg.Starter = launcher.StartSrun
	}
	return cfg
}

// exitCode prints the one-line verdict and maps an error to gorun's exit
// code: the job's own code when the error carries one.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "gorun: %s\n", strings.TrimPrefix(err.Error(), "launcher: "))
	var coder interface{ ExitCode() int }
	if errors.As(err, &coder) {
		return coder.ExitCode()
	}
	return exitFailure
}

func newLogger(o options, stderr io.Writer) (zerolog.Logger, error) {
	level := zerolog.WarnLevel
	switch {
	case o.veryVerbose:
		level = zerolog.DebugLevel
	case o.verbose:
		level = zerolog.InfoLevel
	}
	var w io.Writer
	switch o.logFormat {
	case "console":
		w = zerolog.ConsoleWriter{Out: stderr, TimeFormat: consolelog.TimeFormat, NoColor: !colorTerminal(stderr)}
	case "json":
		w = stderr
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: expected console or json", o.logFormat)
	}
	// Launch events are milliseconds apart; second resolution (zerolog's
	// default) hides their order. Process-wide, but this is main.
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(w).Level(level).With().Timestamp().Logger(), nil
}

// colorTerminal reports whether w is a terminal that should get colors
// (not when NO_COLOR is set, see no-color.org).
func colorTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("NO_COLOR") != "" {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// resolveHosts checks the options that say where and how agents start
// (shared by a job and `gorun doctor`) and reads the hosts; a non-zero code
// means the error is printed, prefixed with prog.
func resolveHosts(o options, prog string, stderr io.Writer) (hosts []launcher.Host, inSlurm bool, launchAgent []string, code int) {
	if o.hostList != "" && o.hostfile != "" {
		fmt.Fprintf(stderr, "%s: give -H or -hostfile, not both\n", prog)
		return nil, false, nil, exitUsage
	}
	if o.launcher != "auto" && o.launcher != "ssh" && o.launcher != "srun" {
		fmt.Fprintf(stderr, "%s: --launcher %q: expected auto, ssh or srun\n", prog, o.launcher)
		return nil, false, nil, exitUsage
	}
	if o.sshKex != "fast" && o.sshKex != "default" {
		fmt.Fprintf(stderr, "%s: --ssh-kex %q: expected fast or default\n", prog, o.sshKex)
		return nil, false, nil, exitUsage
	}
	hosts, inSlurm, err := readHosts(o, os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return nil, false, nil, exitFailure
	}
	launchAgent, err = splitWords(o.launchAgent)
	if err != nil || len(launchAgent) == 0 {
		fmt.Fprintf(stderr, "%s: --launch-agent %q: %v\n", prog, o.launchAgent, err)
		return nil, false, nil, exitUsage
	}
	return hosts, inSlurm, launchAgent, 0
}

// splitWords splits a command line the way a shell would for simple
// cases: blanks separate words, single and double quotes group them.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, errors.New("unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// restartUsage is what is wrong with the flags that say how a failure is
// survived (--max-restarts, --fault-tolerant, --max-failures), or "".
func restartUsage(o *options) string {
	switch {
	case o.maxRestarts < 0:
		return fmt.Sprintf("--max-restarts %d: must not be negative", o.maxRestarts)
	case o.maxFailures < 0:
		return fmt.Sprintf("--max-failures %d: must not be negative", o.maxFailures)
	case o.faultTolerant && o.maxRestarts > 0:
		return "--fault-tolerant and --max-restarts: choose one (the first replaces a failed rank in place, the second restarts every rank)"
	}
	return ""
}

// writeSummaries prints, after the job, what was injected and what the job
// did about it (with faults injected or restarts made), and a
// --fault-tolerant job's failures and heals.
func writeSummaries(stderr io.Writer, injected bool, rep *launcher.Report) {
	if injected || rep.Restarts > 0 {
		writeFaultSummary(stderr, rep)
	}
	if rep.FaultTolerance != nil {
		writeFTSummary(stderr, rep.FaultTolerance)
	}
}
