/*
 * placewatch.c: where the VM keeps its two CPUs while a benchmark runs, for
 * scripts/bench-torch.sh.
 *
 * corelat measures the cache line's round trip once, on an idle host. The
 * placement during a run can differ: on the 2-core reference VM, with four
 * ranks keeping both vCPUs busy, the round trip flips between about 50 and
 * about 300 ns every few seconds, whatever corelat said just before
 * (notes/torch-backend.md). So this runs beside the benchmark:
 * every -i milliseconds (default 250) two threads, bound to the first two
 * CPUs this process may run on, pass a counter back and forth in batches of
 * 16 round trips for at most 1 ms, and the shortest batch is the round trip
 * of that probe (a batch during which either thread lost its CPU only takes
 * longer; a probe whose threads never ran together counts as none). On
 * SIGTERM or SIGINT it prints one line and exits:
 *
 *   probes N  far F  median-ns M
 *
 * with far the probes at or above -f nanoseconds (default 200, between the
 * two placements). Each probe costs the benchmark up to 1 ms of both CPUs.
 *
 * usage: placewatch [-i MS] [-f NS]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PROBE_NAME "placewatch"
#include "probe.h"

enum { BATCH = 16, BATCHES = 32, MAXPROBES = 1 << 16 };
static const double BUDGET = 1e-3;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

struct probe {
	_Alignas(128) atomic_long ping;
	_Alignas(128) atomic_int done;
	atomic_int ready;
	double best; /* seconds per round trip; < 0 if no batch finished */
};

static void *partner(void *arg) {
	struct probe *p = arg;
	atomic_store(&p->ready, 1);
	for (long want = 1;; want += 2) {
		while (atomic_load_explicit(&p->ping, memory_order_acquire) != want)
			if (atomic_load_explicit(&p->done, memory_order_relaxed))
				return NULL;
		atomic_store_explicit(&p->ping, want + 1, memory_order_release);
	}
}

/* measure runs one probe on the calling thread (bound to cpus[0]) against a
 * partner thread on cpus[1]. */
static double measure(const int cpus[2]) {
	struct probe p = {.best = -1};
	pthread_t t;
	pthread_attr_t attr;
	cpu_set_t set;
	/* Bound from its start: created on our CPU, the partner could not
	 * move away while we spin there. */
	CPU_ZERO(&set);
	CPU_SET(cpus[1], &set);
	pthread_attr_init(&attr);
	int err = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
	if (err == 0)
		err = pthread_create(&t, &attr, partner, &p);
	pthread_attr_destroy(&attr);
	if (err != 0) {
		fprintf(stderr, PROBE_NAME ": partner thread on CPU %d: error %d\n", cpus[1], err);
		return -1;
	}
	double deadline = now() + BUDGET;
	long count = 0;
	while (!atomic_load(&p.ready) && now() < deadline)
		;
	for (int b = 0; b < BATCHES && atomic_load(&p.ready) && now() < deadline; b++) {
		double t0 = now();
		int i;
		for (i = 0; i < BATCH; i++) {
			atomic_store_explicit(&p.ping, ++count, memory_order_release);
			++count;
			while (atomic_load_explicit(&p.ping, memory_order_acquire) != count && now() < deadline)
				;
			if (atomic_load(&p.ping) != count)
				break;
		}
		if (i < BATCH)
			break;
		double d = (now() - t0) / BATCH;
		if (p.best < 0 || d < p.best)
			p.best = d;
	}
	atomic_store(&p.done, 1);
	pthread_join(t, NULL);
	return p.best;
}

int main(int argc, char **argv) {
	long every_ms = 250;
	double far_ns = 200;
	int opt;
	while ((opt = getopt(argc, argv, "i:f:")) != -1) {
		if (opt == 'i' && (every_ms = atol(optarg)) > 0)
			continue;
		if (opt == 'f' && (far_ns = atof(optarg)) > 0)
			continue;
		fprintf(stderr, "usage: placewatch [-i MS] [-f NS]\n");
		return 2;
	}
	int cpus[2];
	if (first_two_cpus(cpus) != 0)
		return 1;
	bind_to(cpus[0]);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	static double rtt[MAXPROBES];
	int n = 0, far = 0;
	while (!stop) {
		double r = measure(cpus);
		if (r >= 0 && n < MAXPROBES) {
			rtt[n++] = r * 1e9;
			far += r * 1e9 >= far_ns;
		}
		struct timespec ts = {every_ms / 1000, every_ms % 1000 * 1000000L};
		nanosleep(&ts, NULL); /* a signal ends it early */
	}
	qsort(rtt, n, sizeof rtt[0], cmp);
	printf("probes %d  far %d  median-ns %.0f\n", n, far, n ? rtt[n / 2] : -1.0);
	return 0;
}
