// Package pmi owns the server side of the process-management interface
// that MPI libraries of the MPICH family (MPICH, Intel MPI, MVAPICH in PMI-1
// mode) use to form their world: the PMI-1 "simple" wire protocol.
//
// An MPICH rank started by a process manager finds a connected socket in
// PMI_FD (or dials PMI_PORT and names itself with PMI_ID) and asks over it
// for its rank, the job's size, a key-value space (KVS) name, and then
// exchanges business cards: every rank puts its address, all ranks meet in
// a barrier, every rank gets the others'. Without PMI_FD and PMI_PORT the
// library silently runs as a one-rank "singleton" job, which is why gorun
// serves this protocol rather than only exporting PMI_RANK and PMI_SIZE.
//
// What this package owns:
//
//   - the wire format (proto.go): "cmd=NAME key=value ...\n" lines, parsed
//     and written;
//   - one host's server (server.go): it answers every request a rank makes
//     about itself locally, keeps the puts made on its host, and turns a
//     barrier that all of its ranks entered into one Fence request for its
//     owner;
//   - PMI_process_mapping (mapping.go), computed from the placement, so MPICH
//     knows which ranks share a node (and so shared memory).
//
// What it leaves to others: making the barrier job-wide. A job spread over
// hosts runs one Server per host; each reports its fence with the puts made
// since the previous one, and the owner (gorun's launcher) releases every
// host once all hosts have fenced. With Config.Fetch (gorun's way) the
// release carries no values: a get of a key the host does not hold is
// asked of the owner (a Get request), once per host and key, so a host
// receives what its ranks read rather than every host's keys at every
// barrier. The owner keeps the released puts in a Store (store.go), which
// answers a get in a batch: with the key come the other keys its host put
// in that barrier, applied with AnswerBatch, so a host that reads every
// rank's key (MPICH's address exchange) asks once per host it reads from,
// not once per key. Without Fetch, the owner releases with the union of
// the puts. Starting ranks, passing
// them their descriptors and ending the job on an abort are the launcher's
// business too: the server only reports (Requests) and never kills.
//
// PMI-2 (pmi2.go) is served too, on the same descriptor or port: a client
// that opens with "cmd=init pmi_version=2" gets the framed PMI-2 protocol
// of MPICH builds configured for it and of Slurm's libpmi2, the library
// `srun --mpi=pmi2` programs link. Debian's MPICH 4.0 itself uses PMI-1
// (MPICH picks the PMI version when it is built, not at run time).
package pmi
