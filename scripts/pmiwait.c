/* pmiwait: an LD_PRELOAD library for scripts/bench-mpi.sh that records,
 * inside each rank of an MPICH program, when it wrote each PMI-1
 * "cmd=barrier_in" and when it read the matching "cmd=barrier_out" on its
 * PMI_FD descriptor, and writes them at exit to
 * $PMIWAIT_DIR/<host>.<pid> ("i TIME" / "o TIME", CLOCK_REALTIME seconds,
 * one line each). The benchmark then computes, per PMI barrier, how long
 * the last rank out waited after the last rank in: the launcher's release
 * latency as the ranks see it, whichever launcher serves PMI (gorun,
 * Hydra's proxy, pmifloor). Every host of the namespace test set shares
 * this machine's clock.
 *
 * It only looks at whole PMI-1 lines on PMI_FD (MPICH's simple client
 * writes and reads through libc's write and read); anything else passes
 * through untouched. It is a measuring tool, not part of gorun.
 *
 * Build: cc -O2 -shared -fPIC -o pmiwait.so scripts/pmiwait.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXEV 256

static int pmi_fd = -2; /* -2: not looked up yet; -1: none */
static double when[MAXEV];
static char what[MAXEV];
static int nev;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int pmifd(void) {
    if (pmi_fd == -2) {
        const char *e = getenv("PMI_FD");
        pmi_fd = e && *e ? atoi(e) : -1;
    }
    return pmi_fd;
}

static void note(char kind) {
    if (nev < MAXEV) {
        what[nev] = kind;
        when[nev++] = now();
    }
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (fd == pmifd() && n >= 14 && !memcmp(buf, "cmd=barrier_in", 14))
        note('i');
    return real(fd, buf, n);
}

ssize_t read(int fd, void *buf, size_t n) {
    static ssize_t (*real)(int, void *, size_t);
    if (!real)
        real = (ssize_t(*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    ssize_t r = real(fd, buf, n);
    if (fd == pmifd() && r >= 15 && !memcmp(buf, "cmd=barrier_out", 15))
        note('o');
    return r;
}

__attribute__((destructor)) static void dump(void) {
    const char *dir = getenv("PMIWAIT_DIR");
    char host[256], path[4096];
    if (!dir || pmifd() < 0 || nev == 0 || gethostname(host, sizeof host) != 0)
        return;
    host[sizeof host - 1] = 0;
    snprintf(path, sizeof path, "%s/%s.%d", dir, host, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    for (int i = 0; i < nev; i++)
        fprintf(f, "%c %.6f\n", what[i], when[i]);
    fclose(f);
}
