/*
 * corelat.c: how far apart two CPUs of this host are, as a cache line sees
 * it, for scripts/bench-latency.sh.
 *
 * Two processes, bound to the first two CPUs this process may run on, pass
 * a counter back and forth through one shared cache line (-n round trips,
 * default 200000), then one writes a 1 MiB buffer and the other reads it
 * (20 times). It prints one line:
 *
 *   round-trip-ns  read-GB/s
 *
 * On the 2-core reference VM the round trip alternates, from one minute to
 * the next, between about 100-170 ns and 400-600 ns: the hypervisor places
 * the two virtual CPUs on nearby or distant physical cores. Every
 * algorithm that moves freshly written bytes between the ranks follows
 * it: gorun's 2-rank 1 MiB all-reduce took 60-70 us in the first placement
 * and 200-250 us in the second (notes/shm-latency.md, "The 3x swing is the VM's CPU placement"), so
 * bench-latency prints it with each round.
 *
 * usage: corelat [-n ROUNDTRIPS]
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_NAME "corelat"
#include "probe.h"

enum { BUF = 1 << 20, READS = 20 };

int main(int argc, char **argv) {
	long n = 200000;
	int opt;
	while ((opt = getopt(argc, argv, "n:")) != -1) {
		if (opt != 'n' || (n = atol(optarg)) <= 0) {
			fprintf(stderr, "usage: corelat [-n ROUNDTRIPS]\n");
			return 2;
		}
	}
	int cpus[2];
	if (first_two_cpus(cpus) != 0)
		return 1;
	/* Line 0: the ping-pong counter; line 2: the buffer hand-over; the
	 * buffer starts on its own page. */
	char *shm = mmap(NULL, 4096 + BUF, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shm == MAP_FAILED) {
		perror("corelat: mmap");
		return 1;
	}
	volatile long *ping = (volatile long *)shm, *hand = (volatile long *)(shm + 128);
	char *buf = shm + 4096;
	memset(buf, 0, BUF);
	pid_t pid = fork();
	if (pid < 0) {
		perror("corelat: fork");
		return 1;
	}
	if (pid == 0) {
		bind_to(cpus[1]);
		for (long i = 0; i < n; i++) {
			while (*ping != 2 * i + 1)
				;
			*ping = 2 * i + 2;
		}
		for (long r = 0; r < READS; r++) {
			while (*hand != 2 * r + 1)
				;
			volatile long sum = 0;
			for (size_t o = 0; o < BUF; o += 64)
				sum += buf[o];
			*hand = 2 * r + 2;
		}
		_exit(0);
	}
	bind_to(cpus[0]);
	double t0 = now();
	for (long i = 0; i < n; i++) {
		*ping = 2 * i + 1;
		while (*ping != 2 * i + 2)
			;
	}
	double rtt = (now() - t0) / n;
	double read = 0;
	for (long r = 0; r < READS; r++) {
		memset(buf, (int)r + 1, BUF);
		double a = now();
		*hand = 2 * r + 1;
		while (*hand != 2 * r + 2)
			;
		read += now() - a;
	}
	waitpid(pid, NULL, 0);
	printf("%.0f %.1f\n", rtt * 1e9, (double)BUF * READS / read / 1e9);
	return 0;
}
