/*
 * allreduce.c: the Open MPI side of scripts/bench-compare.sh.
 *
 * Times MPI_Allreduce of float sums over the same sweep as
 * `gorun bench allreduce` and prints the nccl-tests table, so that
 * `gorun bench report` reads it next to gorun's and gloo's results:
 * time is the maximum over ranks of the mean per iteration, algbw =
 * bytes / time, busbw = algbw * 2(n-1)/n, #wrong counts elements that
 * differ from the exact sum (the inputs are small integers, so every sum
 * is exact in float).
 *
 * usage: mpirun -np N ./allreduce [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]
 *                                  [-w WARMUP] [-c 0|1]
 * Sizes take K, M, G suffixes (powers of 1024).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long long parse_size(const char *s) {
	char *end;
	long long v = strtoll(s, &end, 10);
	switch (*end) {
	case 'K': case 'k': v <<= 10; break;
	case 'M': case 'm': v <<= 20; break;
	case 'G': case 'g': v <<= 30; break;
	}
	return v;
}

/* The value rank r contributes at index i: an integer in [-4, 4]. */
static float value(int r, long long i) { return (float)((i * 7 + r * 13) % 9 - 4); }

static void fill(float *buf, long long count, int rank) {
	for (long long i = 0; i < count; i++)
		buf[i] = value(rank, i);
}

static long long wrong(const float *buf, long long count, int nranks) {
	long long w = 0;
	for (long long i = 0; i < count; i++) {
		float want = 0;
		for (int r = 0; r < nranks; r++)
			want += value(r, i);
		if (buf[i] != want)
			w++;
	}
	return w;
}

/* Mean seconds per call over iters calls, after warmup calls and a barrier. */
static double timed(float *send, float *recv, long long count, int warmup, int iters) {
	const void *s = send ? (const void *)send : MPI_IN_PLACE;
	for (int i = 0; i < warmup; i++)
		MPI_Allreduce(s, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++)
		MPI_Allreduce(s, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	return (MPI_Wtime() - t0) / iters;
}

static void print_time(double us) {
	if (us >= 10000) printf("  %7.0f", us);
	else if (us >= 100) printf("  %7.1f", us);
	else printf("  %7.2f", us);
}

int main(int argc, char **argv) {
	long long minb = 8, maxb = 64LL << 20, factor = 2;
	int iters = 20, warmup = 5, check = 1, opt;
	MPI_Init(&argc, &argv);
	while ((opt = getopt(argc, argv, "b:e:f:n:w:c:")) != -1) {
		switch (opt) {
		case 'b': minb = parse_size(optarg); break;
		case 'e': maxb = parse_size(optarg); break;
		case 'f': factor = atoll(optarg); break;
		case 'n': iters = atoi(optarg); break;
		case 'w': warmup = atoi(optarg); break;
		case 'c': check = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n", argv[0]);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	if (factor < 2 || minb < 4 || maxb < minb || iters < 1) {
		fprintf(stderr, "allreduce: need -b >= 4, -e >= -b, -f >= 2, -n >= 1\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int rank, n;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);

	char host[256], lib[MPI_MAX_LIBRARY_VERSION_STRING];
	int liblen;
	gethostname(host, sizeof host);
	host[sizeof host - 1] = 0;
	MPI_Get_library_version(lib, &liblen);
	char *nl = strchr(lib, '\n');
	if (nl) *nl = 0;
	char *hosts = malloc((size_t)n * 256);
	int *pids = malloc((size_t)n * sizeof(int));
	int pid = (int)getpid();
	MPI_Gather(host, 256, MPI_CHAR, hosts, 256, MPI_CHAR, 0, MPI_COMM_WORLD);
	MPI_Gather(&pid, 1, MPI_INT, pids, 1, MPI_INT, 0, MPI_COMM_WORLD);

	if (rank == 0) {
		printf("# Open MPI allreduce, nccl-tests layout (%s)\n", lib);
		printf("# nRanks %d minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %d iters: %d validation: %d\n",
		       n, minb, maxb, factor, warmup, iters, check);
		printf("#\n# Using ranks\n");
		for (int r = 0; r < n; r++)
			printf("#  Rank %2d Pid %6d on %10s\n", r, pids[r], hosts + (size_t)r * 256);
		printf("#\n");
		printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
		       "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
		       "time", "algbw", "busbw", "#wrong");
		printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
		       "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
	}
	float *send = malloc((size_t)maxb), *recv = malloc((size_t)maxb);
	memset(send, 0, (size_t)maxb);
	memset(recv, 0, (size_t)maxb);
	double bwsum = 0;
	int bwcount = 0;
	long long allwrong = 0;
	for (long long size = minb; size <= maxb; size *= factor) {
		long long count = size / 4;
		double t[2];
		long long w[2] = {0, 0};
		t[0] = timed(send, recv, count, warmup, iters);
		if (check) {
			fill(send, count, rank);
			MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			w[0] = wrong(recv, count, n);
		}
		t[1] = timed(NULL, recv, count, warmup, iters);
		if (check) {
			fill(recv, count, rank);
			MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			w[1] = wrong(recv, count, n);
		}
		MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		MPI_Allreduce(MPI_IN_PLACE, w, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("%12lld  %12lld  %8s  %6s  %6d", count * 4, count, "float", "sum", -1);
			for (int p = 0; p < 2; p++) {
				double alg = (double)(count * 4) / t[p] / 1e9, bus = alg * 2.0 * (n - 1) / n;
				print_time(t[p] * 1e6);
				printf("  %6.2f  %6.2f", alg, bus);
				if (check) printf("  %6lld", w[p]);
				else printf("  %6s", "N/A");
				bwsum += bus;
				bwcount++;
				allwrong += w[p];
			}
			printf("\n");
			fflush(stdout);
		}
	}
	if (rank == 0) {
		printf("# Out of bounds values : %lld %s\n", allwrong, allwrong ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %g \n#\n", bwcount ? bwsum / bwcount : 0.0);
	}
	free(send);
	free(recv);
	free(hosts);
	free(pids);
	MPI_Finalize();
	return allwrong ? 1 : 0;
}
