/* A stand-in for NCCL (libnccl.so.2) with NCCL's signatures, over host
 * memory, for gorun's tests on machines where no NCCL loads. Ranks may be
 * threads of one process or separate processes: a communicator is a POSIX
 * shared-memory segment named in the unique id, holding one byte ring per
 * ordered pair of ranks. Every collective is a set of point-to-point
 * transfers through those rings plus a local reduction in rank order, run on
 * the caller's stream (the CUDA stand-in's stream thread), so calls return at
 * once and complete in stream order. Grouped calls (ncclGroupStart/End) run
 * as one stream operation whose transfers progress together, so grouped
 * send/recv never deadlocks, as with NCCL.
 *
 * Failure behaviour follows NCCL's: an asynchronous error leaves the
 * operation hung until ncclCommAbort; a dead peer hangs its partners until
 * they abort. Aborted operations complete (as killed kernels do) so streams
 * drain.
 *
 * Environment (tests only):
 *   STANDIN_NCCL_VERSION     the code ncclGetVersion reports (default 22203)
 *   STANDIN_NCCL_FAIL_RANK,  make rank R report ncclSystemError as an
 *   STANDIN_NCCL_FAIL_AFTER  asynchronous error, and hang, at its N-th call
 *   STANDIN_NCCL_CORRUPT     when set, every reduction flips a bit of its
 *                            first output element: a broken NCCL that a
 *                            correctness check must catch
 * and the exported standinInjectAsyncError(comm, code). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "standin.h"

typedef enum {
	ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
	ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
} ncclResult_t;

enum { tInt8, tUint8, tInt32, tUint32, tInt64, tUint64, tFloat16, tFloat32, tFloat64, tBfloat16, tCount };
enum { oSum, oProd, oMax, oMin, oAvg, oCount };

typedef struct { char internal[128]; } ncclUniqueId;

typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
} ncclConfig_prefix;

#define RING (256 * 1024)
#define MAGIC "GSID"

struct ring {
	_Atomic unsigned long long head; /* bytes written by the producer */
	char pad1[56];
	_Atomic unsigned long long tail; /* bytes read by the consumer */
	char pad2[56];
	char data[RING];
};

struct seg {
	_Atomic int arrived;
	char pad[60];
	struct ring rings[]; /* rings[from*n + to] */
};

typedef struct ncclComm {
	int rank, n;
	char name[64];
	struct seg *seg;
	size_t seglen;
	atomic_int aborted;
	atomic_int async_err;  /* an injected asynchronous error */
	atomic_int init_state; /* 0 running, 1 done, 2 failed */
	atomic_int finalizing;
	atomic_int inflight; /* stream operations queued and not finished */
	atomic_int calls;
	int fail_after;
	int corrupt;
	pthread_t init_th;
	int has_init_th;
} *ncclComm_t;

static __thread char last_err[512];
static char global_err[512];
static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t fail(ncclResult_t r, const char *fmt, const char *arg) {
	pthread_mutex_lock(&err_mu);
	snprintf(global_err, sizeof global_err, fmt, arg);
	snprintf(last_err, sizeof last_err, "%s", global_err);
	pthread_mutex_unlock(&err_mu);
	return r;
}

static void snooze(void) {
	struct timespec ts = {0, 20000};
	nanosleep(&ts, NULL);
}

static uint64_t fnv(const char *b, int n) {
	uint64_t h = 1469598103934665603ULL;
	for (int i = 0; i < n; i++)
		h = (h ^ (unsigned char)b[i]) * 1099511628211ULL;
	return h;
}

ncclResult_t ncclGetVersion(int *v) {
	const char *e = getenv("STANDIN_NCCL_VERSION");
	*v = e ? atoi(e) : 22203;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	}
	return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) {
	(void)comm;
	return last_err[0] ? last_err : global_err;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	static atomic_int counter;
	memset(id, 0, sizeof *id);
	memcpy(id->internal, MAGIC, 4);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(id->internal + 4, 60, "/gorun-standin-%d-%d-%ld", (int)getpid(),
		 atomic_fetch_add(&counter, 1), (long)(ts.tv_nsec & 0xffffff));
	/* Fill the rest so that a by-value id cut or shifted anywhere fails the
	 * checksum below. */
	for (int i = 64; i < 120; i++)
		id->internal[i] = (char)(i * 7 + 3);
	uint64_t h = fnv(id->internal, 120);
	memcpy(id->internal + 120, &h, 8);
	return ncclSuccess;
}

static size_t seg_len(int n) { return sizeof(struct seg) + (size_t)n * n * sizeof(struct ring); }

/* init_run maps the segment and waits for every rank; it ends early when the
 * communicator is aborted. */
static void *init_run(void *p) {
	ncclComm_t c = p;
	int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)c->seglen) != 0) {
		if (fd >= 0)
			close(fd);
		fail(ncclSystemError, "stand-in: shared memory %s unavailable", c->name);
		atomic_store(&c->init_state, 2);
		return NULL;
	}
	c->seg = mmap(NULL, c->seglen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (c->seg == MAP_FAILED) {
		c->seg = NULL;
		fail(ncclSystemError, "stand-in: cannot map %s", c->name);
		atomic_store(&c->init_state, 2);
		return NULL;
	}
	atomic_fetch_add(&c->seg->arrived, 1);
	while (atomic_load(&c->seg->arrived) < c->n) {
		if (atomic_load(&c->aborted)) {
			atomic_store(&c->init_state, 2);
			return NULL;
		}
		snooze();
	}
	if (c->rank == 0)
		shm_unlink(c->name); /* every rank has it mapped */
	atomic_store(&c->init_state, 1);
	return NULL;
}

static ncclResult_t init(ncclComm_t *out, int n, ncclUniqueId *id, int rank, int blocking) {
	if (!out || n < 1 || rank < 0 || rank >= n)
		return fail(ncclInvalidArgument, "stand-in: %s", "bad rank, size or comm pointer");
	if (memcmp(id->internal, MAGIC, 4) != 0)
		return fail(ncclInvalidArgument, "stand-in: %s", "unique id has no magic (not passed by value?)");
	uint64_t h;
	memcpy(&h, id->internal + 120, 8);
	if (h != fnv(id->internal, 120))
		return fail(ncclInvalidArgument, "stand-in: %s", "unique id checksum mismatch (corrupted in passing)");
	ncclComm_t c = calloc(1, sizeof *c);
	c->rank = rank;
	c->n = n;
	memcpy(c->name, id->internal + 4, 60);
	c->name[63] = 0;
	c->seglen = seg_len(n);
	const char *fr = getenv("STANDIN_NCCL_FAIL_RANK"), *fa = getenv("STANDIN_NCCL_FAIL_AFTER");
	c->fail_after = fr && fa && atoi(fr) == rank ? atoi(fa) : 0;
	c->corrupt = getenv("STANDIN_NCCL_CORRUPT") != NULL;
	*out = c;
	if (blocking) {
		init_run(c);
		if (atomic_load(&c->init_state) != 1)
			return ncclSystemError;
		return ncclSuccess;
	}
	pthread_create(&c->init_th, NULL, init_run, c);
	c->has_init_th = 1;
	return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank) {
	return init(comm, n, &id, rank, 1);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank, ncclConfig_prefix *cfg) {
	int blocking = 1;
	if (cfg) {
		if (cfg->magic != 0xcafebeef)
			return fail(ncclInvalidArgument, "stand-in: %s", "ncclConfig_t not initialized");
		if (cfg->size >= 20 && cfg->version >= 21400 && cfg->blocking == 0)
			blocking = 0;
	}
	return init(comm, n, &id, rank, blocking);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r) {
	if (!c || !r)
		return fail(ncclInvalidArgument, "stand-in: %s", "null comm");
	int is = atomic_load(&c->init_state);
	if (atomic_load(&c->async_err))
		*r = atomic_load(&c->async_err);
	else if (is == 0)
		*r = ncclInProgress;
	else if (is == 2)
		*r = ncclSystemError;
	else if (atomic_load(&c->finalizing) && atomic_load(&c->inflight) > 0)
		*r = ncclInProgress;
	else
		*r = ncclSuccess;
	return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t c, int *n) { *n = c->n; return ncclSuccess; }
ncclResult_t ncclCommUserRank(ncclComm_t c, int *r) { *r = c->rank; return ncclSuccess; }
ncclResult_t ncclCommCuDevice(ncclComm_t c, int *d) { (void)c; *d = 0; return ncclSuccess; }

/* test hook: an asynchronous error as a broken network would raise */
void standinInjectAsyncError(ncclComm_t c, int code) { atomic_store(&c->async_err, code); }

static void release(ncclComm_t c) {
	if (c->has_init_th)
		pthread_join(c->init_th, NULL);
	while (atomic_load(&c->inflight) > 0)
		snooze();
	if (c->seg)
		munmap(c->seg, c->seglen);
	shm_unlink(c->name); /* a rank that never saw everyone arrive */
	free(c);
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (!c)
		return ncclSuccess;
	atomic_store(&c->aborted, 1);
	release(c);
	return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
	if (!c)
		return fail(ncclInvalidArgument, "stand-in: %s", "null comm");
	atomic_store(&c->finalizing, 1);
	return atomic_load(&c->inflight) > 0 ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
	if (!c)
		return ncclSuccess;
	release(c);
	return ncclSuccess;
}

/* ---- operations ---- */

struct xfer {
	ncclComm_t c;
	int send; /* 1: to peer; 0: from peer */
	int peer;
	char *buf;
	size_t len, done;
};

struct post {
	ncclComm_t c;
	int kind; /* 0 copy, 1 reduce */
	int pre;  /* run before the transfers (a copy of this rank's own block) */
	int dt, op;
	char *dst;
	const char *src; /* copy source */
	char *tmp;       /* reduce: n blocks of len bytes, owned */
	size_t len;
};

struct batch {
	int colls; /* collective calls (not sends or receives) in this launch */
	struct xfer *x;
	int nx, capx;
	struct post *p;
	int np, capp;
	ncclComm_t *comms;
	int nc, capc;
	void *stream;
	int stream_set;
	ncclResult_t err;
};

static __thread int group_depth;
static __thread struct batch *pending;

static int elem_size(int dt) {
	static const int s[tCount] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
	return s[dt];
}

static float bf2f(uint16_t b) {
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f2bf(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)(u >> 16 | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

#define FOLD(T, acc, x, op) do { switch (op) { \
	case oSum: case oAvg: acc = acc + (x); break; \
	case oProd: acc = acc * (x); break; \
	case oMax: acc = (x) > acc ? (x) : acc; break; \
	case oMin: acc = (x) < acc ? (x) : acc; break; } } while (0)

#define REDUCE(T, AT, LOAD, STORE) do { \
	for (size_t i = 0; i < cnt; i++) { \
		AT acc = LOAD(((T *)p->tmp)[i]); \
		for (int r = 1; r < n; r++) { AT x = LOAD(((T *)(p->tmp + r * p->len))[i]); FOLD(T, acc, x, p->op); } \
		if (p->op == oAvg) acc = acc / (AT)n; \
		((T *)p->dst)[i] = STORE(acc); \
	} } while (0)
#define ID(x) (x)
#define H2F(x) ((float)(x))
#define F2H(x) ((_Float16)(x))

static void reduce(struct post *p) {
	int n = p->c->n;
	size_t cnt = p->len / elem_size(p->dt);
	switch (p->dt) {
	case tInt8: REDUCE(int8_t, int8_t, ID, ID); break;
	case tUint8: REDUCE(uint8_t, uint8_t, ID, ID); break;
	case tInt32: REDUCE(int32_t, int32_t, ID, ID); break;
	case tUint32: REDUCE(uint32_t, uint32_t, ID, ID); break;
	case tInt64: REDUCE(int64_t, int64_t, ID, ID); break;
	case tUint64: REDUCE(uint64_t, uint64_t, ID, ID); break;
	case tFloat16: REDUCE(_Float16, float, H2F, F2H); break;
	case tFloat32: REDUCE(float, float, ID, ID); break;
	case tFloat64: REDUCE(double, double, ID, ID); break;
	case tBfloat16: REDUCE(uint16_t, float, bf2f, f2bf); break;
	}
}

static void free_batch(struct batch *b) {
	for (int i = 0; i < b->np; i++)
		free(b->p[i].tmp);
	free(b->x);
	free(b->p);
	free(b->comms);
	free(b);
}

static int comm_dead(ncclComm_t c) { return atomic_load(&c->aborted); }

/* run_batch is the stream operation: progress every transfer, then the local
 * steps. Transfers between one pair in one direction keep their issue order
 * (the ring is a byte stream); the others progress together. */
static void run_batch(void *arg) {
	struct batch *b = arg;
	int stuck = 0;
	/* Reads of this rank's own input happen when the stream gets here, not
	 * when the call was issued: earlier work on the stream may write it. */
	for (int i = 0; i < b->np; i++)
		if (b->p[i].pre && !comm_dead(b->p[i].c))
			memcpy(b->p[i].dst, b->p[i].src, b->p[i].len);
	for (int i = 0; i < b->nc; i++) {
		ncclComm_t c = b->comms[i];
		if (c->fail_after && atomic_fetch_add(&c->calls, 1) + 1 == c->fail_after)
			atomic_store(&c->async_err, ncclSystemError);
	}
	for (;;) {
		int left = 0, moved = 0, dead = 0;
		/* busy[c][dir][peer] would be exact; peers of distinct comms never
		 * share a ring, so one flag per (comm index, dir, peer) is kept in
		 * a small scan instead. */
		for (int i = 0; i < b->nx; i++) {
			struct xfer *x = &b->x[i];
			if (x->done == x->len)
				continue;
			if (comm_dead(x->c)) {
				dead = 1;
				continue;
			}
			int blocked = 0;
			for (int j = 0; j < i && !blocked; j++) {
				struct xfer *y = &b->x[j];
				blocked = y->c == x->c && y->send == x->send && y->peer == x->peer && y->done < y->len;
			}
			if (blocked) {
				left++;
				continue;
			}
			if (atomic_load(&x->c->async_err)) {
				left++; /* hung, as NCCL is after an asynchronous error */
				continue;
			}
			int me = x->c->rank, n = x->c->n;
			struct ring *r = x->send ? &x->c->seg->rings[me * n + x->peer] : &x->c->seg->rings[x->peer * n + me];
			unsigned long long head = atomic_load(&r->head), tail = atomic_load(&r->tail);
			size_t k;
			if (x->send) {
				k = RING - (size_t)(head - tail);
				if (k > x->len - x->done)
					k = x->len - x->done;
				size_t off = head % RING, first = k < RING - off ? k : RING - off;
				memcpy(r->data + off, x->buf + x->done, first);
				memcpy(r->data, x->buf + x->done + first, k - first);
				atomic_store(&r->head, head + k);
			} else {
				k = (size_t)(head - tail);
				if (k > x->len - x->done)
					k = x->len - x->done;
				size_t off = tail % RING, first = k < RING - off ? k : RING - off;
				memcpy(x->buf + x->done, r->data + off, first);
				memcpy(x->buf + x->done + first, r->data, k - first);
				atomic_store(&r->tail, tail + k);
			}
			x->done += k;
			moved |= k > 0;
			if (x->done < x->len)
				left++;
		}
		if (!left || (dead && !moved))
			break;
		if (moved)
			stuck = 0;
		else if (++stuck > 64)
			snooze();
	}
	for (int i = 0; i < b->np; i++) {
		struct post *p = &b->p[i];
		if (comm_dead(p->c) || p->pre)
			continue;
		if (p->kind == 0) {
			if (p->dst != p->src)
				memmove(p->dst, p->src, p->len);
		} else {
			reduce(p);
			if (p->c->corrupt && p->len)
				p->dst[0] ^= 0x40;
		}
	}
	for (int i = 0; i < b->nc; i++)
		atomic_fetch_sub(&b->comms[i]->inflight, 1);
	free_batch(b);
}

static struct batch *cur(void) {
	if (!pending)
		pending = calloc(1, sizeof *pending);
	return pending;
}

#define GROW(arr, n, cap) do { if (n == cap) { cap = cap ? 2 * cap : 8; arr = realloc(arr, cap * sizeof *arr); } } while (0)

static void add_xfer(struct batch *b, ncclComm_t c, int send, int peer, const void *buf, size_t len) {
	if (len == 0)
		return;
	GROW(b->x, b->nx, b->capx);
	b->x[b->nx++] = (struct xfer){c, send, peer, (char *)buf, len, 0};
}

static struct post *add_post(struct batch *b, ncclComm_t c, int kind) {
	GROW(b->p, b->np, b->capp);
	struct post *p = &b->p[b->np++];
	memset(p, 0, sizeof *p);
	p->c = c;
	p->kind = kind;
	return p;
}

/* pre_copy copies this rank's own block into a reduction's scratch when the
 * operation runs. The scratch belongs to the post added just before. */
static void pre_copy(struct batch *b, ncclComm_t c, char *dst, const void *src, size_t len) {
	struct post *p = add_post(b, c, 0);
	p->pre = 1, p->dst = dst, p->src = src, p->len = len;
}

/* begin checks the common arguments and joins comm and stream to the batch. */
static ncclResult_t begin(ncclComm_t c, int dt, int op, void *stream) {
	if (!c)
		return fail(ncclInvalidArgument, "stand-in: %s", "null communicator");
	if (atomic_load(&c->init_state) != 1)
		return fail(ncclInvalidUsage, "stand-in: %s", "communicator not initialized");
	if (atomic_load(&c->aborted))
		return fail(ncclInvalidUsage, "stand-in: %s", "communicator aborted");
	if (dt < 0 || dt >= tCount)
		return fail(ncclInvalidArgument, "stand-in: %s", "invalid data type");
	if (op < 0 || op >= oCount)
		return fail(ncclInvalidArgument, "stand-in: %s", "invalid reduction");
	struct batch *b = cur();
	if (b->stream_set && b->stream != stream) {
		b->err = ncclInvalidUsage;
		return fail(ncclInvalidUsage, "stand-in: %s", "one group on several streams is not supported");
	}
	b->stream = stream;
	b->stream_set = 1;
	for (int i = 0; i < b->nc; i++)
		if (b->comms[i] == c)
			return ncclSuccess;
	GROW(b->comms, b->nc, b->capc);
	b->comms[b->nc++] = c;
	return ncclSuccess;
}

static atomic_long grouped_launches; /* launches of several collectives (standinGroupedLaunches) */

static ncclResult_t launch(void) {
	struct batch *b = pending;
	pending = NULL;
	if (!b)
		return ncclSuccess;
	if (b->colls > 1)
		atomic_fetch_add(&grouped_launches, 1);
	if (b->err) {
		ncclResult_t e = b->err;
		free_batch(b);
		return e;
	}
	if (!b->stream_set) {
		free_batch(b);
		return ncclSuccess;
	}
	/* On a GPU the sends and receives of one launch run concurrently, in
	 * no order: a receive into memory a send still reads corrupts the
	 * data. Refuse it, as a sanitizer would, so callers cannot rely on
	 * this stand-in's sequential progress. */
	for (int i = 0; i < b->nx; i++)
		for (int j = 0; j < b->nx; j++) {
			struct xfer *x = &b->x[i], *y = &b->x[j];
			if (x->send && !y->send && x->buf < y->buf + y->len && y->buf < x->buf + x->len) {
				free_batch(b);
				return fail(ncclInvalidUsage, "stand-in: %s",
					    "a receive of this launch overwrites memory a send of it reads");
			}
		}
	for (int i = 0; i < b->nc; i++)
		atomic_fetch_add(&b->comms[i]->inflight, 1);
	standin_enqueue(standin_stream_of(b->stream), run_batch, b);
	return ncclSuccess;
}

static ncclResult_t end_op(ncclResult_t r) {
	if (r != ncclSuccess) {
		if (group_depth == 0 && pending) {
			free_batch(pending);
			pending = NULL;
		} else if (pending) {
			pending->err = r;
		}
		return r;
	}
	return group_depth == 0 ? launch() : ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	if (group_depth == 0)
		return fail(ncclInvalidUsage, "stand-in: %s", "ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0)
		return ncclSuccess;
	return launch();
}

static char *blocks_tmp(size_t len, int n) { return malloc(len * (size_t)n + 1); }

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, int dt, int op, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, op, stream);
	if (e)
		return end_op(e);
	struct batch *b = cur();
	b->colls++;
	size_t len = count * elem_size(dt);
	struct post *p = add_post(b, c, 1);
	p->dt = dt, p->op = op, p->dst = r, p->len = len, p->tmp = blocks_tmp(len, c->n);
	char *tmp = p->tmp; /* p moves when the post list grows */
	pre_copy(b, c, tmp + c->rank * len, s, len);
	for (int q = 0; q < c->n; q++) {
		if (q == c->rank)
			continue;
		add_xfer(b, c, 1, q, s, len);
		add_xfer(b, c, 0, q, tmp + q * len, len);
	}
	return end_op(ncclSuccess);
}

ncclResult_t ncclReduce(const void *s, void *r, size_t count, int dt, int op, int root, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, op, stream);
	if (!e && (root < 0 || root >= c->n))
		e = fail(ncclInvalidArgument, "stand-in: %s", "root out of range");
	if (e)
		return end_op(e);
	struct batch *b = cur();
	b->colls++;
	size_t len = count * elem_size(dt);
	if (c->rank != root) {
		add_xfer(b, c, 1, root, s, len);
		return end_op(ncclSuccess);
	}
	struct post *p = add_post(b, c, 1);
	p->dt = dt, p->op = op, p->dst = r, p->len = len, p->tmp = blocks_tmp(len, c->n);
	char *tmp = p->tmp; /* p moves when the post list grows */
	pre_copy(b, c, tmp + c->rank * len, s, len);
	for (int q = 0; q < c->n; q++)
		if (q != c->rank)
			add_xfer(b, c, 0, q, tmp + q * len, len);
	return end_op(ncclSuccess);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, int dt, int op, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, op, stream);
	if (e)
		return end_op(e);
	struct batch *b = cur();
	b->colls++;
	size_t len = count * elem_size(dt);
	struct post *p = add_post(b, c, 1);
	p->dt = dt, p->op = op, p->dst = r, p->len = len, p->tmp = blocks_tmp(len, c->n);
	char *tmp = p->tmp; /* p moves when the post list grows */
	pre_copy(b, c, tmp + c->rank * len, (const char *)s + c->rank * len, len);
	for (int q = 0; q < c->n; q++) {
		if (q == c->rank)
			continue;
		add_xfer(b, c, 1, q, (const char *)s + q * len, len);
		add_xfer(b, c, 0, q, tmp + q * len, len);
	}
	return end_op(ncclSuccess);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t count, int dt, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, 0, stream);
	if (e)
		return end_op(e);
	struct batch *b = cur();
	b->colls++;
	size_t len = count * elem_size(dt);
	for (int q = 0; q < c->n; q++) {
		if (q == c->rank)
			continue;
		add_xfer(b, c, 1, q, s, len);
		add_xfer(b, c, 0, q, (char *)r + q * len, len);
	}
	struct post *p = add_post(b, c, 0);
	p->dst = (char *)r + c->rank * len, p->src = s, p->len = len;
	return end_op(ncclSuccess);
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, int dt, int root, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, 0, stream);
	if (!e && (root < 0 || root >= c->n))
		e = fail(ncclInvalidArgument, "stand-in: %s", "root out of range");
	if (e)
		return end_op(e);
	struct batch *b = cur();
	b->colls++;
	size_t len = count * elem_size(dt);
	if (c->rank == root) {
		for (int q = 0; q < c->n; q++)
			if (q != c->rank)
				add_xfer(b, c, 1, q, s, len);
		struct post *p = add_post(b, c, 0);
		p->dst = r, p->src = s, p->len = len;
	} else {
		add_xfer(b, c, 0, root, r, len);
	}
	return end_op(ncclSuccess);
}

ncclResult_t ncclSend(const void *s, size_t count, int dt, int peer, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, 0, stream);
	if (!e && (peer < 0 || peer >= c->n))
		e = fail(ncclInvalidArgument, "stand-in: %s", "peer out of range");
	if (e)
		return end_op(e);
	add_xfer(cur(), c, 1, peer, s, count * elem_size(dt));
	return end_op(ncclSuccess);
}

ncclResult_t ncclRecv(void *r, size_t count, int dt, int peer, ncclComm_t c, void *stream) {
	ncclResult_t e = begin(c, dt, 0, stream);
	if (!e && (peer < 0 || peer >= c->n))
		e = fail(ncclInvalidArgument, "stand-in: %s", "peer out of range");
	if (e)
		return end_op(e);
	add_xfer(cur(), c, 0, peer, r, count * elem_size(dt));
	return end_op(ncclSuccess);
}

/* standinGroupedLaunches counts the launches that carried more than one
 * collective call (several calls between ncclGroupStart and ncclGroupEnd),
 * so that tests can tell a grouped issue from calls made one by one. */
long standinGroupedLaunches(void) { return atomic_load(&grouped_launches); }
