package rendezvous

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/hostlist"
	"github.com/gorun-hpc/gorun/rankenv"
)

// Variables this package reads beyond rankenv's contract. They are
// overrides for launches without gorun; gorun itself never sets them.
const (
	// EnvRdzvPort overrides the seed port derived from the job id under a
	// direct srun launch (the seed host is the first node of the job).
	EnvRdzvPort = "GORUN_RDZV_PORT"
	// EnvRdzvTimeout overrides Config.FormationTimeout (a Go duration,
	// e.g. "5m").
	EnvRdzvTimeout = "GORUN_RDZV_TIMEOUT"
	// EnvDataAddr sets Config.DataAddr when the rank program does not.
	EnvDataAddr = "GORUN_DATA_ADDR"
	// EnvRdzvFlat=1 sets Config.Flat: one gossip member per rank even
	// when ranks share a host (for comparisons and as an escape hatch).
	EnvRdzvFlat = "GORUN_RDZV_FLAT"
	// EnvRdzvLease overrides Config.AttachLease and Config.GossipLease (a
	// Go duration): how long a member that gives no sign of life is
	// trusted before it is declared frozen, cut off or unresponsive (a
	// host leader and its attached ranks; gossip members; comm's links).
	EnvRdzvLease = rankenv.RdzvLease
)

// SLURM's variables for a direct srun launch.
const (
	slurmProcID    = "SLURM_PROCID"
	slurmNTasks    = "SLURM_NTASKS"
	slurmLocalID   = "SLURM_LOCALID"
	slurmNodeID    = "SLURM_NODEID"
	slurmJobID     = "SLURM_JOB_ID"
	slurmStepID    = "SLURM_STEP_ID"
	slurmNodeList  = "SLURM_JOB_NODELIST"
	slurmStepNodes = "SLURM_STEP_NODELIST"
	slurmTasksPer  = "SLURM_STEP_TASKS_PER_NODE"
	slurmNodeName  = "SLURMD_NODENAME"
	slurmDist      = "SLURM_DISTRIBUTION"
	torchRunID     = "TORCHELASTIC_RUN_ID"
)

// ConfigFromEnv returns DefaultConfig with this rank's identity read from the
// environment. The first launcher whose variables are
// present wins:
//
//  1. gorun: GORUN_RANK and GORUN_WORLD_SIZE. Also GORUN_JOB_ID,
//     GORUN_RDZV_ENDPOINT (seed host:port, where rank 0 binds),
//     GORUN_SECRET (hex, required), GORUN_LOCAL_RANK, GORUN_HOST.
//  2. torch style: RANK and WORLD_SIZE. The seed is GORUN_RDZV_ENDPOINT if
//     set, else MASTER_ADDR:MASTER_PORT. The job id is GORUN_JOB_ID, else
//     TORCHELASTIC_RUN_ID, else "torch-MASTER_ADDR-MASTER_PORT".
//  3. srun: SLURM_PROCID and SLURM_NTASKS (with SLURM_LOCALID, SLURM_JOB_ID,
//     SLURM_STEP_ID). The job id is "slurm-JOBID.STEPID"; the seed is the
//     first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) on port
//     GORUN_RDZV_PORT, else a port in [10000, 30000) derived from the job
//     id (below Linux's ephemeral range, so a free-port listener never
//     holds it). GORUN_RDZV_ENDPOINT overrides both.
//
// In every mode GORUN_SECRET gives the job secret. Without it (possible in
// modes 2 and 3 only) the secret is derived from the job id and the seed,
// SecretDerived is set and Join warns that the job is not protected: any
// process that can read those values could join. GORUN_HOST, else
// SLURMD_NODENAME, else the host name, names the host; GORUN_DATA_ADDR sets
// DataAddr; GORUN_RDZV_TIMEOUT sets FormationTimeout. The local world size
// (GORUN_LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE, or SLURM_STEP_TASKS_PER_NODE at
// SLURM_NODEID) turns on host leaders (Config.LocalWorldSize);
// GORUN_RDZV_FLAT=1 turns them off.
func ConfigFromEnv() (Config, error) {
	return configFromEnv(os.LookupEnv)
}

// ConfigFromLookup is ConfigFromEnv over any lookup function with
// os.LookupEnv's contract: for programs that run several ranks in one
// process (tests, language bindings that receive the environment as a map).
func ConfigFromLookup(look func(string) (string, bool)) (Config, error) {
	return configFromEnv(look)
}

// configFromEnv is ConfigFromEnv over any lookup function: the rank's
// place from the first convention whose variables are set (gorun's,
// torchrun's, Slurm's), then what every convention shares.
func configFromEnv(look func(string) (string, bool)) (Config, error) {
	e := envReader(look)
	c := DefaultConfig()
	var err error
	switch {
	case e.has(rankenv.GorunRank) && e.has(rankenv.GorunWorldSize):
		err = e.placeGorun(&c)
	case e.has(rankenv.Rank) && e.has(rankenv.WorldSize):
		err = e.placeTorch(&c)
	case e.has(slurmProcID) && e.has(slurmNTasks):
		err = e.placeSlurm(&c)
	default:
		return c, ErrNoRankEnv
	}
	if err != nil {
		return c, err
	}
	if err := e.generation(&c); err != nil {
		return c, err
	}
	if err := e.secret(&c); err != nil {
		return c, err
	}
	c.Host = firstNonEmpty(e.get(rankenv.GorunHost), e.get(slurmNodeName))
	if c.Host == "" {
		c.Host, _ = os.Hostname()
	}
	c.DataAddr = e.get(EnvDataAddr)
	if err := e.tuning(&c); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// envReader reads the environment through a lookup function with
// os.LookupEnv's contract.
type envReader func(string) (string, bool)

func (e envReader) get(k string) string { v, _ := e(k); return v }
func (e envReader) has(k string) bool   { _, ok := e(k); return ok }

// atoi reads variable k as an integer.
func (e envReader) atoi(k string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(e.get(k)))
	if err != nil {
		return 0, &ConfigError{Field: k, Problem: fmt.Sprintf("%q is not an integer", e.get(k))}
	}
	return v, nil
}

// place reads the rank and world size from the variables named rank and
// size, and the local rank and size from theirs when they are set.
func (e envReader) place(c *Config, rank, size, local, localSize string) error {
	for _, f := range []struct {
		name     string
		dst      *int
		optional bool
	}{{rank, &c.Rank, false}, {size, &c.WorldSize, false}, {local, &c.LocalRank, true}, {localSize, &c.LocalWorldSize, true}} {
		if f.optional && !e.has(f.name) {
			continue
		}
		v, err := e.atoi(f.name)
		if err != nil {
			return err
		}
		*f.dst = v
	}
	return nil
}

// placeGorun reads the place gorun gives a rank, and refuses a gorun
// environment without its secret.
func (e envReader) placeGorun(c *Config) error {
	if err := e.place(c, rankenv.GorunRank, rankenv.GorunWorldSize, rankenv.GorunLocalRank, rankenv.GorunLocalSize); err != nil {
		return err
	}
	c.JobID = e.get(rankenv.JobID)
	c.Seed = e.get(rankenv.RdzvEndpoint)
	if !e.has(rankenv.Secret) {
		return &ConfigError{Field: rankenv.Secret, Problem: "not set (gorun always sets it)"}
	}
	return nil
}

// placeTorch reads torchrun's variables: the seed is the rendezvous
// endpoint or MASTER_ADDR:MASTER_PORT, the job its run id or one named
// after the seed.
func (e envReader) placeTorch(c *Config) error {
	if err := e.place(c, rankenv.Rank, rankenv.WorldSize, rankenv.LocalRank, rankenv.LocalWorldSize); err != nil {
		return err
	}
	c.Seed = e.get(rankenv.RdzvEndpoint)
	if c.Seed == "" && e.get(rankenv.MasterAddr) != "" && e.get(rankenv.MasterPort) != "" {
		c.Seed = net.JoinHostPort(e.get(rankenv.MasterAddr), e.get(rankenv.MasterPort))
	}
	c.JobID = firstNonEmpty(e.get(rankenv.JobID), e.get(torchRunID))
	if c.JobID == "" {
		c.JobID = "torch-" + strings.NewReplacer(":", "-", "/", "-").Replace(c.Seed)
	}
	return nil
}

// placeSlurm reads srun's variables: the job is the step, the seed the
// step's first node on a port derived from the job, and the ranks' hosts
// follow the step's distribution.
func (e envReader) placeSlurm(c *Config) error {
	var err error
	if c.Rank, err = e.atoi(slurmProcID); err != nil {
		return err
	}
	if c.WorldSize, err = e.atoi(slurmNTasks); err != nil {
		return err
	}
	if e.has(slurmLocalID) {
		if c.LocalRank, err = e.atoi(slurmLocalID); err != nil {
			return err
		}
	}
	job := e.get(slurmJobID)
	if job == "" {
		return &ConfigError{Field: slurmJobID, Problem: "not set under srun"}
	}
	// Two steps of one allocation may run at once: the step id keeps their
	// gossip apart (label, key and port).
	c.JobID = "slurm-" + job + "." + firstNonEmpty(e.get(slurmStepID), "0")
	nodes := firstNonEmpty(e.get(slurmStepNodes), e.get(slurmNodeList))
	c.Seed = e.get(rankenv.RdzvEndpoint)
	hosts, herr := hostlist.Expand(nodes)
	if c.Seed == "" {
		if herr != nil {
			return &ConfigError{Field: slurmNodeList, Problem: herr.Error()}
		}
		port := slurmPort(c.JobID)
		if p := e.get(EnvRdzvPort); p != "" {
			if port, err = e.atoi(EnvRdzvPort); err != nil {
				return err
			}
		}
		c.Seed = net.JoinHostPort(hosts[0], strconv.Itoa(port))
	}
	c.RankHosts = slurmRankHosts(hosts, e.get(slurmTasksPer), e.get(slurmDist), c.WorldSize)
	// The node's task count: SLURM_STEP_TASKS_PER_NODE at this node's index
	// (SLURM_NODEID) gives the host leaders' local world size.
	if counts, err := hostlist.ParseTasksPerNode(e.get(slurmTasksPer)); err == nil {
		if id, err := strconv.Atoi(e.get(slurmNodeID)); err == nil && id >= 0 && id < len(counts) {
			c.LocalWorldSize = counts[id]
		}
	}
	return nil
}

// generation reads the world's generation: gorun's restart count, else
// torchrun's.
func (e envReader) generation(c *Config) error {
	for _, k := range []string{rankenv.RestartCount, rankenv.TorchRestartCount} {
		if v := strings.TrimSpace(e.get(k)); v != "" {
			var err error
			if c.Generation, err = strconv.ParseUint(v, 10, 64); err != nil {
				return &ConfigError{Field: k, Problem: fmt.Sprintf("%q is not a restart count", v)}
			}
			return nil
		}
	}
	return nil
}

// secret reads the job's secret, or derives an insecure one from the job
// and seed when none is set (marked SecretDerived).
func (e envReader) secret(c *Config) error {
	if s := e.get(rankenv.Secret); s != "" {
		var err error
		c.Secret, err = hex.DecodeString(strings.TrimSpace(s))
		if err != nil {
			return &ConfigError{Field: rankenv.Secret, Problem: "not hex: " + err.Error()}
		}
		return nil
	}
	sum := sha256.Sum256([]byte("gorun insecure secret\x00" + c.JobID + "\x00" + c.Seed))
	c.Secret, c.SecretDerived = sum[:], true
	return nil
}

// tuning reads the optional GORUN_RDZV_* settings: flat, the formation
// timeout and the lease (with the beats and suspicion that follow it).
func (e envReader) tuning(c *Config) error {
	if v := e.get(EnvRdzvFlat); v != "" {
		flat, err := strconv.ParseBool(v)
		if err != nil {
			return &ConfigError{Field: EnvRdzvFlat, Problem: fmt.Sprintf("%q is not a boolean", v)}
		}
		c.Flat = flat
	}
	if v := e.get(EnvRdzvTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return &ConfigError{Field: EnvRdzvTimeout, Problem: fmt.Sprintf("%q is not a positive duration", v)}
		}
		c.FormationTimeout = d
	}
	if v := e.get(EnvRdzvLease); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return &ConfigError{Field: EnvRdzvLease, Problem: fmt.Sprintf("%q is not a positive duration", v)}
		}
		c.AttachLease, c.GossipLease = d, d
		// Keep 16 beats per lease, and a short lease usable: memberlist's
		// suspicion takes at most half of it (Config.GossipLease).
		c.AttachBeat = min(c.AttachBeat, d/16)
		c.SuspicionTimeout = min(c.SuspicionTimeout, d/2)
		if c.StarvedLimit != 0 {
			c.StarvedLimit = max(c.StarvedLimit, d)
		}
	}
	return nil
}

// slurmPort derives the seed port from the job id: every rank of the step
// computes the same one with no communication.
func slurmPort(job string) int {
	h := fnv.New32a()
	h.Write([]byte(job))
	return 10000 + int(h.Sum32()%20000)
}

// slurmRankHosts gives each rank's expected host under SLURM's default block
// distribution (ranks fill hosts in order), or nil when it cannot be known.
// It only feeds the "missing 3 (h2)" part of a formation timeout.
func slurmRankHosts(hosts []string, tasksPerNode, dist string, size int) []string {
	if len(hosts) == 0 || tasksPerNode == "" || (dist != "" && !strings.HasPrefix(dist, "block")) {
		return nil
	}
	counts, err := hostlist.ParseTasksPerNode(tasksPerNode)
	if err != nil || len(counts) != len(hosts) {
		return nil
	}
	var out []string
	for i, n := range counts {
		for range n {
			out = append(out, hosts[i])
		}
	}
	if len(out) != size {
		return nil
	}
	return out
}
