/* mpiprog: the MPI program the gorun MPI tests run, built with MPICH's
 * mpicc by the tests. argv[1] picks what it does:
 *
 *   check         rank/size, Allreduce, Bcast, Comm_split, a point-to-point
 *                 ring, and the size of the rank's node (MPI_COMM_TYPE_SHARED,
 *                 which MPICH derives from PMI_process_mapping); prints one
 *                 "ok ..." line per check with the values it saw, or
 *                 "FAIL ..." and exits 2 on a wrong value
 *   barrier       MPI_Init, one MPI_Barrier, MPI_Finalize (the benchmark)
 *   abort R C     rank R calls MPI_Abort(MPI_COMM_WORLD, C); the others wait
 *                 in MPI_Barrier
 *   init-stall R  rank R enters MPI_Init at once, the others sleep 60 s
 *                 first, so R waits inside MPI_Init (in its PMI barrier)
 *   init-late R   rank R sleeps 60 s before MPI_Init, so the others wait
 *                 inside MPI_Init for it
 *                 (both print "rank N pid P entering MPI_Init" or "rank N
 *                 pid P sleeping" first)
 *   collective R  every rank inits and runs one MPI_Allreduce; then rank R
 *                 prints "pid P in collective" (every rank is past
 *                 MPI_Init by then); all loop over MPI_Allreduce for 60 s
 *   no-finalize R rank R returns 0 right after MPI_Init without
 *                 MPI_Finalize; the others wait in MPI_Barrier
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(cond, ...)                     \
    do {                                     \
        if (!(cond)) {                       \
            printf("FAIL " __VA_ARGS__);     \
            printf("\n");                    \
            fflush(stdout);                  \
            MPI_Abort(MPI_COMM_WORLD, 2);    \
        }                                    \
    } while (0)

static int check(void) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char host[256];
    gethostname(host, sizeof host);
    printf("ok world rank=%d size=%d host=%s\n", rank, size, host);

    long sum = 0, mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum == (long)size * (size + 1) / 2, "allreduce rank=%d sum=%ld", rank, sum);
    printf("ok allreduce rank=%d sum=%ld\n", rank, sum);

    int val = rank == size - 1 ? 4242 + size : -1;
    MPI_Bcast(&val, 1, MPI_INT, size - 1, MPI_COMM_WORLD);
    CHECK(val == 4242 + size, "bcast rank=%d val=%d", rank, val);
    printf("ok bcast rank=%d val=%d\n", rank, val);

    /* Split by parity; key -rank reverses the order inside each half. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
    int hrank, hsize, hsum = 0;
    MPI_Comm_rank(half, &hrank);
    MPI_Comm_size(half, &hsize);
    MPI_Allreduce(&rank, &hsum, 1, MPI_INT, MPI_SUM, half);
    int want = 0, n = 0;
    for (int r = rank % 2; r < size; r += 2) {
        want += r;
        n++;
    }
    CHECK(hsize == n && hsum == want, "split rank=%d hsize=%d hsum=%d", rank, hsize, hsum);
    printf("ok split rank=%d color=%d hrank=%d hsize=%d hsum=%d\n", rank, rank % 2, hrank, hsize, hsum);
    MPI_Comm_free(&half);

    /* The ranks MPICH believes share this rank's node. */
    MPI_Comm node;
    int nsize;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &nsize);
    printf("ok node rank=%d nodesize=%d\n", rank, nsize);
    MPI_Comm_free(&node);

    /* Ring: a token starts at 0 and every rank adds its rank + 1. */
    int token = 0;
    if (size > 1) {
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        if (rank == 0) {
            token = 1;
            MPI_Send(&token, 1, MPI_INT, next, 7, MPI_COMM_WORLD);
            MPI_Recv(&token, 1, MPI_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&token, 1, MPI_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            token += rank + 1;
            MPI_Send(&token, 1, MPI_INT, next, 7, MPI_COMM_WORLD);
        }
    } else {
        token = 1;
    }
    if (rank == 0) {
        CHECK(token == size * (size + 1) / 2, "ring token=%d", token);
        printf("ok ring rank=0 token=%d\n", token);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "check";
    int target = argc > 2 ? atoi(argv[2]) : 0;
    int rank = -1, size;
    const char *env = getenv("RANK");
    int envrank = env ? atoi(env) : -1;

    setvbuf(stdout, NULL, _IOLBF, 0);
    int stall = !strcmp(mode, "init-stall"), late = !strcmp(mode, "init-late");
    if (stall || late) {
        if ((stall && envrank != target) || (late && envrank == target)) {
            printf("rank %d pid %d sleeping\n", envrank, (int)getpid());
            sleep(60);
        }
        printf("rank %d pid %d entering MPI_Init\n", envrank, (int)getpid());
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    if (!strcmp(mode, "check")) {
        check();
    } else if (!strcmp(mode, "barrier")) {
        MPI_Barrier(MPI_COMM_WORLD);
    } else if (!strcmp(mode, "abort")) {
        if (rank == target) {
            MPI_Abort(MPI_COMM_WORLD, argc > 3 ? atoi(argv[3]) : 1);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    } else if (!strcmp(mode, "collective")) {
        double end = now() + 60;
        long x = 1, y;
        /* The first all-reduce returns only once every rank is past
         * MPI_Init: a kill after the line below finds all of them in the
         * loop, none still inside MPI_Init (where losing a peer fails
         * that rank's own init, a second failure of its own). */
        MPI_Allreduce(&x, &y, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (rank == target) {
            printf("pid %d in collective\n", (int)getpid());
        }
        while (now() < end) {
            MPI_Allreduce(&x, &y, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
    } else if (!strcmp(mode, "no-finalize")) {
        if (rank == target) {
            return 0;
        }
        MPI_Barrier(MPI_COMM_WORLD);
    } else if (stall || late) {
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        fprintf(stderr, "mpiprog: unknown mode %s\n", mode);
        MPI_Abort(MPI_COMM_WORLD, 64);
    }
    MPI_Finalize();
    return 0;
}
