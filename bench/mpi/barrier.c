/* The MPI side of the formation benchmark (scripts/bench-rdzv.sh): what
 * examples/rdzvbarrier does with gorun — start, form the world, one
 * barrier, leave — as MPI_Init + MPI_Barrier + MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
	int rank, size;
	if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
		fprintf(stderr, "mpibarrier: MPI_Init failed\n");
		return 1;
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) {
		fprintf(stderr, "mpibarrier: rank %d: MPI_Barrier failed\n", rank);
		return 1;
	}
	MPI_Finalize();
	return 0;
}
