package testhosts

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// Slurm is a running single-node SLURM cluster made by slurm-up.sh. Client
// commands (srun, sbatch, salloc, sinfo, scontrol) need SLURM_CONF=Conf in
// their environment; Env and Command provide it.
//
// The cluster is shared by every test binary on the machine that asked for
// it and stops when the last owner Closes it (or has died). Its methods are
// safe for concurrent use; Close is idempotent.
type Slurm struct {
	// Conf is the slurm.conf path, the value of SLURM_CONF.
	Conf string
	// StateDir holds the configuration, the daemons' state and their logs
	// (slurmctld.log, slurmd.log), useful when a test fails.
	StateDir string
	// Node is the only node's name (this machine's short hostname), CPUs
	// the CPUs it declares (at least 16, more than the machine may have,
	// so srun -n 16 runs without --overcommit), Partition the default
	// partition.
	Node      string
	CPUs      int
	Partition string

	// owner is this handle's registration with slurm-up.sh: pid.counter,
	// so two tests of one process hold separate references.
	owner     string
	closeOnce sync.Once
	closeErr  error
}

// slurmOwners numbers the handles of this process.
var slurmOwners atomic.Uint64

// StartSlurm starts the cluster (or joins the running one) as an owner of
// this process. The caller must Close it; RequireSlurm does that for tests.
func StartSlurm(ctx context.Context) (*Slurm, error) {
	ctx, cancel := context.WithTimeout(ctx, upTimeout)
	defer cancel()
	owner := fmt.Sprintf("%d.%d", os.Getpid(), slurmOwners.Add(1))
	kv, err := runScript(ctx, "slurm", "slurm-up.sh", "--owner", owner)
	if err != nil {
		// Drop this owner's registration; the cluster stops if unused.
		_, _ = runScript(context.Background(), "slurm", "slurm-down.sh", "--owner", owner)
		return nil, err
	}
	cpus, _ := strconv.Atoi(kv["CPUS"])
	s := &Slurm{Conf: kv["SLURM_CONF"], StateDir: kv["STATE"], Node: kv["NODE"], CPUs: cpus, Partition: kv["PARTITION"], owner: owner}
	if s.Conf == "" || s.Node == "" || cpus < 1 {
		_ = s.Close()
		return nil, fmt.Errorf("testhosts: slurm-up.sh printed an unexpected result: %v", kv)
	}
	return s, nil
}

// RequireSlurm returns the test cluster and releases it when the test ends.
// It skips the test when the machine cannot run it (not root, packages
// missing and not installable) or in -short mode.
func RequireSlurm(t testing.TB) *Slurm {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: the SLURM test cluster takes seconds to start (-short)")
	}
	s, err := StartSlurm(context.Background())
	if err != nil {
		skipOrFatal(t, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("stopping the SLURM test cluster: %v", err)
		}
	})
	return s
}

// Close releases this process's ownership; the last owner stops the
// cluster, cancelling its jobs and killing what is left of them.
func (s *Slurm) Close() error {
	s.closeOnce.Do(func() {
		_, s.closeErr = runScript(context.Background(), "slurm", "slurm-down.sh", "--owner", s.owner)
	})
	return s.closeErr
}

// Env returns this process's environment plus SLURM_CONF, for commands
// that talk to the cluster.
func (s *Slurm) Env() []string {
	return append(os.Environ(), "SLURM_CONF="+s.Conf)
}

// Command returns a command (srun, sbatch, ...) with Env set.
func (s *Slurm) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = s.Env()
	return cmd
}
