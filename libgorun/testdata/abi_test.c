/*
 * A rank program that checks libgorun's C ABI from C. Run it under gorun:
 *   gorun -np N ./abi_test [MODE]
 * MODE "all" (default): every collective against values each rank can
 * compute alone, async requests, subgroups, bad arguments. MODE "kill": the
 * last rank dies in the middle; the others print the error they get and
 * exit 0 once they got one naming it. MODE "desync": rank 0 calls a
 * different collective; every rank prints its error. MODE "steps": 200
 * all-reduces 20 ms apart, each reported with gorun_report_step and printed
 * as "abi_test rank R: step N" (gorun's --inject ...:after-steps=N fires
 * on the reports).
 * Prints "abi_test rank R: ok" on success; any failure prints "FAIL ..." and
 * exits 1.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gorun.h"

static int rank = -1, size = -1;

#define CHECK(call)                                                                        \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != GORUN_OK) {                                                             \
            fprintf(stderr, "FAIL rank %d line %d: %s = %s: %s\n", rank, __LINE__, #call,  \
                    gorun_status_name(rc_), gorun_last_error());                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL rank %d line %d: %s: ", rank, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void check_collectives(gorun_comm_t w) {
    enum { N = 1000 };
    /* all-reduce, every op on float32 and int64, blocking */
    float f[N], fo[N];
    int64_t l[N], lo[N];
    for (int i = 0; i < N; i++) {
        f[i] = (float)(rank + 1) * (i % 7);
        l[i] = (int64_t)(rank + 1) * i;
    }
    CHECK(gorun_allreduce(w, f, fo, N, GORUN_FLOAT32, GORUN_SUM, NULL));
    CHECK(gorun_allreduce(w, l, lo, N, GORUN_INT64, GORUN_MAX, NULL));
    for (int i = 0; i < N; i++) {
        float want = (float)(size * (size + 1) / 2) * (i % 7);
        EXPECT(fo[i] == want, "allreduce sum [%d] = %g, want %g", i, fo[i], want);
        EXPECT(lo[i] == (int64_t)size * i, "allreduce max [%d] = %lld", i, (long long)lo[i]);
    }
    /* in place, prod on float64 */
    double d[N];
    for (int i = 0; i < N; i++) d[i] = 2.0;
    CHECK(gorun_allreduce(w, d, d, N, GORUN_FLOAT64, GORUN_PROD, NULL));
    EXPECT(d[N - 1] == (double)(1 << size), "allreduce prod = %g", d[N - 1]);

    /* bool: sum is "or", prod is "and" */
    uint8_t b[4] = {rank == 0, 1, 0, rank == size - 1}, bo[4];
    CHECK(gorun_allreduce(w, b, bo, 4, GORUN_BOOL, GORUN_SUM, NULL));
    EXPECT(bo[0] == 1 && bo[1] == 1 && bo[2] == 0 && bo[3] == 1, "bool or %d%d%d%d", bo[0], bo[1], bo[2], bo[3]);
    CHECK(gorun_allreduce(w, b, bo, 4, GORUN_BOOL, GORUN_PROD, NULL));
    EXPECT(bo[0] == (size == 1) && bo[1] == 1 && bo[2] == 0, "bool and %d%d%d", bo[0], bo[1], bo[2]);

    /* all-gather */
    int32_t mine[3] = {rank, rank * 10, rank * 100}, all[3 * 64];
    CHECK(gorun_allgather(w, mine, all, 3, GORUN_INT32, NULL));
    for (int r = 0; r < size; r++)
        EXPECT(all[3 * r] == r && all[3 * r + 2] == r * 100, "allgather block %d = %d", r, all[3 * r]);

    /* reduce-scatter: block r of everyone's send is r+1 */
    float rs_send[2 * 64], rs_recv[2];
    for (int r = 0; r < size; r++) rs_send[2 * r] = rs_send[2 * r + 1] = (float)(r + 1);
    CHECK(gorun_reduce_scatter(w, rs_send, rs_recv, 2, GORUN_FLOAT32, GORUN_SUM, NULL));
    EXPECT(rs_recv[0] == (float)(size * (rank + 1)), "reduce_scatter = %g", rs_recv[0]);

    /* broadcast from the last rank; non-roots pass no send buffer */
    int64_t bc[5] = {0};
    int root = size - 1;
    if (rank == root)
        for (int i = 0; i < 5; i++) bc[i] = 42 + i;
    CHECK(gorun_broadcast(w, rank == root ? bc : NULL, bc, 5, GORUN_INT64, root, NULL));
    EXPECT(bc[4] == 46, "broadcast = %lld", (long long)bc[4]);

    /* reduce to 0, min */
    int32_t rv = 7 - rank, ro = -1;
    CHECK(gorun_reduce(w, &rv, rank == 0 ? &ro : NULL, 1, GORUN_INT32, GORUN_MIN, 0, NULL));
    if (rank == 0) EXPECT(ro == 7 - (size - 1), "reduce min = %d", ro);

    /* gather to root, scatter from root */
    double g[64];
    double gv = rank + 0.5;
    CHECK(gorun_gather(w, &gv, rank == root ? g : NULL, 1, GORUN_FLOAT64, root, NULL));
    if (rank == root)
        for (int r = 0; r < size; r++) EXPECT(g[r] == r + 0.5, "gather[%d] = %g", r, g[r]);
    int32_t sc[2 * 64], so[2];
    for (int r = 0; r < size; r++) sc[2 * r] = sc[2 * r + 1] = 1000 + r;
    CHECK(gorun_scatter(w, rank == 0 ? sc : NULL, so, 2, GORUN_INT32, 0, NULL));
    EXPECT(so[0] == 1000 + rank && so[1] == 1000 + rank, "scatter = %d", so[0]);

    /* all-to-all: block p of send = 100*rank + p */
    int32_t a2a[64], a2o[64];
    for (int p = 0; p < size; p++) a2a[p] = 100 * rank + p;
    CHECK(gorun_alltoall(w, a2a, a2o, size, GORUN_INT32, NULL));
    for (int p = 0; p < size; p++) EXPECT(a2o[p] == 100 * p + rank, "alltoall[%d] = %d", p, a2o[p]);

    /* all-to-all-v: rank r sends p+1 elements to p (value r) */
    size_t scount[64], rcount[64];
    int32_t vs[64 * 64], vr[64 * 64];
    size_t ns = 0, nr = 0;
    for (int p = 0; p < size; p++) {
        scount[p] = p + 1;
        rcount[p] = rank + 1;
        for (int k = 0; k <= p; k++) vs[ns++] = rank;
        nr += rank + 1;
    }
    CHECK(gorun_alltoallv(w, vs, scount, vr, rcount, GORUN_INT32, NULL));
    for (size_t k = 0, p = 0; p < (size_t)size; p++)
        for (int j = 0; j <= rank; j++, k++) EXPECT(vr[k] == (int32_t)p, "alltoallv[%zu] = %d", k, vr[k]);
    (void)nr;

    /* send/recv around a pair: even ranks send first */
    if (size >= 2 && !(size % 2 == 1 && rank == size - 1)) {
        int peer = rank ^ 1;
        float out = rank * 3.0f, in = -1;
        if (rank % 2 == 0) {
            CHECK(gorun_send(w, &out, 1, GORUN_FLOAT32, peer, NULL));
            CHECK(gorun_recv(w, &in, 1, GORUN_FLOAT32, peer, NULL));
        } else {
            CHECK(gorun_recv(w, &in, 1, GORUN_FLOAT32, peer, NULL));
            CHECK(gorun_send(w, &out, 1, GORUN_FLOAT32, peer, NULL));
        }
        EXPECT(in == peer * 3.0f, "recv = %g", in);
    }
    CHECK(gorun_barrier(w, NULL));
}

static void check_async(gorun_comm_t w) {
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = 1.0f;
    gorun_request_t r1, r2;
    CHECK(gorun_allreduce(w, x, x, N, GORUN_FLOAT32, GORUN_SUM, &r1));
    CHECK(gorun_barrier(w, &r2));
    int done = 0;
    while (!done) CHECK(gorun_test(r2, &done)); /* in order: r2 done means r1 done */
    CHECK(gorun_test(r1, &done));
    EXPECT(done == 1, "r1 not done after r2");
    CHECK(gorun_wait(r1, -1));
    CHECK(gorun_wait(r1, 0)); /* waiting twice is allowed */
    EXPECT(x[N - 1] == (float)size, "async allreduce = %g", x[N - 1]);
    CHECK(gorun_request_free(r1));
    CHECK(gorun_request_free(r2));
    EXPECT(gorun_wait(r1, 0) == GORUN_ERR_INVALID, "freed request accepted");
    EXPECT(strstr(gorun_last_error(), "no request") != NULL, "text: %s", gorun_last_error());

    /* wait with a timeout on a call a peer issues late */
    if (size >= 2) {
        float v = rank;
        gorun_request_t r;
        if (rank == 1) usleep(300 * 1000);
        CHECK(gorun_allreduce(w, &v, &v, 1, GORUN_FLOAT32, GORUN_SUM, &r));
        if (rank == 0) {
            int rc = gorun_wait(r, 20);
            EXPECT(rc == GORUN_ERR_TIMEOUT, "wait(20ms) = %s", gorun_status_name(rc));
            EXPECT(strstr(gorun_last_error(), "still running") != NULL, "text: %s", gorun_last_error());
        }
        CHECK(gorun_wait(r, -1));
        EXPECT(v == (float)(size * (size - 1) / 2), "late allreduce = %g", v);
        CHECK(gorun_request_free(r));
    }
    free(x);
}

static void check_groups(gorun_comm_t w) {
    /* the even world ranks form a group, the odd ones another */
    int ranks[64], n = 0;
    for (int r = rank % 2; r < size; r += 2) ranks[n++] = r;
    gorun_comm_t g;
    CHECK(gorun_comm_group(w, ranks, n, "parity", &g));
    int gr, gs, wr;
    CHECK(gorun_comm_rank(g, &gr));
    CHECK(gorun_comm_size(g, &gs));
    CHECK(gorun_comm_world_rank(g, gr, &wr));
    EXPECT(gs == n && wr == rank, "group rank %d size %d world %d", gr, gs, wr);
    int64_t v = rank, s = 0;
    CHECK(gorun_allreduce(g, &v, &s, 1, GORUN_INT64, GORUN_SUM, NULL));
    int64_t want = 0;
    for (int i = 0; i < n; i++) want += ranks[i];
    EXPECT(s == want, "group sum %lld want %lld", (long long)s, (long long)want);
    CHECK(gorun_comm_free(g));
    EXPECT(gorun_comm_free(g) == GORUN_ERR_INVALID, "double free accepted");
    /* A group that failed reports its failure when freed, and once: the
     * gorun_finalize at the end (CHECKed) does not report it again. */
    gorun_comm_t a;
    CHECK(gorun_comm_group(w, ranks, n, "aborted", &a));
    CHECK(gorun_comm_abort(a, "abi test abort"));
    int rc = gorun_comm_free(a);
    EXPECT(rc != GORUN_OK && strstr(gorun_last_error(), "abi test abort"), "free of an aborted group: %s %s",
           gorun_status_name(rc), gorun_last_error());
}

static void check_bad_arguments(gorun_comm_t w) {
    float x[4] = {0};
    int rc = gorun_allreduce(w, x, x, 4, 99, GORUN_SUM, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "dtype 99"), "bad dtype: %s %s",
           gorun_status_name(rc), gorun_last_error());
    rc = gorun_allreduce(w, x, x, 4, GORUN_BOOL, GORUN_AVG, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "bool"), "avg of bool: %s", gorun_last_error());
    rc = gorun_allreduce(w, NULL, x, 4, GORUN_FLOAT32, GORUN_SUM, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "send is NULL"), "NULL send: %s", gorun_last_error());
    rc = gorun_broadcast(w, x, x, 4, GORUN_FLOAT32, size, NULL);
    EXPECT(rc == GORUN_ERR_INVALID, "root out of range: %s", gorun_status_name(rc));
    rc = gorun_allreduce(12345, x, x, 4, GORUN_FLOAT32, GORUN_SUM, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "no communicator 12345"), "bad handle: %s",
           gorun_last_error());
    gorun_comm_t bad;
    rc = gorun_init("deterministic=maybe", &bad);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "deterministic"), "bad config: %s", gorun_last_error());
    /* none of the above reached the communicator: it still works */
    CHECK(gorun_allreduce(w, x, x, 4, GORUN_FLOAT32, GORUN_SUM, NULL));
}

/* gorun_allreduce_coalesced: vectors of several sizes (one too large to
 * fuse), blocking and async, then bad arguments. */
static void check_coalesced(gorun_comm_t w) {
    enum { K = 5 };
    static float bufs[K][20000];
    size_t counts[K] = {1, 300, 64, 20000, 7};
    void *ptrs[K];
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < K; k++) {
            ptrs[k] = bufs[k];
            for (size_t i = 0; i < counts[k]; i++) bufs[k][i] = (float)(rank + 1) * (float)(k + i % 5 + round);
        }
        gorun_request_t req;
        CHECK(gorun_allreduce_coalesced(w, ptrs, ptrs, counts, K, GORUN_FLOAT32, GORUN_SUM, round ? &req : NULL));
        if (round) {
            CHECK(gorun_wait(req, -1));
            CHECK(gorun_request_free(req));
        }
        for (int k = 0; k < K; k++)
            for (size_t i = 0; i < counts[k]; i++) {
                float want = (float)(size * (size + 1) / 2) * (float)(k + i % 5 + round);
                EXPECT(bufs[k][i] == want, "coalesced vector %d [%zu] = %g, want %g", k, i, bufs[k][i], want);
            }
    }
    int rc = gorun_allreduce_coalesced(w, ptrs, ptrs, counts, 0, GORUN_FLOAT32, GORUN_SUM, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "n is 0"), "n = 0: %s", gorun_last_error());
    ptrs[2] = NULL;
    rc = gorun_allreduce_coalesced(w, ptrs, ptrs, counts, K, GORUN_FLOAT32, GORUN_SUM, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "sends[2]"), "NULL vector: %s", gorun_last_error());
    /* out of place: the sums land in outs, the sends stay as they were */
    static float outs[K][20000];
    void *optrs[K];
    for (int k = 0; k < K; k++) {
        ptrs[k] = bufs[k];
        optrs[k] = outs[k];
        for (size_t i = 0; i < counts[k]; i++) bufs[k][i] = (float)(rank + 1) * (float)(k + i % 3);
    }
    CHECK(gorun_allreduce_coalesced(w, ptrs, optrs, counts, K, GORUN_FLOAT32, GORUN_SUM, NULL));
    for (int k = 0; k < K; k++)
        for (size_t i = 0; i < counts[k]; i++) {
            float want = (float)(size * (size + 1) / 2) * (float)(k + i % 3);
            EXPECT(outs[k][i] == want, "out-of-place coalesced vector %d [%zu] = %g, want %g", k, i, outs[k][i], want);
            EXPECT(bufs[k][i] == (float)(rank + 1) * (float)(k + i % 3), "out-of-place coalesced: send %d [%zu] "
                   "changed to %g", k, i, bufs[k][i]);
        }
    optrs[3] = NULL;
    rc = gorun_allreduce_coalesced(w, ptrs, optrs, counts, K, GORUN_FLOAT32, GORUN_SUM, NULL);
    EXPECT(rc == GORUN_ERR_INVALID && strstr(gorun_last_error(), "recvs[3]"), "NULL recv vector: %s",
           gorun_last_error());
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    /* gorun stops the other ranks with SIGTERM once one fails; the failure
     * modes want to see the error first. */
    if (strcmp(mode, "all") != 0) signal(SIGTERM, SIG_IGN);
    EXPECT(gorun_abi_version() == GORUN_ABI_VERSION, "abi %d", gorun_abi_version());
    gorun_comm_t w;
    CHECK(gorun_init(strcmp(mode, "det") == 0 ? "deterministic=1" : NULL, &w));
    CHECK(gorun_comm_rank(w, &rank));
    CHECK(gorun_comm_size(w, &size));
    if (strcmp(mode, "all") == 0 || strcmp(mode, "det") == 0) {
        check_collectives(w);
        check_async(w);
        check_groups(w);
        check_coalesced(w);
        check_bad_arguments(w);
    } else if (strcmp(mode, "kill") == 0) {
        float x[256] = {0};
        double t0 = now();
        int rc = GORUN_OK;
        for (int i = 0; rc == GORUN_OK; i++) {
            if (i == 10 && rank == size - 1) kill(getpid(), SIGKILL);
            rc = gorun_allreduce(w, x, x, 256, GORUN_FLOAT32, GORUN_SUM, NULL);
        }
        printf("abi_test rank %d: error after %.2fs: %s (rank %d): %s\n", rank, now() - t0,
               gorun_status_name(rc), gorun_last_error_rank(), gorun_last_error());
        fflush(stdout);
        return rc == GORUN_OK ? 1 : 0;
    } else if (strcmp(mode, "steps") == 0) {
        float x[8] = {0};
        EXPECT(gorun_report_step(-1) == GORUN_ERR_INVALID, "a negative step was accepted");
        for (int i = 1; i <= 200; i++) {
            int rc = gorun_allreduce(w, x, x, 8, GORUN_FLOAT32, GORUN_SUM, NULL);
            if (rc != GORUN_OK) {
                printf("abi_test rank %d: step %d: %s\n", rank, i, gorun_status_name(rc));
                return 1;
            }
            CHECK(gorun_report_step(i));
            printf("abi_test rank %d: step %d\n", rank, i);
            fflush(stdout);
            usleep(20 * 1000);
        }
    } else if (strcmp(mode, "desync") == 0) {
        float x[8] = {0};
        int rc;
        if (rank == 0)
            rc = gorun_broadcast(w, x, x, 8, GORUN_FLOAT32, 0, NULL);
        else
            rc = gorun_allreduce(w, x, x, 8, GORUN_FLOAT32, GORUN_SUM, NULL);
        printf("abi_test rank %d: %s (rank %d): %s\n", rank, gorun_status_name(rc), gorun_last_error_rank(),
               gorun_last_error());
        fflush(stdout);
        /* Stay a moment: rank 0 is its host's rendezvous leader, and its exit
         * would tell a rank that has not read the desync yet that rank 0 died. */
        sleep(2);
        gorun_finalize();
        return 0;
    }
    CHECK(gorun_finalize());
    CHECK(gorun_finalize()); /* twice is harmless */
    printf("abi_test rank %d: ok\n", rank);
    return 0;
}
