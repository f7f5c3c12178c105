package rankenv

// torch.distributed (torchrun) variables.
const (
	// Rank is the global rank, 0 ≤ RANK < WORLD_SIZE.
	Rank = "RANK"
	// WorldSize is the number of ranks in the job.
	WorldSize = "WORLD_SIZE"
	// LocalRank is the rank's index among the ranks on its host.
	LocalRank = "LOCAL_RANK"
	// LocalWorldSize is the number of ranks on the rank's host.
	LocalWorldSize = "LOCAL_WORLD_SIZE"
	// NodeRank is the index of the rank's host in the plan's host order.
	NodeRank = "NODE_RANK"
	// GroupRank is torchrun's name for NODE_RANK.
	GroupRank = "GROUP_RANK"
	// MasterAddr is the address of the host that runs rank 0.
	MasterAddr = "MASTER_ADDR"
	// MasterPort is a TCP port that was free on MASTER_ADDR at launch; it is
	// left for the program (torch binds its TCPStore there). gorun's own
	// rendezvous uses RdzvEndpoint instead, so the two never collide.
	MasterPort = "MASTER_PORT"
)

// MPICH's process-management interface (PMI-1), served by gorun to every
// rank unless --pmi none: MPI libraries of the MPICH family (MPICH, Intel
// MPI, MVAPICH) read these in MPI_Init to reach gorun's PMI server and form
// one world. Without PMI_FD or PMI_PORT such a library starts as a
// singleton (rank 0 of 1), which is why gorun exports none of them when it
// does not serve PMI.
//
// gorun exports no OMPI_* variables: Open MPI forms its world through a
// PMIx server, which gorun does not run, and OMPI_COMM_WORLD_* would tell
// programs they were started by Open MPI's mpirun. Open MPI programs are
// refused before any rank starts.
const (
	// PMIRank is the rank (the PMI client reads it in the PMI_FD mode).
	PMIRank = "PMI_RANK"
	// PMISize is the number of ranks.
	PMISize = "PMI_SIZE"
	// PMIFD is the descriptor number of the rank's connected socket to
	// gorun's PMI server (3), in the default mode.
	PMIFD = "PMI_FD"
	// PMIPort is host:port of the host's PMI server, in the --pmi port
	// mode; the rank presents PMIID there and learns its rank and size.
	PMIPort = "PMI_PORT"
	// PMIID is the rank's random identifier for the PMI_PORT handshake.
	PMIID = "PMI_ID"
)

// CUDAVisibleDevices lists the GPUs assigned to the rank; it is set only when
// GPUs are assigned.
const CUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"

// gorun's own variables, read by the gorun runtime (rendezvous, comm).
const (
	// JobID identifies the job; members of other jobs are refused.
	JobID = "GORUN_JOB_ID"
	// GorunRank, GorunWorldSize and GorunLocalRank repeat RANK, WORLD_SIZE
	// and LOCAL_RANK under gorun's prefix; they win when both are set.
	GorunRank      = "GORUN_RANK"
	GorunWorldSize = "GORUN_WORLD_SIZE"
	GorunLocalRank = "GORUN_LOCAL_RANK"
	GorunLocalSize = "GORUN_LOCAL_WORLD_SIZE"
	GorunNodeRank  = "GORUN_NODE_RANK"
	GorunHost      = "GORUN_HOST"
	// Session is the session policy of oversubscribed ranks (gorun
	// --session: auto, shared or own; unset means auto).
	Session = "GORUN_SESSION"
	// Secret is the job secret: 32 random bytes, hex encoded. Gossip is
	// encrypted with a key derived from it and every data-plane connection
	// is authenticated with it.
	Secret = "GORUN_SECRET"
	// RdzvEndpoint is host:port of the gossip seed: rank 0 binds its gossip
	// listener there; every other rank joins through it. The port was free on
	// that host at launch and differs from MASTER_PORT.
	RdzvEndpoint = "GORUN_RDZV_ENDPOINT"
	// RdzvLease is a Go duration overriding the rendezvous lease (default
	// 4 s): how long a member that gives no sign of life is trusted before
	// it is declared frozen, cut off or unresponsive — a host's attach
	// stream, a gossip member (rendezvous.Config.GossipLease) and comm's
	// links. gorun's supervisors read it from each rank's environment to
	// judge a rank stopped before the world formed.
	RdzvLease = "GORUN_RDZV_LEASE"
	// RestartCount is the world's restart number under gorun --max-restarts
	// (0 in the first world): the rendezvous takes it as the world's
	// generation and refuses members of older ones (TorchRestartCount when
	// it is unset).
	RestartCount = "GORUN_RESTART_COUNT"
	// TorchRestartCount is torchrun's name for the same number.
	TorchRestartCount = "TORCHELASTIC_RESTART_COUNT"
)

// CheckpointSignal names the signal gorun sends every rank to ask for a
// checkpoint ("SIGUSR1" unless gorun --checkpoint-signal chose another),
// as SLURM's --signal does before a time limit: gorun sends it
// --checkpoint-signal-before DUR ahead of its --timeout and of every timed
// kill it injects (a preemption notice), and whenever gorun itself receives
// that signal (on demand: kill -USR1 <gorun>). It is set for every rank;
// a program that checkpoints catches this signal, finishes its step,
// agrees with the other ranks, and writes its checkpoint (the example
// trainer's --checkpoint does). A program that does not catch it is killed
// by it (SIGUSR1's default action), so gorun sends it only when asked to.
const CheckpointSignal = "GORUN_CHECKPOINT_SIGNAL"

// Interface selection for the communication libraries a rank may use,
// set by a multi-host gorun to the interface its host reaches the others
// through (the same one MASTER_ADDR is on for rank 0's host).
const (
	// NCCLSocketIfname names the interface NCCL's bootstrap and socket
	// transport use.
	NCCLSocketIfname = "NCCL_SOCKET_IFNAME"
	// GlooSocketIfname names the interface torch's gloo backend uses.
	GlooSocketIfname = "GLOO_SOCKET_IFNAME"
)

// CollateralFD is the descriptor number of the write end of a pipe to the
// rank's supervisor, set for every rank gorun starts. The gorun runtime
// (comm) writes one line there when a communicator fails because a peer was
// lost or aborted, before the call that failed returns: the supervisor then
// knows that the rank's exit, whatever its code, is a consequence of
// another rank's failure, and gorun's final line names the first cause
// instead of whichever rank happened to exit first (internal/collateral).
const CollateralFD = "GORUN_COLLATERAL_FD"

// hwloc's variables, set by a rank's supervisor only for a program that
// needs libhwloc.so.15 (MPICH's MPI_Init discovers the topology with it),
// only when the rank's environment does not already steer hwloc, and not
// with gorun --topology off (launcher/supervisor/topology.go). hwloc in the
// rank reads them in hwloc_topology_load.
const (
	// HwlocXMLFile is "/proc/self/fd/N": descriptor N is a sealed memfd
	// holding the host's topology as hwloc XML, discovered once by the
	// supervisor, so the rank skips its own discovery.
	HwlocXMLFile = "HWLOC_XMLFILE"
	// HwlocThisSystem is "1": that XML describes the machine the rank runs
	// on, so hwloc's binding calls still act on it.
	HwlocThisSystem = "HWLOC_THISSYSTEM"
	// Topology (gorun --topology) is "off" to leave every rank to its own
	// discovery; unset or "auto" otherwise.
	Topology = "GORUN_TOPOLOGY"
)
