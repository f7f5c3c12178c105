/*
 * probe.h: the timing and placement helpers shared by the copy-bound
 * probes (copybound.c, corelat.c, pairbound.c), which scripts/bench-latency.sh
 * builds as standalone programs. Each probe defines PROBE_NAME, the prefix
 * of its messages, before including this file.
 */
#ifndef PROBE_H
#define PROBE_H

#include <sched.h>
#include <stdio.h>
#include <time.h>

/* now is the monotonic clock in seconds. */
static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* cmp orders doubles, for qsort. */
static inline int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* bind_to binds the calling process to cpu, or says why it runs unbound. */
static inline void bind_to(int cpu) {
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set) != 0)
		perror(PROBE_NAME ": sched_setaffinity (running unbound)");
}

/* first_two_cpus stores the first two CPUs this process may run on in
 * cpus and returns 0, or says why not and returns 1. */
static inline int first_two_cpus(int cpus[2]) {
	cpu_set_t allowed;
	int k = 0;
	if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
		perror(PROBE_NAME ": sched_getaffinity");
		return 1;
	}
	for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
		if (CPU_ISSET(c, &allowed))
			cpus[k++] = c;
	if (k < 2) {
		fprintf(stderr, PROBE_NAME ": needs two CPUs\n");
		return 1;
	}
	return 0;
}

#endif
