package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gorun-hpc/gorun/launcher"
)

// doctorMain is `gorun doctor -hostfile hosts`: pre-flight checks of every
// host, one table line each. Exit codes: 0 every host ready, 1 some host is
// not (or gorun could not check), 2 a bad command line.
func doctorMain(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("gorun doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.hostList, "H", "", "hosts as `host[:slots],...`")
	fs.StringVar(&o.hostList, "host", "", "same as -H")
	fs.StringVar(&o.hostfile, "hostfile", "", "Open MPI style hostfile")
	fs.StringVar(&o.hostfile, "machinefile", "", "same as -hostfile")
	fs.StringVar(&o.launchAgent, "launch-agent", "ssh", "`COMMAND` that runs a command on another host ({host} is replaced)")
	fs.StringVar(&o.agentPath, "agent-path", "", "`PATH` of gorun on the other hosts")
	fs.StringVar(&o.iface, "iface", "", "network interface `NAME or CIDR` to check instead of the routed one")
	fs.DurationVar(&o.launchTimeout, "launch-timeout", launcher.DefaultLaunchTimeout, "how long every host's agent has to connect")
	fs.StringVar(&o.launcher, "launcher", "auto", "auto, ssh or srun")
	fs.StringVar(&o.sshKex, "ssh-kex", "fast", "ssh key exchange: fast (curve25519-sha256 first) or default (ssh's own choice); see gorun --help")
	fs.BoolVar(&o.verbose, "v", false, "log more (info)")
	fs.BoolVar(&o.veryVerbose, "vv", false, "log everything (debug)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: gorun doctor [-H hosts | -hostfile FILE] [flags]

Checks every host (this one when no hosts are given) before a big job, the way a job would use it: the agent
starts over ssh (or srun) and authenticates, gorun's version matches, the
interface gorun would choose, two free ports, every host reaching every
other host's address over TCP and UDP (the gossip layer's protocols), and
the GPUs the CUDA driver shows gorun (nvidia-smi in a -tags nogpu build).
Prints one line per host and a verdict.

Flags:
`)
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, "gorun doctor", stderr); done {
		return code
	}
	o.logFormat = "console"
	log, err := newLogger(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gorun doctor: %v\n", err)
		return exitUsage
	}
	hosts, inSlurm, launchAgent, code := resolveHosts(o, "gorun doctor", stderr)
	if code != 0 {
		return code
	}
	if len(hosts) == 0 {
		// No host list and no allocation: check this host, as a job
		// without -H runs here.
		hosts = []launcher.Host{{Name: "localhost", Slots: 1}}
	}
	cfg := launcher.DefaultConfig()
	cfg.Logger = log
	cfg.Stdout, cfg.Stderr = stdout, stderr
	cfg.Version = version
	cfg.StarterCommand, cfg.RemoteGorun, cfg.Iface, cfg.LaunchTimeout = launchAgent, o.agentPath, o.iface, o.launchTimeout
	cfg.SSHDefaultKex = o.sshKex == "default"
	if inSlurm || o.launcher == "srun" {
		cfg.Starter = launcher.StartSrun
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := launcher.Doctor(ctx, cfg, hosts)
	if rep != nil {
		rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun doctor: %v\n", err)
		return exitFailure
	}
	if !rep.OK() {
		return exitFailure
	}
	return 0
}
