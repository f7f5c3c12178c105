/* A stand-in for the CUDA driver library (libcuda.so.1) with the real
 * driver API's signatures and symbol names (the _v2 ones where the driver
 * exports those). Device memory is malloc'd host memory; each stream is a
 * thread that runs its operations in order; events complete when the stream
 * reaches them. The one "kernel" it knows is gorun's count-wrong kernel
 * (nccl/check.go), run in C instead of from the PTX.
 *
 * Environment (tests only):
 *   STANDIN_CUDA_DEVICES  number of devices; 0 makes cuInit fail with
 *                         CUDA_ERROR_NO_DEVICE, as a GPU-less host does.
 *   STANDIN_CUDA_INLINE   when set, stream operations run in the calling
 *                         thread at once (no stream threads): only for
 *                         one-rank benchmarks of the binding's own cost.
 * CUDA_VISIBLE_DEVICES is honoured as the driver does for a list of
 * indices: the process sees only those devices, renumbered from 0, and a
 * device's name carries its physical index. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "standin.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
	CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_NOT_READY = 600,
};

static atomic_int initialized;
static int ndev = 1;
static int physical[64]; /* ordinal → physical index */

static void snooze(void) {
	struct timespec ts = {0, 20000};
	nanosleep(&ts, NULL);
}

/* ---- streams ---- */

struct op {
	void (*fn)(void *);
	void *arg;
	struct op *next;
};

struct standin_stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;   /* work queued, or idle */
	struct op *head, *tail;
	int busy;
	int stop;
	pthread_t th;
};

static void *stream_main(void *p) {
	standin_stream *s = p;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head && s->stop)
			break;
		struct op *o = s->head;
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		s->busy = 1;
		pthread_mutex_unlock(&s->mu);
		o->fn(o->arg);
		free(o);
		pthread_mutex_lock(&s->mu);
		s->busy = 0;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static standin_stream *stream_new(void) {
	standin_stream *s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_create(&s->th, NULL, stream_main, s);
	return s;
}

static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;
static standin_stream *legacy;
static void legacy_init(void) { legacy = stream_new(); }

standin_stream *standin_stream_of(void *cu_stream) {
	if (cu_stream)
		return cu_stream;
	pthread_once(&legacy_once, legacy_init);
	return legacy;
}

static int inline_ops = -1;

void standin_enqueue(standin_stream *s, void (*fn)(void *), void *arg) {
	if (inline_ops < 0)
		inline_ops = getenv("STANDIN_CUDA_INLINE") != NULL;
	if (inline_ops) {
		fn(arg);
		return;
	}
	struct op *o = calloc(1, sizeof *o);
	o->fn = fn;
	o->arg = arg;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void stream_sync(standin_stream *s) {
	pthread_mutex_lock(&s->mu);
	while (s->head || s->busy)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

/* ---- initialization and devices ---- */

CUresult cuInit(unsigned flags) {
	(void)flags;
	const char *e = getenv("STANDIN_CUDA_DEVICES");
	if (e)
		ndev = atoi(e);
	for (int i = 0; i < 64; i++)
		physical[i] = i;
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	if (vis) {
		/* The driver stops at the first invalid entry. */
		int n = 0;
		char *end;
		for (const char *p = vis; *p && n < 64;) {
			long v = strtol(p, &end, 10);
			if (end == p || v < 0 || v >= ndev)
				break;
			physical[n++] = (int)v;
			p = *end == ',' ? end + 1 : end;
			if (*end != ',')
				break;
		}
		ndev = n;
	}
	if (ndev <= 0)
		return CUDA_ERROR_NO_DEVICE;
	atomic_store(&initialized, 1);
	return CUDA_SUCCESS;
}

#define NEED_INIT() do { if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

CUresult cuDriverGetVersion(int *v) {
	*v = 12040;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	NEED_INIT();
	*n = ndev;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT();
	if (ordinal < 0 || ordinal >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, len, "gorun stand-in device %d", physical[d]);
	return CUDA_SUCCESS;
}

/* One primary context per device; its value only needs to be recognizable. */
static char contexts[64];

CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev || d >= 64)
		return CUDA_ERROR_INVALID_DEVICE;
	*ctx = &contexts[d];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	NEED_INIT();
	return d < 0 || d >= ndev ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

static __thread void *current_ctx;

CUresult cuCtxSetCurrent(void *ctx) {
	NEED_INIT();
	if (ctx && ((char *)ctx < contexts || (char *)ctx >= contexts + 64))
		return CUDA_ERROR_INVALID_HANDLE;
	current_ctx = ctx;
	return CUDA_SUCCESS;
}

/* Calls that need a context fail without one, as the real driver does: this
 * is what proves the binding makes its context current on every thread it
 * calls from. */
#define NEED_CTX() do { NEED_INIT(); if (!current_ctx) return 201 /* CUDA_ERROR_INVALID_CONTEXT */; } while (0)

/* ---- memory ---- */

static atomic_long live_allocs;  /* cuMemAlloc'd and not yet freed (standinLiveAllocs) */
static atomic_int copy_delay_us; /* sleep before each async copy (standinSetCopyDelay) */

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	void *m = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	atomic_fetch_add(&live_allocs, 1);
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	if (p)
		atomic_fetch_sub(&live_allocs, 1);
	free((void *)(uintptr_t)p);
	return CUDA_SUCCESS;
}

/* Synchronous copies wait for the legacy stream, as the real ones do. */
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	NEED_CTX();
	stream_sync(standin_stream_of(NULL));
	memcpy((void *)(uintptr_t)dst, src, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	stream_sync(standin_stream_of(NULL));
	memcpy(dst, (void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

struct dtod {
	void *dst;
	const void *src;
	size_t n;
};

static void copy_pause(void) {
	int us = atomic_load(&copy_delay_us);
	if (us > 0) {
		struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
		nanosleep(&ts, NULL);
	}
}

static void run_dtod(void *p) {
	struct dtod *d = p;
	copy_pause();
	if (d->src)
		memmove(d->dst, d->src, d->n);
	else
		memset(d->dst, 0, d->n);
	free(d);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream) {
	NEED_CTX();
	struct dtod *d = malloc(sizeof *d);
	d->dst = (void *)(uintptr_t)dst;
	d->src = (const void *)(uintptr_t)src;
	d->n = n;
	standin_enqueue(standin_stream_of(stream), run_dtod, d);
	return CUDA_SUCCESS;
}

/* Only the zero fill is modelled (what gorun queues). */
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *stream) {
	NEED_CTX();
	if (v != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct dtod *d = malloc(sizeof *d);
	d->dst = (void *)(uintptr_t)dst;
	d->src = NULL;
	d->n = n;
	standin_enqueue(standin_stream_of(stream), run_dtod, d);
	return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
	NEED_CTX();
	stream_sync(standin_stream_of(NULL));
	memset((void *)(uintptr_t)dst, v, n);
	return CUDA_SUCCESS;
}

/* ---- streams and events ---- */

CUresult cuStreamCreate(void **s, unsigned flags) {
	(void)flags;
	NEED_CTX();
	*s = stream_new();
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(void *p) {
	NEED_CTX();
	standin_stream *s = p;
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	free(s);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(void *s) {
	NEED_CTX();
	stream_sync(standin_stream_of(s));
	return CUDA_SUCCESS;
}

/* An event is its latest record, as in CUDA: a record replaces the one
 * before it, cuStreamWaitEvent and cuEventSynchronize wait for the record
 * that was latest when they were called, and cuEventQuery asks about the
 * latest. Each record is its own object (refcounted by the event and the
 * stream operations that hold it), so a record reached on one stream never
 * stands in for an earlier record still pending on another. */
struct record {
	atomic_int done;
	atomic_int refs;
};

struct event {
	pthread_mutex_t mu;
	struct record *latest; /* NULL: never recorded (complete) */
};

static void record_unref(struct record *r) {
	if (r && atomic_fetch_sub(&r->refs, 1) == 1)
		free(r);
}

/* latest_ref returns e's latest record with a reference taken. */
static struct record *latest_ref(struct event *e) {
	pthread_mutex_lock(&e->mu);
	struct record *r = e->latest;
	if (r)
		atomic_fetch_add(&r->refs, 1);
	pthread_mutex_unlock(&e->mu);
	return r;
}

static void mark_done(void *p) {
	struct record *r = p;
	atomic_store(&r->done, 1);
	record_unref(r);
}

static void mark_wait(void *p) {
	struct record *r = p;
	while (!atomic_load(&r->done))
		snooze();
	record_unref(r);
}

CUresult cuEventCreate(void **e, unsigned flags) {
	(void)flags;
	NEED_CTX();
	struct event *ev = calloc(1, sizeof(struct event));
	pthread_mutex_init(&ev->mu, NULL);
	*e = ev;
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(void *p) {
	NEED_CTX();
	struct event *e = p;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	record_unref(e->latest);
	pthread_mutex_destroy(&e->mu);
	free(e);
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(void *ev, void *s) {
	NEED_CTX();
	struct event *e = ev;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct record *r = calloc(1, sizeof *r);
	atomic_store(&r->refs, 2); /* the event's and the stream operation's */
	pthread_mutex_lock(&e->mu);
	struct record *old = e->latest;
	e->latest = r;
	pthread_mutex_unlock(&e->mu);
	record_unref(old);
	standin_enqueue(standin_stream_of(s), mark_done, r);
	return CUDA_SUCCESS;
}

CUresult cuEventQuery(void *ev) {
	NEED_CTX();
	struct event *e = ev;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct record *r = latest_ref(e);
	int done = !r || atomic_load(&r->done);
	record_unref(r);
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(void *ev) {
	NEED_CTX();
	struct event *e = ev;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct record *r = latest_ref(e);
	while (r && !atomic_load(&r->done))
		snooze();
	record_unref(r);
	return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(void *s, void *ev, unsigned flags) {
	(void)flags;
	NEED_CTX();
	struct event *e = ev;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	struct record *r = latest_ref(e);
	if (r)
		standin_enqueue(standin_stream_of(s), mark_wait, r);
	return CUDA_SUCCESS;
}

/* ---- errors ---- */

CUresult cuGetErrorName(CUresult r, const char **s) {
	switch (r) {
	case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
	case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
	case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
	case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
	case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
	case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
	case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
	case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
	case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
	default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* ---- modules and the count-wrong kernel ---- */

struct func {
	int elem; /* bytes per element compared */
};

static struct func funcs[4] = {{1}, {2}, {4}, {8}};
static char module_token;

CUresult cuModuleLoadData(void **m, const void *image) {
	NEED_CTX();
	/* The PTX is not compiled here; check that it is the text gorun embeds. */
	if (!image || !strstr(image, ".entry gorun_count_wrong_u32"))
		return CUDA_ERROR_INVALID_VALUE;
	*m = &module_token;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	NEED_CTX();
	if (m != &module_token)
		return CUDA_ERROR_INVALID_HANDLE;
	static const char *names[4] = {"gorun_count_wrong_u8", "gorun_count_wrong_u16",
				       "gorun_count_wrong_u32", "gorun_count_wrong_u64"};
	for (int i = 0; i < 4; i++)
		if (!strcmp(name, names[i])) {
			*f = &funcs[i];
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_NOT_FOUND;
}

struct launch {
	int elem;
	const unsigned char *got, *want;
	unsigned long long n;
	unsigned long long *count;
};

static void run_count(void *p) {
	struct launch *l = p;
	unsigned long long wrong = 0;
	for (unsigned long long i = 0; i < l->n; i++)
		if (memcmp(l->got + i * l->elem, l->want + i * l->elem, l->elem))
			wrong++;
	*l->count += wrong;
	free(l);
}

/* The kernel's parameters: (const T *got, const T *want, u64 n, u64 *count). */
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
	(void)shmem;
	(void)extra;
	NEED_CTX();
	struct func *fn = f;
	if (fn < funcs || fn >= funcs + 4)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || !params)
		return CUDA_ERROR_INVALID_VALUE;
	struct launch *l = malloc(sizeof *l);
	l->elem = fn->elem;
	l->got = (const unsigned char *)(uintptr_t) * (CUdeviceptr *)params[0];
	l->want = (const unsigned char *)(uintptr_t) * (CUdeviceptr *)params[1];
	l->n = *(unsigned long long *)params[2];
	l->count = (unsigned long long *)(uintptr_t) * (CUdeviceptr *)params[3];
	standin_enqueue(standin_stream_of(stream), run_count, l);
	return CUDA_SUCCESS;
}

/* ---- test hooks (not part of the driver API) ---- */

struct fill {
	unsigned char *p;
	int v;
	size_t n;
	int usec;
};

static void run_fill(void *arg) {
	struct fill *f = arg;
	struct timespec ts = {f->usec / 1000000, (long)(f->usec % 1000000) * 1000};
	nanosleep(&ts, NULL);
	memset(f->p, f->v, f->n);
	free(f);
}

/* standinDelayedFill queues, on stream s, a "kernel" that sleeps usec
 * microseconds and then sets n bytes at p to v: slow producer work that a
 * collective must wait for, or a consumer that must wait for a collective. */
CUresult standinDelayedFill(void *s, CUdeviceptr p, int v, size_t n, int usec) {
	struct fill *f = malloc(sizeof *f);
	f->p = (unsigned char *)(uintptr_t)p;
	f->v = v;
	f->n = n;
	f->usec = usec;
	standin_enqueue(standin_stream_of(s), run_fill, f);
	return CUDA_SUCCESS;
}

/* standinLiveAllocs is the number of cuMemAlloc_v2 allocations not yet
 * freed: tests check that what gorun allocates it also frees. */
long standinLiveAllocs(void) { return atomic_load(&live_allocs); }

/* standinSetCopyDelay makes every asynchronous copy and fill
 * (cuMemcpyDtoDAsync_v2, cuMemsetD8Async) sleep usec microseconds on its
 * stream before it runs, so that a consumer not ordered after the copy on
 * the device reads what was there before. */
void standinSetCopyDelay(int usec) { atomic_store(&copy_delay_us, usec); }

struct hcopy {
	unsigned char *dst;
	size_t n;
	int usec;
	unsigned char data[];
};

static void run_hcopy(void *arg) {
	struct hcopy *h = arg;
	struct timespec ts = {h->usec / 1000000, (long)(h->usec % 1000000) * 1000};
	nanosleep(&ts, NULL);
	memcpy(h->dst, h->data, h->n);
	free(h);
}

/* standinDelayedWrite queues, on stream s, a "kernel" that sleeps usec
 * microseconds and then writes the n bytes src held when it was queued to
 * dst: a compute kernel's output, late, which a collective must wait for. */
CUresult standinDelayedWrite(void *s, CUdeviceptr dst, const void *src, size_t n, int usec) {
	struct hcopy *h = malloc(sizeof *h + n);
	h->dst = (unsigned char *)(uintptr_t)dst;
	h->n = n;
	h->usec = usec;
	memcpy(h->data, src, n);
	standin_enqueue(standin_stream_of(s), run_hcopy, h);
	return CUDA_SUCCESS;
}
