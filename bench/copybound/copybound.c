/*
 * copybound.c: the memory-copy rate of this host's cores when they all copy
 * at once, the anchor of scripts/bench-latency.sh for large all-reduces
 * (the goal: >= 32 MiB at >= 90% of the two-core memory-copy bound).
 *
 * Starts -p processes (default 2), process i bound to the i-th CPU this
 * process may run on, as `gorun --bind-to auto` and mpirun bind 2 ranks.
 * Each allocates two buffers of -s bytes, touches them, copies one into the
 * other twice to warm up, waits until every process is ready, then times
 * -n copies (memcpy, one at a time). It prints one line:
 *
 *   size  median-GB/s-per-process  slowest  fastest
 *
 * where a process's rate is -s bytes over the median time of its copies
 * (GB = 1e9 bytes; a copy of S bytes reads S and writes S) and the three
 * figures are the median, slowest and fastest process. The processes copy
 * at the same time, so the rate is what each core gets while the other
 * cores copy too, which is the situation of the ranks of an all-reduce.
 *
 * usage: copybound [-s BYTES] [-n ITERS] [-p PROCS]
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_NAME "copybound"
#include "probe.h"

/* child copies and writes its median rate (GB/s) to out. */
static void child(int cpu, size_t size, int iters, int ready, int go, int out) {
	bind_to(cpu);
	char *a, *b;
	if (posix_memalign((void **)&a, 4096, size) || posix_memalign((void **)&b, 4096, size)) {
		fprintf(stderr, "copybound: cannot allocate 2 x %zu bytes\n", size);
		_exit(1);
	}
	memset(a, 1, size);
	memset(b, 2, size);
	for (int i = 0; i < 2; i++)
		memcpy(b, a, size);
	double *t = malloc(sizeof(double) * iters);
	char c = 'r';
	if (!t || write(ready, &c, 1) != 1 || read(go, &c, 1) != 1)
		_exit(1);
	for (int i = 0; i < iters; i++) {
		double t0 = now();
		memcpy(b, a, size);
		/* Keep the compiler from dropping or merging copies. */
		__asm__ volatile("" : : "r"(b) : "memory");
		t[i] = now() - t0;
	}
	qsort(t, iters, sizeof(double), cmp);
	double rate = size / t[iters / 2] / 1e9;
	if (write(out, &rate, sizeof rate) != sizeof rate)
		_exit(1);
	_exit(0);
}

int main(int argc, char **argv) {
	size_t size = 32u << 20;
	int iters = 20, procs = 2, opt;
	while ((opt = getopt(argc, argv, "s:n:p:")) != -1) {
		switch (opt) {
		case 's': size = strtoull(optarg, NULL, 0); break;
		case 'n': iters = atoi(optarg); break;
		case 'p': procs = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-s BYTES] [-n ITERS] [-p PROCS]\n", argv[0]);
			return 2;
		}
	}
	if (size < 64 || iters < 1 || procs < 1 || procs > 1024) {
		fprintf(stderr, "copybound: need -s >= 64, -n >= 1, 1 <= -p <= 1024\n");
		return 2;
	}
	cpu_set_t allowed;
	int cpus[1024], ncpu = 0;
	if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
		perror("copybound: sched_getaffinity");
		return 1;
	}
	for (int c = 0; c < CPU_SETSIZE && ncpu < 1024; c++)
		if (CPU_ISSET(c, &allowed))
			cpus[ncpu++] = c;
	int ready[2], go[2], out[2];
	if (pipe(ready) || pipe(go) || pipe(out)) {
		perror("copybound: pipe");
		return 1;
	}
	for (int i = 0; i < procs; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("copybound: fork");
			return 1;
		}
		if (pid == 0)
			child(cpus[i % ncpu], size, iters, ready[1], go[0], out[1]);
	}
	char c;
	for (int i = 0; i < procs; i++)
		if (read(ready[0], &c, 1) != 1)
			return 1;
	for (int i = 0; i < procs; i++)
		if (write(go[1], "g", 1) != 1)
			return 1;
	double rates[1024];
	int got = 0;
	for (; got < procs; got++)
		if (read(out[0], &rates[got], sizeof(double)) != sizeof(double))
			break;
	int status, failed = 0;
	while (wait(&status) > 0)
		failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
	if (failed || got < procs) {
		fprintf(stderr, "copybound: a copying process failed\n");
		return 1;
	}
	qsort(rates, procs, sizeof(double), cmp);
	printf("%zu %.3f %.3f %.3f\n", size, rates[(procs - 1) / 2], rates[0], rates[procs - 1]);
	return 0;
}
