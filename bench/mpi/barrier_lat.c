/*
 * barrier_lat.c: the Open MPI side of scripts/bench-latency.sh for
 * barriers. Times MPI_Barrier (mean over -n calls after -w warm-up calls,
 * maximum over ranks) and prints one row in the layout of
 * `gorun bench barrier`: size 0, count 0, time in the out-of-place column.
 *
 * usage: mpirun -np N ./barrier_lat [-n ITERS] [-w WARMUP]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
	int iters = 1000, warmup = 100, opt, rank;
	MPI_Init(&argc, &argv);
	while ((opt = getopt(argc, argv, "n:w:")) != -1) {
		switch (opt) {
		case 'n': iters = atoi(optarg); break;
		case 'w': warmup = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-n ITERS] [-w WARMUP]\n", argv[0]);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	if (iters < 1 || warmup < 0) {
		fprintf(stderr, "barrier_lat: need -n >= 1, -w >= 0\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	for (int i = 0; i < warmup; i++)
		MPI_Barrier(MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++)
		MPI_Barrier(MPI_COMM_WORLD);
	double t = (MPI_Wtime() - t0) / iters;
	MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("# Open MPI barrier, %d iterations\n", iters);
		printf("%12d  %12d  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6s\n", 0, 0, "none", "none", -1, t * 1e6, 0.0, 0.0, "N/A");
	}
	MPI_Finalize();
	return 0;
}
