package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/cliflag"
	"github.com/gorun-hpc/gorun/launcher/output"
)

// ExitPolicy decides which failed rank's exit code gorun reports when
// several ranks fail.
type ExitPolicy string

const (
	// ExitFirst reports the first rank that failed (the default, mpirun's).
	ExitFirst ExitPolicy = "first"
	// ExitLowest reports the failed rank with the lowest rank number.
	ExitLowest ExitPolicy = "lowest"
	// ExitMax reports the failed rank with the highest exit code (signal
	// deaths count as 128+signal).
	ExitMax ExitPolicy = "max"
)

// ParseExitPolicy accepts first, lowest or max.
func ParseExitPolicy(s string) (ExitPolicy, error) {
	return cliflag.OneOf("launcher: exit policy", s, ExitFirst, ExitLowest, ExitMax)
}

// Config is how Run executes a plan. Every field has a usable default in
// DefaultConfig.
type Config struct {
	// Logger receives gorun's own diagnostics (never rank output).
	Logger zerolog.Logger
	// Stdin is rank 0's standard input; nil gives every rank /dev/null. An
	// *os.File that is not a terminal is handed to rank 0 directly; a
	// terminal or any other reader is copied through a pipe (a terminal
	// cannot be read by a rank in a background process group).
	Stdin io.Reader
	// Stdout and Stderr receive the ranks' stdout and stderr, line by line.
	Stdout, Stderr io.Writer
	// TagOutput prefixes each terminal line with "[rank] ".
	TagOutput bool
	// TimestampOutput prefixes each line with the time gorun read it.
	TimestampOutput bool
	// OutputDir, when set, receives one file per rank, rank.N.log, with the
	// rank's stdout and stderr; the terminal then gets the tagged stream.
	OutputDir string
	// Timeout ends the job after this long; 0 means never.
	Timeout time.Duration
	// Grace is the delay between SIGTERM and SIGKILL when stopping ranks.
	Grace time.Duration
	// ExitPolicy picks the failure reported when several ranks fail.
	ExitPolicy ExitPolicy
	// Env is the environment every rank inherits before the plan's
	// variables are added; nil means gorun's own environment. On other
	// hosts the base is the host agent's environment instead (what ssh or
	// srun gives it), as with mpirun: use -x (Job.Export) to carry values.
	Env []string
	// Dir is the ranks' working directory; "" means gorun's.
	Dir string
	// Signals delivers signals gorun received (the caller subscribes with
	// signal.Notify; the library never installs handlers). SIGINT, SIGTERM
	// and SIGHUP stop the job: forwarded to every rank, SIGKILL after Grace,
	// a second SIGINT kills at once. Other signals (SIGUSR1, SIGUSR2, e.g.
	// SLURM's pre-timeout warning) are forwarded and the job continues.
	Signals <-chan os.Signal
	// PMI is how ranks reach gorun's PMI server, which MPICH-family MPI
	// programs need to form one world (pmi.go): PMIFD ("" too), PMIPort,
	// or PMINone to serve nothing and export no PMI_* variable.
	PMI PMIMode
	// SupervisorPath is the executable re-run as the job's supervisor; ""
	// means this executable, which must call supervisor.Is/supervisor.Main
	// first thing in main.
	SupervisorPath string

	// The fields below matter only when a job spans hosts other than this
	// machine (or Starter is StartSrun); see remote.go and starter.go.

	// Version is this gorun's version; every host agent must report the
	// same one.
	Version string
	// Starter picks how host agents start: StartSSH (the default, "") or
	// StartSrun inside a SLURM allocation.
	Starter Starter
	// StarterCommand is the starter for other hosts: the command that runs
	// a command on a host (the host agent's, here), e.g.
	// ["ssh", "-p", "2222"] or ["ip", "netns", "exec", "{host}"]; {host}
	// is replaced by the host name, otherwise the name is appended. nil
	// means ssh.
	StarterCommand []string
	// RemoteGorun is the path of gorun on the other hosts; "" means this
	// executable's own path (a shared file system or the same install
	// everywhere).
	RemoteGorun string
	// Iface overrides the interface choice on every host: a name (eth0) or
	// a CIDR (10.0.0.0/16); "" lets each host's routes decide.
	Iface string
	// Lease is how long gorun and a host agent tolerate silence from each
	// other before the host agent kills its ranks and gorun counts them
	// failed;
	// 0 means DefaultLease.
	Lease time.Duration
	// LaunchTimeout bounds the wait for every host agent to connect; 0 means
	// DefaultLaunchTimeout.
	LaunchTimeout time.Duration
	// SSHMultiplex, when positive, makes ssh keep a shared master
	// connection to each host for this long after a job, so the next
	// job's host agents start without a handshake (OpenSSH ControlMaster /
	// ControlPersist). 0 leaves ssh's own configuration alone.
	SSHMultiplex time.Duration
	// SSHDefaultKex leaves ssh's key exchange preference alone; by default
	// gorun puts curve25519-sha256 first for OpenSSH 9 clients, whose
	// post-quantum default costs ~0.25 s of CPU per host (launcher/sshkex).
	SSHDefaultKex bool
	// PreloadBinary sends the program to every host before the ranks
	// start (launcher/preload); PreloadFiles sends these files to the ranks'
	// working directory on every host.
	PreloadBinary bool
	PreloadFiles  []string
	// FanoutThreshold is the number of remote hosts above which host
	// agents start as a tree (host agents run further starters); 0 means
	// DefaultFanoutThreshold, negative never.
	FanoutThreshold int

	// world is set by LaunchReport for each world it runs: the faults to
	// inject and the report to fill (elastic.go); nil otherwise.
	world *worldRun
	// ft is the fault-tolerant job's state (ft.go); nil otherwise.
	ft *ftRun
}

// DefaultGrace is the SIGTERM → SIGKILL delay: long enough for a trainer to
// write a checkpoint, short enough that a stuck job ends within a minute.
const DefaultGrace = 10 * time.Second

// DefaultConfig returns a Config writing to gorun's stdout and stderr, with
// the default grace period and exit policy, no timeout and a disabled
// logger.
func DefaultConfig() Config {
	return Config{
		Logger:     zerolog.Nop(),
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		Grace:      DefaultGrace,
		ExitPolicy: ExitFirst,
	}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	if c.Stdout == nil || c.Stderr == nil {
		return errors.New("launcher: Stdout and Stderr must be set")
	}
	if c.Timeout < 0 {
		return fmt.Errorf("launcher: timeout must not be negative, got %s", c.Timeout)
	}
	if c.Grace < 0 {
		return fmt.Errorf("launcher: grace must not be negative, got %s", c.Grace)
	}
	if _, err := ParseExitPolicy(string(c.ExitPolicy)); err != nil {
		return err
	}
	if c.Starter != "" && c.Starter != StartSSH && c.Starter != StartSrun {
		return fmt.Errorf("launcher: starter %q: expected ssh or srun", c.Starter)
	}
	if c.PMI != "" {
		if _, err := ParsePMIMode(string(c.PMI)); err != nil {
			return err
		}
	}
	if c.Lease < 0 || c.LaunchTimeout < 0 {
		return errors.New("launcher: lease and launch timeout must not be negative")
	}
	return nil
}

// openJobOutput opens where the output of plan's world goes, as c says
// (package launcher/output).
func openJobOutput(c Config, plan *Plan) (*output.Job, error) {
	restart := 0
	if c.world != nil {
		restart = c.world.restart
	}
	return output.Open(output.Config{
		Stdout: c.Stdout, Stderr: c.Stderr, Tag: c.TagOutput, Timestamp: c.TimestampOutput,
		Dir: c.OutputDir, Ranks: len(plan.Ranks), Restart: restart, JobID: plan.JobID,
	})
}
