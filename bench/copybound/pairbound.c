/*
 * pairbound.c: what the fastest movement of a 2-rank float32 sum all-reduce's
 * bytes between the first two CPUs costs on this host, beside
 * bench/copybound's copy bound (the goal: ">= 32 MiB at >= 90% of the
 * two-core memory-copy bound"; notes/shm-latency.md).
 *
 * Two processes, bound to the first two CPUs this process may run on (as
 * `gorun --bind-to auto` binds 2 ranks), each own an input and a result of
 * -s bytes and all-reduce them -n times after two warm-up calls, the halves
 * cut into chunks of -c bytes so that the two ranks work side by side.
 * Every call first rewrites the input (new gradients each step; not
 * timed), unless -k keeps the first call's input as `gorun bench` and Open
 * MPI's benchmark do. After each call every element is checked (untimed).
 * Modes (-m):
 *
 *   direct   inputs and results live in memory both processes map, so each
 *            rank reduces its half reading the peer's input where it lies,
 *            then copies the peer's reduced half out of the peer's result:
 *            the least traffic any 2-rank all-reduce has (per rank: read S/2
 *            of its own input and S/2 of the peer's, write S/2 of result,
 *            read S/2 of the peer's result and write it, 2.5 S against a
 *            copy's 2 S), and what no library can do with a user's private
 *            buffers.
 *   phased   as direct, but each rank reduces its whole half before either
 *            copies the other's (one hand-over per call, so the lines read
 *            from the peer's result have mostly left its L2).
 *   segment  the buffers are private; each rank copies the half the peer
 *            reduces into a shared ring, reduces the peer's copy of its own
 *            half into its result and copies the reduced chunk into the
 *            ring (fused with the reduction), then copies the peer's reduced
 *            chunk out of the ring: gorun's pair exchange (comm/algo.go,
 *            pairAllReduce) with nothing else around it (4 S of traffic per
 *            rank). The ring holds -r steps of two chunks per direction
 *            (default 32: gorun's 4 MiB ring holds 32 of its 128 KiB
 *            frames). -t 1, 2 or 3 writes the contributions (1), the reduced
 *            chunks (2) or both (3) with non-temporal stores. -l LAG writes
 *            contributions LAG chunks ahead of the reduction and copies the
 *            peer's reduced chunks out LAG chunks after it made them (needs
 *            -r >= 2 LAG + 2).
 *   cross    no reduction: each rank copies the peer's whole input (S bytes
 *            the peer wrote) into its result, both at once: bench/copybound
 *            with every byte crossing between the cores.
 *
 * Each chunk is handed over with one counter per direction on its own cache
 * line (release store, spinning load). It prints one line:
 *
 *   size  mode  chunk  median-us  GB/s
 *
 * where GB/s is size over the slower rank's median call time (busbw =
 * algbw for 2 ranks), comparable with bench/copybound's rate.
 *
 * usage: pairbound [-s BYTES] [-n ITERS] [-c CHUNK] [-m direct|phased|segment|cross] [-l LAG] [-r RINGSTEPS] [-t 1|2|3] [-k]
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_NAME "pairbound"
#include "probe.h"

/* One counter per direction and purpose, each on its own line. */
struct ctl {
	_Alignas(128) volatile uint64_t posted[2]; /* rank r's last posted step */
	_Alignas(128) volatile uint64_t lagA[2]; /* lag mode: contributions written */
	_Alignas(128) volatile uint64_t lagB[2]; /* reduced chunks written */
	_Alignas(128) volatile uint64_t lagC[2]; /* peer's reduced chunks copied out */
	_Alignas(128) volatile uint64_t bar[2]; /* barrier between calls */
	_Alignas(128) volatile double out[2];    /* each rank's median */
	volatile int failed;                     /* a rank found a wrong element */
};

static struct ctl *ctl;

static void post(int me, uint64_t v) { __atomic_store_n(&ctl->posted[me], v, __ATOMIC_RELEASE); }
static void spin(void) {
	if (ctl->failed) /* the peer will not post again */
		_exit(1);
	__builtin_ia32_pause();
}
static void await(int p, uint64_t v) {
	while (__atomic_load_n(&ctl->posted[p], __ATOMIC_ACQUIRE) < v)
		spin();
}
static void awaitw(volatile uint64_t *w, uint64_t v) {
	while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < v)
		spin();
}
static void barrier(int me, uint64_t v) {
	__atomic_store_n(&ctl->bar[me], v, __ATOMIC_RELEASE);
	while (__atomic_load_n(&ctl->bar[1 - me], __ATOMIC_ACQUIRE) < v)
		spin();
}

/* dst = a + b, float32. */
static void add3(float *restrict dst, const float *restrict a, const float *restrict b, size_t n) {
	for (size_t i = 0; i < n; i++)
		dst[i] = a[i] + b[i];
}

/* dst = a + b and copy = the same. */
static void add3copy(float *restrict dst, float *restrict copy, const float *restrict a, const float *restrict b, size_t n) {
	for (size_t i = 0; i < n; i++) {
		float v = a[i] + b[i];
		dst[i] = v;
		copy[i] = v;
	}
}

/* Non-temporal versions (-t): the stores bypass the writer's cache, so the
 * reader fetches the lines from memory rather than from the other core's
 * cache. n is a multiple of 16 floats and the pointers 32-byte aligned. */
static void copy_nt(void *dst, const void *src, size_t bytes) {
	float *d = dst;
	const float *s = src;
	for (size_t i = 0; i < bytes / 4; i += 8)
		_mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
	_mm_sfence();
}

static void add3copy_nt(float *restrict dst, float *restrict copy, const float *restrict a, const float *restrict b, size_t n) {
	for (size_t i = 0; i < n; i += 8) {
		__m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
		_mm256_storeu_ps(dst + i, v);
		_mm256_stream_ps(copy + i, v);
	}
	_mm_sfence();
}

int main(int argc, char **argv) {
	size_t size = 32u << 20, chunk = 128u << 10;
	int iters = 20, opt, seg = 0, cross = 0, nt = 0, keep = 0, lag = -1, phased = 0;
	size_t ringslots = 32;
	while ((opt = getopt(argc, argv, "s:n:c:m:r:t:kl:")) != -1) {
		switch (opt) {
		case 's': size = strtoull(optarg, NULL, 0); break;
		case 'n': iters = atoi(optarg); break;
		case 'c': chunk = strtoull(optarg, NULL, 0); break;
		case 'r': ringslots = strtoull(optarg, NULL, 0); break;
		case 't': nt = atoi(optarg); break;
		case 'k': keep = 1; break;
		case 'l': lag = atoi(optarg); break;
		case 'm':
			if (strcmp(optarg, "segment") == 0)
				seg = 1;
			else if (strcmp(optarg, "cross") == 0)
				cross = 1;
			else if (strcmp(optarg, "phased") == 0)
				phased = 1;
			else if (strcmp(optarg, "direct") != 0) {
				fprintf(stderr, "pairbound: -m must be direct, phased, segment or cross, not %s\n", optarg);
				return 2;
			}
			break;
		default:
			fprintf(stderr, "usage: %s [-s BYTES] [-n ITERS] [-c CHUNK] [-m direct|phased|segment|cross] [-l LAG] [-r RINGSTEPS] [-t 1|2|3] [-k]\n", argv[0]);
			return 2;
		}
	}
	if (size < 4096 || size % 4096 || chunk < 64 || chunk % 64 || iters < 1 || ringslots < 1) {
		fprintf(stderr, "pairbound: need -s a multiple of 4096, -c a multiple of 64, -n >= 1, -r >= 1\n");
		return 2;
	}
	size_t half = size / 2;
	size_t nchunk = (half + chunk - 1) / chunk;
	/* The segment mode's ring: -r steps of two chunks per direction
	 * (default 32: gorun's 4 MiB ring holds 32 of its 128 KiB frames). */
	if (lag >= 0 && !seg) {
		fprintf(stderr, "pairbound: -l is for -m segment\n");
		return 2;
	}
	if (lag >= 0 && ringslots < 2 * (size_t)lag + 2) {
		fprintf(stderr, "pairbound: -l %d needs -r >= %d\n", lag, 2 * lag + 2);
		return 2;
	}
	if (seg && nchunk < ringslots)
		ringslots = nchunk;
	int cpus[2];
	if (first_two_cpus(cpus) != 0)
		return 1;
	/* Shared: the control lines, then for direct mode each rank's input and
	 * result, for segment mode each rank's ring (two slots per step: its
	 * contribution and its reduced chunk). */
	size_t per = seg ? 2 * ringslots * chunk : 2 * size;
	size_t total = 4096 + 2 * per;
	char *shm = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shm == MAP_FAILED) {
		perror("pairbound: mmap");
		return 1;
	}
	memset(shm, 0, total);
	ctl = (struct ctl *)shm;
	pid_t pid = fork();
	if (pid < 0) {
		perror("pairbound: fork");
		return 1;
	}
	int me = pid == 0 ? 1 : 0, p = 1 - me;
	bind_to(cpus[me]);
	char *in, *res, *pin = NULL, *pres = NULL, *ring = NULL, *pring = NULL;
	if (seg) {
		ring = shm + 4096 + me * per;
		pring = shm + 4096 + p * per;
		if (posix_memalign((void **)&in, 4096, size) || posix_memalign((void **)&res, 4096, size)) {
			fprintf(stderr, "pairbound: cannot allocate 2 x %zu bytes\n", size);
			_exit(1);
		}
	} else { /* direct, phased, cross */
		in = shm + 4096 + me * per;
		res = in + size;
		pin = shm + 4096 + p * per;
		pres = pin + size;
	}
	memset(res, 0, size);
	double *t = malloc(sizeof(double) * (iters + 2));
	uint64_t step = 0, bar = 0;
	/* My half (the one I reduce) is half me; the peer's is half p. */
	size_t mine = me * half, theirs = p * half;
	for (int it = 0; it < iters + 2; it++) {
		float *f = (float *)in;
		int gen = keep ? 0 : it;
		for (size_t i = 0; i < size / 4 && (!keep || it == 0); i++)
			f[i] = (float)(me + 1) * (float)((i + gen) & 1023);
		barrier(me, ++bar);
		double t0 = now();
		uint64_t base = step;
		for (size_t c = 0; c < nchunk && cross; c++)
			memcpy(res + 2 * c * chunk, pin + 2 * c * chunk, half - c * chunk < chunk ? 2 * (half - c * chunk) : 2 * chunk);
		/* Lag: contributions go L chunks ahead of the reduction, and the
		 * peer's reduced chunks are copied out L chunks after it made them,
		 * so that the lines have left the writer's L2 when read. */
		uint64_t cb = (uint64_t)it * nchunk;
		for (size_t c = 0; lag >= 0 && c < nchunk + 2 * (size_t)lag; c++) {
			if (c < nchunk) {
				size_t off = c * chunk, n = half - off < chunk ? half - off : chunk;
				size_t slot = (c % ringslots) * 2 * chunk;
				if (c >= ringslots) /* the peer has reduced from it */
					awaitw(&ctl->lagB[p], cb + c - ringslots + 1);
				if (nt & 1)
					copy_nt(ring + slot, in + theirs + off, n);
				else
					memcpy(ring + slot, in + theirs + off, n);
				__atomic_store_n(&ctl->lagA[me], cb + c + 1, __ATOMIC_RELEASE);
			}
			if (c >= (size_t)lag && c - lag < nchunk) {
				size_t d = c - lag, off = d * chunk, n = half - off < chunk ? half - off : chunk;
				size_t slot = (d % ringslots) * 2 * chunk;
				awaitw(&ctl->lagA[p], cb + d + 1);
				if (d >= ringslots) /* the peer has copied its part B out */
					awaitw(&ctl->lagC[p], cb + d - ringslots + 1);
				(nt & 2 ? add3copy_nt : add3copy)((float *)(res + mine + off), (float *)(ring + slot + chunk),
				                                  (const float *)(in + mine + off), (const float *)(pring + slot), n / 4);
				__atomic_store_n(&ctl->lagB[me], cb + d + 1, __ATOMIC_RELEASE);
			}
			if (c >= 2 * (size_t)lag && c - 2 * lag < nchunk) {
				size_t e = c - 2 * lag, off = e * chunk, n = half - off < chunk ? half - off : chunk;
				size_t slot = (e % ringslots) * 2 * chunk;
				awaitw(&ctl->lagB[p], cb + e + 1);
				memcpy(res + theirs + off, pring + slot + chunk, n);
				__atomic_store_n(&ctl->lagC[me], cb + e + 1, __ATOMIC_RELEASE);
			}
		}
		/* Phased: reduce the whole half, then copy the peer's whole half. */
		for (size_t c = 0; phased && c < nchunk; c++) {
			size_t off = c * chunk, n = half - off < chunk ? half - off : chunk;
			add3((float *)(res + mine + off), (const float *)(in + mine + off), (const float *)(pin + mine + off), n / 4);
		}
		if (phased) {
			post(me, base + 1);
			await(p, base + 1);
			memcpy(res + theirs, pres + theirs, half);
		}
		for (size_t c = 0; c < nchunk && !cross && !phased && lag < 0; c++) {
			size_t off = c * chunk, n = half - off < chunk ? half - off : chunk;
			if (seg) {
				size_t slot = (c % ringslots) * 2 * chunk;
				/* The ring slot is free once the peer has posted step
				 * base+2(c-ringslots)+3: it posts that after copying my
				 * reduced chunk of c-ringslots out. */
				if (c >= ringslots)
					await(p, base + 2 * (c - ringslots) + 3);
				if (nt & 1)
					copy_nt(ring + slot, in + theirs + off, n);
				else
					memcpy(ring + slot, in + theirs + off, n);
				post(me, base + 2 * c + 1);
				await(p, base + 2 * c + 1);
				(nt & 2 ? add3copy_nt : add3copy)((float *)(res + mine + off), (float *)(ring + slot + chunk), (const float *)(in + mine + off),
				         (const float *)(pring + slot), n / 4);
				post(me, base + 2 * c + 2);
				await(p, base + 2 * c + 2);
				memcpy(res + theirs + off, pring + slot + chunk, n);
			} else {
				add3((float *)(res + mine + off), (const float *)(in + mine + off), (const float *)(pin + mine + off), n / 4);
				post(me, base + c + 1);
				await(p, base + c + 1);
				memcpy(res + theirs + off, pres + theirs + off, n);
			}
		}
		step = base + (cross || lag >= 0 ? 0 : phased ? 1 : seg ? 2 * nchunk : nchunk);
		t[it] = now() - t0;
		/* The peer must be done reading my buffers before I rewrite them. */
		barrier(me, ++bar);
		/* Every element, untimed: the peer's input, or the sum. */
		float m = cross ? (float)(p + 1) : 3.0f;
		const float *r = (const float *)res;
		for (size_t i = 0; i < size / 4; i++)
			if (r[i] != m * (float)((i + gen) & 1023)) {
				fprintf(stderr, "pairbound: rank %d call %d: element %zu is %g, want %g\n", me, it, i, r[i], m * (float)((i + gen) & 1023));
				ctl->failed = 1;
				_exit(1);
			}
	}
	qsort(t + 2, iters, sizeof(double), cmp);
	ctl->out[me] = t[2 + iters / 2];
	if (me == 1)
		_exit(0);
	int status;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "pairbound: rank 1 failed\n");
		return 1;
	}
	double slow = ctl->out[0] > ctl->out[1] ? ctl->out[0] : ctl->out[1];
	printf("%zu %s %zu %.1f %.3f\n", size, lag >= 0 ? "lag" : seg ? "segment" : cross ? "cross" : phased ? "phased" : "direct", chunk, slow * 1e6, size / slow / 1e9);
	return 0;
}
