/*
 * gorun.h — the C ABI of gorun's collective runtime (libgorun.so).
 *
 * One process is one rank. gorun_init joins the job's world the way gorun's
 * Go programs do (gorun's GORUN_* variables, torch's RANK/WORLD_SIZE/
 * MASTER_ADDR/MASTER_PORT, SLURM's SLURM_PROCID/SLURM_NTASKS, or a world of
 * one when none is set) and returns the world communicator. Every collective
 * takes raw host pointers, an element type and a count, and either blocks
 * (req == NULL) or returns a request to test or wait on.
 *
 * Conventions
 *  - Every function returns a gorun_status (GORUN_OK is 0). On failure the
 *    calling thread's error text (gorun_last_error) says what failed and, for a
 *    lost or mismatched peer, which rank; gorun_last_error_rank gives that
 *    world rank as a number. Like errno, the text belongs to the calling
 *    thread and is replaced by the next failing call on that thread.
 *  - Communicators and requests are small integer handles (never pointers),
 *    valid until gorun_comm_free / gorun_request_free / gorun_finalize. No
 *    handle is reused within a process, and no two objects of any kinds
 *    share one: a freed handle, or one of another kind, is GORUN_ERR_INVALID.
 *  - Buffers belong to the caller and must stay valid and untouched from the
 *    call until its request completes. send == recv is the in-place form.
 *  - Calls on one communicator complete in the order they were issued, on
 *    every rank; every rank must issue the same collectives in the same order.
 *    A rank that issues a different call gets GORUN_ERR_DESYNC naming both
 *    calls, and so do its peers.
 *  - A communicator fails as a whole: after a lost peer, a desync, an invalid
 *    argument, a timeout or gorun_comm_abort, every pending and later call on
 *    it fails with the same error, and the peers are told, so no rank waits
 *    for a message that will never come.
 *  - The library never calls exit and never lets a Go panic escape: an
 *    internal failure is GORUN_ERR_INTERNAL with the panic's text.
 *  - Thread safety: every function may be called from any thread. The library
 *    runs its own threads (Go's runtime: a few OS threads, GOMAXPROCS 2 unless
 *    the GOMAXPROCS environment variable says otherwise).
 *  - fork: a child of a process that loaded the library must not call it
 *    (Go's runtime does not survive fork); exec first, or never call it there.
 */
#ifndef GORUN_H
#define GORUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GORUN_ABI_VERSION 1

typedef int64_t gorun_comm_t;    /* > 0 when valid */
typedef int64_t gorun_request_t; /* > 0 when valid */

typedef enum {
    GORUN_OK = 0,
    GORUN_ERR_INVALID = 1,   /* bad argument, handle, dtype, op, count or root */
    GORUN_ERR_PEER_LOST = 2, /* a rank died, closed or broke its connection */
    GORUN_ERR_DESYNC = 3,    /* ranks issued different calls at one position */
    GORUN_ERR_TIMEOUT = 4,   /* gorun_wait: not complete yet (the call goes on);
                                elsewhere: the call's own timeout ended it */
    GORUN_ERR_ABORTED = 5,   /* gorun_comm_abort, here or on a peer */
    GORUN_ERR_CLOSED = 6,    /* the communicator or library was closed */
    GORUN_ERR_INIT = 7,      /* joining the world failed (environment, rendezvous) */
    GORUN_ERR_INTERNAL = 8   /* a bug: the text says where */
} gorun_status;

/* Element types; values match Go's comm.DType. GORUN_BOOL is one byte per
 * element (0 or 1); reductions of it are logical: SUM and MAX are "or", PROD
 * and MIN are "and"; AVG is invalid. */
typedef enum {
    GORUN_FLOAT32 = 1,
    GORUN_FLOAT64 = 2,
    GORUN_BFLOAT16 = 3,
    GORUN_FLOAT16 = 4,
    GORUN_INT32 = 5,
    GORUN_INT64 = 6,
    GORUN_UINT8 = 7,
    GORUN_BOOL = 8
} gorun_dtype;

/* Reductions; values match Go's comm.Op. 16-bit floats reduce in float32 and
 * round once; AVG truncates for integers. */
typedef enum {
    GORUN_SUM = 1,
    GORUN_PROD = 2,
    GORUN_MIN = 3,
    GORUN_MAX = 4,
    GORUN_AVG = 5
} gorun_op;

/* The library's own Go code defines GORUN_NO_PROTOTYPES: cgo declares the
 * exported functions itself, with the same ABI but without const. */
#ifndef GORUN_NO_PROTOTYPES

/* ---- life cycle ---------------------------------------------------------- */

/* gorun_abi_version returns GORUN_ABI_VERSION of the loaded library. */
int gorun_abi_version(void);

/* gorun_init joins the world and stores the world communicator in *world.
 * config is NULL or space-separated key=value settings:
 *   deterministic=0|1  every reduction follows one fixed tree over the ranks,
 *                      so results are bitwise the same for any size/algorithm
 *   timeout_ms=N       a call that has run N ms without completing fails its
 *                      communicator on every rank (GORUN_ERR_TIMEOUT, naming
 *                      a rank that had not reached the call)
 *                      (0: no limit; default 0)
 *   connect_timeout_ms=N  each communicator (the world, gorun_comm_group)
 *                      waits at most N ms for its peers to connect, then
 *                      fails (GORUN_ERR_TIMEOUT) (0: the default, 60 s)
 *   tcp=0|1            1: no shared memory between ranks on one host
 *   env.NAME=VALUE     read VALUE for the environment variable NAME (VALUE
 *                      without spaces). Go's runtime sees only the
 *                      environment the process started with, not later
 *                      setenv calls: a host that learns its rendezvous late
 *                      (e.g. through torch's store) passes it here.
 * An unknown key or bad value is GORUN_ERR_INVALID naming it. Calling it again
 * before gorun_finalize returns the same world. */
int gorun_init(const char *config, gorun_comm_t *world);

/* gorun_finalize closes every communicator (waiting for issued calls; abort
 * first to give up on them), leaves the world and frees every handle. The
 * library may be initialized again afterwards. It reports the failure of the
 * world and of the communicators still open, not of those freed before. */
int gorun_finalize(void);

/* gorun_report_step tells the launcher that this rank finished training step
 * `step` (1-based, the program's numbering): gorun fires its
 * --inject ...:after-steps=N faults on it. One non-blocking write to a pipe;
 * a no-op when gorun did not start the process. GORUN_ERR_INVALID before
 * gorun_init or for a negative step. */
int gorun_report_step(long long step);

/* ---- communicators ------------------------------------------------------- */

/* Rank and size of this process in comm; world_rank maps a rank of comm to
 * its world rank. */
int gorun_comm_rank(gorun_comm_t comm, int *rank);
int gorun_comm_size(gorun_comm_t comm, int *size);
int gorun_comm_world_rank(gorun_comm_t comm, int rank, int *world_rank);

/* gorun_comm_group makes a communicator of the world ranks ranks[0..n-1],
 * numbered in that order. Only the listed ranks call it, all with the same
 * list and tag; it blocks until they are connected. tag (may be NULL) tells
 * apart two groups with the same members. */
int gorun_comm_group(gorun_comm_t world, const int *ranks, int n, const char *tag, gorun_comm_t *out);

/* gorun_comm_abort fails every pending and future call on comm with reason
 * (may be NULL) and tells the peers. Returns without waiting. */
int gorun_comm_abort(gorun_comm_t comm, const char *reason);

/* gorun_comm_free waits for comm's issued calls and closes it; a comm that
 * failed (a lost peer, an abort) returns its cause here, once. Freeing the
 * world communicator is gorun_finalize's job: GORUN_ERR_INVALID here. */
int gorun_comm_free(gorun_comm_t comm);

/* ---- collectives ----------------------------------------------------------
 * req == NULL: block until the call completes (bounded by timeout_ms).
 * req != NULL: return at once; *req is a request to test, wait on and free.
 * count is in elements of dtype.                                            */

/* recv = op over ranks of send (count elements each). */
int gorun_allreduce(gorun_comm_t comm, const void *send, void *recv, size_t count,
                    int dtype, int op, gorun_request_t *req);
/* block r of recv (count elements) = send of rank r. */
int gorun_allgather(gorun_comm_t comm, const void *send, void *recv, size_t count,
                    int dtype, gorun_request_t *req);
/* recv (recvcount elements) = this rank's block of op over ranks of send
 * (size * recvcount elements). */
int gorun_reduce_scatter(gorun_comm_t comm, const void *send, void *recv, size_t recvcount,
                         int dtype, int op, gorun_request_t *req);
/* recv = send of root; send is read only at root (may be NULL elsewhere). */
int gorun_broadcast(gorun_comm_t comm, const void *send, void *recv, size_t count,
                    int dtype, int root, gorun_request_t *req);
/* recv at root = op over ranks of send; recv is unused elsewhere (may be NULL). */
int gorun_reduce(gorun_comm_t comm, const void *send, void *recv, size_t count,
                 int dtype, int op, int root, gorun_request_t *req);
/* block r of recv (count elements) at root = send of rank r; recv unused
 * elsewhere (may be NULL). */
int gorun_gather(gorun_comm_t comm, const void *send, void *recv, size_t count,
                 int dtype, int root, gorun_request_t *req);
/* recv (count elements) = block r of send at root, r being this rank; send
 * is read only at root (may be NULL elsewhere). */
int gorun_scatter(gorun_comm_t comm, const void *send, void *recv, size_t count,
                  int dtype, int root, gorun_request_t *req);
/* block p of send goes to rank p, block p of recv comes from rank p; count is
 * the total per buffer, a multiple of the size. */
int gorun_alltoall(gorun_comm_t comm, const void *send, void *recv, size_t count,
                   int dtype, gorun_request_t *req);
/* sendcounts[p] consecutive elements (in rank order) go to rank p;
 * recvcounts[p] come from p. Both arrays have size entries and must agree
 * pairwise across ranks. */
int gorun_alltoallv(gorun_comm_t comm, const void *send, const size_t *sendcounts,
                    void *recv, const size_t *recvcounts, int dtype, gorun_request_t *req);
/* completes once every rank of comm has issued it. */
int gorun_barrier(gorun_comm_t comm, gorun_request_t *req);
/* one buffer to or from one peer. Each takes a place in comm's call order
 * like a collective, so matching sends and receives must be issued in a
 * compatible order on both sides, as with blocking MPI calls. */
int gorun_send(gorun_comm_t comm, const void *buf, size_t count, int dtype, int peer,
               gorun_request_t *req);
int gorun_recv(gorun_comm_t comm, void *buf, size_t count, int dtype, int peer,
               gorun_request_t *req);

/* ---- requests ------------------------------------------------------------ */

/* gorun_test sets *done to 1 once req has completed, without blocking; the
 * status is then the call's result (so a failed call is reported here). */
int gorun_test(gorun_request_t req, int *done);
/* gorun_wait waits for req. timeout_ms < 0 waits as long as the call runs
 * (bounded by init's timeout_ms); otherwise GORUN_ERR_TIMEOUT after that many
 * milliseconds, the call still running. Waiting again is allowed, from any
 * thread. */
int gorun_wait(gorun_request_t req, int64_t timeout_ms);
/* gorun_request_free forgets req. A call still running runs to completion;
 * its buffers must stay valid until then. */
int gorun_request_free(gorun_request_t req);

/* ---- fusion: coalesced all-reduce ------------------------------------------
 * recvs[i] = op over ranks of sends[i] (counts[i] elements of dtype each),
 * for i in 0..n-1, as one call: one request, one flight record, as if the
 * n all-reduces were issued in turn. Small vectors travel fused in one
 * message (with each other and with all-reduces queued next to the call),
 * large ones one after another. The arrays are read during the call only;
 * the buffers must stay valid until it completes. Every rank passes the
 * same n and counts. Small all-reduces issued one by one (req != NULL,
 * back to back) are fused as well while earlier ones run. */
int gorun_allreduce_coalesced(gorun_comm_t comm, void *const *sends, void *const *recvs,
                              const size_t *counts, int n, int dtype, int op, gorun_request_t *req);

#endif /* GORUN_NO_PROTOTYPES */

/* ---- errors (defined in C, always declared) ------------------------------- */

/* The error text of the calling thread's last failing call ("" if none). The
 * pointer stays valid until the thread's next call into the library. */
const char *gorun_last_error(void);
/* The world rank the last error is about (a lost, aborting or mismatched
 * peer), or -1. */
int gorun_last_error_rank(void);
/* A fixed name for a status, e.g. "GORUN_ERR_PEER_LOST". */
const char *gorun_status_name(int status);

/* ---- planner -------------------------------------------------------------
 * The offline planner of `gorun plan` as a call: no gorun_init needed, no
 * communication, pure (the same graph, options and library give the same
 * bytes on every rank), safe from any thread.                               */
#ifndef GORUN_NO_PROTOTYPES

/* gorun_plan runs stepgraph's passes on a step graph and returns the plan.
 *
 * graph, graph_len: a step-graph JSON document (schema gorun.stepgraph/v1,
 *   stepgraph/SCHEMA.md), the format `gorun plan` reads.
 * options: NULL, "" or a JSON object; every key is optional, unknown keys are
 *   GORUN_ERR_INVALID:
 *     "passes"            "reshard,chunk,blocks,overlap" or a list of names,
 *                         run in that order; absent: "blocks,overlap";
 *                         "" or []: none
 *     "cap_bytes"         bucket cap (0: the cost model's)
 *     "min_bytes"         latency-bound bucket size (0: the cost model's)
 *     "search_limit"      merge attempts per collective (0: 16)
 *     "latency_ns", "bus_bandwidth" (bytes/s), "copy_bandwidth" (bytes/s,
 *                         0: members are views): the cost model; absent:
 *                         gorun's TCP defaults (20 us, 1e9)
 *     "chunk_regions"     regions the chunk pass splits (path.Match, "*")
 *     "chunk_accumulate"  sum the chunks' gradients before one collective
 *                         (true)
 *     "chunk_dirs"        directions the chunk pass splits, comma-separated
 *                         ("forward,backward"; absent or "": all)
 *     "chunk_always"      split every matching segment, even where the cost
 *                         model says it exposes more (false)
 *     "chunk_count"       chunks per split segment (0: 2)
 *     "reshard_prefetch"  re-gather N backward blocks ahead (1)
 *     "peak_budget_bytes" refuse any pass whose result raises the
 *                         peak-memory estimate above this (0: no budget);
 *                         the refusal is in plan.passes[i].refused
 * *out, *out_len: on success a malloc'd, NUL-terminated JSON object of
 *   out_len bytes (without the NUL), to be released with gorun_plan_free:
 *     "plan"          what `gorun plan --json` prints (passes, buckets,
 *                     estimates, peak memory, schedule)
 *     "graph"         the planned step-graph document (what `gorun plan -o`
 *                     writes); absent when the passes left the graph as it
 *                     was
 *     "text"          what `gorun plan` prints
 *     "buckets_hash"  the bucket plan's fingerprint, 16 hex digits (what
 *                     executors compare every step)
 *     "hash"          "sha256:<hex>" of the planned graph and the plan:
 *                     ranks compare it to know they planned alike
 *   On failure *out is NULL and gorun_last_error names what was wrong (a
 *   schema error, an invalid graph and where, an unknown pass or option):
 *   GORUN_ERR_INVALID for bad input, GORUN_ERR_INTERNAL for a bug. */
int gorun_plan(const char *graph, size_t graph_len, const char *options,
               char **out, size_t *out_len);

/* gorun_plan_free releases a result of gorun_plan; NULL is ignored. */
void gorun_plan_free(char *out);
#endif /* GORUN_NO_PROTOTYPES */


/* ==== executor: overlap's eager executor, driven from a framework's hooks ====
 *
 * A framework (gorun.torch) plans its step once as a step graph
 * (stepgraph/SCHEMA.md, already through the planner's passes) and hands it
 * here. Every step: begin; enter each region (module path) as its forward
 * starts; ready each tensor a collective reads as it is produced (a
 * gradient, a parameter shard); wait for a result before using it; finish.
 * Packing into fused buckets, issue in plan order, the per-step plan-hash
 * exchange and scattering run here, on Go threads; the caller's thread
 * blocks only in wait and finish. One executor is driven by one thread at a
 * time (calls from several are serialised). */
typedef int64_t gorun_executor_t; /* > 0 when valid */

#ifndef GORUN_NO_PROTOTYPES
/* graph: n bytes of step-graph JSON. groups[i] names the graph's group that
 * runs on comms[i]. config: "" or "key=value ...": trace=0|1 (record a
 * timeline for gorun_executor_trace), flush=0|1 (buckets whose members were
 * not produced start zero-filled at finish, their results dropped: unused
 * parameters), check=0|1 (the plan-hash exchange, default 1),
 * mode=native|serial (serial waits for each bucket at once: the baseline). */
int gorun_executor_new(const char *graph, size_t n, const char **groups,
                       const gorun_comm_t *comms, int ngroups, const char *config,
                       gorun_executor_t *out);
/* the plan's hash: equal on every rank that will run the same collectives. */
int gorun_executor_hash(gorun_executor_t ex, uint64_t *hash);
/* the bucket plan as JSON (buckets.Plan); *len gets its length; buf may be
 * NULL to ask the length; at most cap-1 bytes and a NUL are written. */
int gorun_executor_plan(gorun_executor_t ex, char *buf, size_t cap, size_t *len);
int gorun_executor_begin(gorun_executor_t ex, int64_t step);
/* region's forward starts. A region that comes before one already entered
 * this step (in the graph's region order), or one not in the graph, is
 * GORUN_ERR_INVALID naming both: ranks must not drift from the plan. */
int gorun_executor_enter(gorun_executor_t ex, const char *region);
/* tensor (a member's input name) is produced: in (in_bytes) is copied into
 * its bucket, out (out_bytes) receives the result before the wait on the
 * member's output returns. Both stay valid and unchanged until then. When a
 * bucket is full and every earlier bucket of its group started, it starts. */
int gorun_executor_ready(gorun_executor_t ex, const char *tensor, void *in, size_t in_bytes,
                         void *out, size_t out_bytes, int dtype);
/* blocks until the collective writing out (a member's output name) is done
 * and its results are scattered. A plan mismatch between ranks is
 * GORUN_ERR_DESYNC whose text starts "gorun: plan mismatch:". */
int gorun_executor_wait(gorun_executor_t ex, const char *out);
/* region produced all it will this step: its flushable buckets start. */
int gorun_executor_end_region(gorun_executor_t ex, const char *region);
/* tensor's slot inside its all-reduce bucket (zero copy, like DDP's
 * gradient_as_bucket_view): write the tensor there and hand the slot to ready
 * as in and out. Valid until gorun_executor_free. */
int gorun_executor_view(gorun_executor_t ex, const char *tensor, void **ptr, size_t *n);
/* ends the step: waits for every collective. metrics (may be NULL) gets JSON
 * {step, time_ns, comm_ns, exposed_ns, collectives, bytes, fused_peak_bytes,
 * copied_bytes, buckets}; *len its length. A failed finish leaves the
 * executor unusable: free it. */
int gorun_executor_finish(gorun_executor_t ex, char *metrics, size_t cap, size_t *len);
/* an instant named name on the timeline (a no-op without trace=1); every
 * entered region gets one ("forward REGION") by itself. */
int gorun_executor_mark(gorun_executor_t ex, const char *name);
/* writes the recorded timeline (Chrome/Perfetto JSON) to path. */
int gorun_executor_trace(gorun_executor_t ex, const char *path);
int gorun_executor_free(gorun_executor_t ex);
#endif /* GORUN_NO_PROTOTYPES */

/* ==== fault tolerance: a replica of a `gorun --fault-tolerant` job =========
 *
 * Data parallelism that survives a lost replica (package ft): every step a
 * quorum is agreed (who participates, at which step), gradients are
 * averaged over its participants, and the step counts only if every
 * participant finished it. gorun restarts a dead replica; the replacement
 * heals in its first quorum, copying the state of the live replicas (sliced
 * across them, checked by digest) with no checkpoint file. A replica whose
 * step failed (a participant died mid-collective) stays alive: the step is
 * not committed and the next quorum goes on without the dead one.
 *
 *   gorun_ft_join(NULL, &ft);
 *   gorun_ft_set_state(ft, save, load, user);
 *   while (step < steps) {
 *       gorun_ft_quorum(ft, -1, &q, parts, cap);    // may call load (heal)
 *       ... forward, backward ...                   // or save (serve one)
 *       gorun_ft_allreduce(ft, grads, n, GORUN_FLOAT32, GORUN_AVG, -1);
 *       gorun_ft_should_commit(ft, -1, &commit);
 *       if (commit) optimizer step; else discard the gradients;
 *       gorun_ft_step(ft, &step);
 *   }
 *   gorun_ft_close(ft);
 *
 * A fault-tolerant replica needs no gorun_init (it does not join the gossip
 * world); the calls follow the library's conventions: a gorun_status, the
 * thread's error text, handles never reused. timeout_ms <= 0: no limit of
 * the call's own. Statuses: GORUN_ERR_PEER_LOST for a failed quorum or a lost
 * quorum service, GORUN_ERR_ABORTED for a heal that failed on this side (a
 * callback's error, a digest mismatch), GORUN_ERR_INIT for a program not
 * started by gorun --fault-tolerant or without the job's secret,
 * GORUN_ERR_TIMEOUT when timeout_ms ran out, GORUN_ERR_INVALID for a call out
 * of order or a bad argument, GORUN_ERR_CLOSED from gorun_ft_quorum when the
 * replicas that held the job's last step have finished and left (this one, a
 * late replacement, has nobody to heal from: the job is done, exit
 * successfully). */
typedef int64_t gorun_ft_t; /* > 0 when valid */

/* The state a heal copies, as bytes. save points *buf at the serialized
 * state and sets *len; the bytes must stay valid until save is called again
 * or the handle is closed (the library copies them before save returns to
 * it). Replicas at the same committed step must produce identical bytes.
 * load replaces the state with buf (len bytes, valid during the call only).
 * Both are called on the thread inside gorun_ft_quorum, never concurrently
 * with each other; nonzero from either fails the heal. */
typedef int (*gorun_ft_save_fn)(void *user, const void **buf, size_t *len);
typedef int (*gorun_ft_load_fn)(void *user, const void *buf, size_t len);

/* One step's quorum. */
typedef struct {
    int64_t id;   /* changes exactly when the participants change */
    int64_t step; /* the committed step every participant holds now */
    int size;     /* participants */
    int rank;     /* this replica's index among them */
    int healed;   /* 1: this replica healed in this quorum (its state was loaded) */
    int changed;  /* 1: the participants differ from this replica's previous quorum */
    int sources;  /* replicas that served a heal in this quorum (0: none) */
} gorun_ft_quorum_info;

#ifndef GORUN_NO_PROTOTYPES
/* gorun_ft_join connects this process to its job's quorum service (from
 * gorun's environment: GORUN_FT_ADDR, GORUN_RANK, GORUN_JOB_ID, ...). config
 * is NULL or "key=value ...": dial_timeout_ms=N, connect_timeout_ms=N,
 * tcp=0|1, env.NAME=VALUE (as gorun_init's). It waits for no other replica. */
int gorun_ft_join(const char *config, gorun_ft_t *out);
/* This replica's id (its rank), the job's replica count, this process's
 * incarnation (0: the first; n: the n-th replacement). NULLs are skipped. */
int gorun_ft_info(gorun_ft_t ft, int *replica, int *replicas, int *incarnation);
/* Sets the heal's callbacks (both required) and the pointer they get. Call
 * it before the first quorum. */
int gorun_ft_set_state(gorun_ft_t ft, gorun_ft_save_fn save, gorun_ft_load_fn load, void *user);
/* Starts a step: blocks until every live replica asked, heals this replica
 * (load) or serves others' heal (save) when some participant is behind,
 * and fills *info; participants (capacity entries, at least the replica
 * count; NULL with capacity 0 to skip) gets the participants' replica ids in
 * group-rank order. A quorum that fails on the way is retried inside. */
int gorun_ft_quorum(gorun_ft_t ft, int64_t timeout_ms, gorun_ft_quorum_info *info,
                    int *participants, int capacity);
/* buf (count elements of dtype: GORUN_FLOAT32, BFLOAT16, FLOAT16 or
 * FLOAT64) = op (GORUN_SUM or GORUN_AVG: the sum over the number of
 * participants) over the quorum's participants, in place. A failure fails
 * this replica's vote for the step. */
int gorun_ft_allreduce(gorun_ft_t ft, void *buf, size_t count, int dtype, int op, int64_t timeout_ms);
/* The current quorum's communicator as a communicator handle, for the
 * library's other calls (collectives, gorun_executor_new): group rank =
 * index among the participants. It needs no gorun_init. The handle is
 * valid until the quorum's communicator changes (a gorun_ft_quorum with
 * other participants, or after a step that did not commit) or
 * gorun_ft_close; a stale one is GORUN_ERR_INVALID. Do not free it: ft
 * owns the communicator. A collective on it that fails does not fail the
 * step by itself: report it (gorun_ft_report_error). */
int gorun_ft_comm(gorun_ft_t ft, gorun_comm_t *out);
/* Replica groups (HSDP: gorun --fault-tolerant-group S): a replica is S
 * consecutive ranks, parameters sharded within the group and replicated
 * across groups. *size = S (1 without groups) and *index = this rank's
 * place in its group (rank mod S; the same in every incarnation). Under
 * groups the quorum's participants (gorun_ft_quorum, gorun_ft_allreduce,
 * gorun_ft_comm) are the ranks at this place in every live group: the
 * all-reduce of one shard across the groups. NULLs are skipped. */
int gorun_ft_group(gorun_ft_t ft, int *size, int *index);
/* The replica group's communicator (group rank = place in the group) as a
 * communicator handle: the shard all-gather and gradient reduce-scatter.
 * Built by gorun_ft_quorum; valid until the group's communicator changes
 * or gorun_ft_close, a stale one is GORUN_ERR_INVALID; do not free it.
 * GORUN_ERR_INVALID without groups or before the first quorum. A rank's
 * death fails its whole group (gorun replaces the group), so a failed
 * collective on it fails the step: report it (gorun_ft_report_error). */
int gorun_ft_group_comm(gorun_ft_t ft, gorun_comm_t *out);
/* Marks this step failed on this replica (why may be NULL): its vote will be
 * no. Safe from any thread. */
int gorun_ft_report_error(gorun_ft_t ft, const char *why);
/* Ends the step: votes and waits for the decision, the same on every
 * participant; *commit = 1 only if every participant finished the step.
 * On 1 the committed step advances (and is reported to gorun, for
 * --inject ...:after-steps=N). An error status leaves *commit 0. */
int gorun_ft_should_commit(gorun_ft_t ft, int64_t timeout_ms, int *commit);
/* The number of steps this replica has committed (after a heal, its
 * sources'). */
int gorun_ft_step(gorun_ft_t ft, int64_t *step);
/* Leaves the job gracefully (not counted as a loss) and frees the handle. */
int gorun_ft_close(gorun_ft_t ft);
#endif /* GORUN_NO_PROTOTYPES */

/* ---- receives from any source -------------------------------------------
 * A matcher receives point-to-point messages from any of several sources,
 * each a peer of a communicator (e.g. one two-rank communicator per
 * sender, as a torch backend keeps them). Receives are matched to messages
 * as MPI matches them: a message goes to the first receive, in posting
 * order, that accepts its source (GORUN_ANY_SOURCE, or that source), every
 * message is received exactly once, and one source's messages arrive in the
 * order they were sent. While a matcher serves a source, receive from it
 * only through the matcher. A matcher's sources that never send cost
 * nothing; sources may be added while receives are posted. */
typedef int64_t gorun_matcher_t; /* > 0 when valid */
#define GORUN_ANY_SOURCE (-1)
#ifndef GORUN_NO_PROTOTYPES
int gorun_matcher_new(gorun_matcher_t *out);
/* Source id (>= 0, the caller's name for it, e.g. the sender's rank) is
 * peer of comm. */
int gorun_matcher_add(gorun_matcher_t m, int id, gorun_comm_t comm, int peer);
/* Posts a receive of count elements from source from (an id, or
 * GORUN_ANY_SOURCE); req NULL: waits for it. A message of another size
 * fails the receive (GORUN_ERR_DESYNC) and that source's communicator. */
int gorun_matcher_recv(gorun_matcher_t m, void *buf, size_t count, int dtype, int from,
                       gorun_request_t *req);
/* The source id whose message the completed receive req got. */
int gorun_request_source(gorun_request_t req, int *id);
/* Ends the matcher's receives not yet matched (GORUN_ERR_CLOSED) and its
 * threads; matched receives go on. Free it before its communicators. */
int gorun_matcher_free(gorun_matcher_t m);
#endif /* GORUN_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif
#endif /* GORUN_H */
