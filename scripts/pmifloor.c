/* pmifloor: the least any launcher can do to start an MPICH program on this
 * machine, as a yardstick for scripts/bench-mpi.sh's local goal.
 *
 *   pmifloor NP PROGRAM [ARGS...]
 *
 * It forks NP children before any of them runs the program; each child
 * gets one end of a socketpair as descriptor 3 (PMI_FD=3, PMI_RANK,
 * PMI_SIZE), leads its own session (as under gorun and Hydra, so the
 * kernel's autogroups treat every rank alike), and waits on a gate pipe.
 * Closing the gate lets all NP ranks exec at once. One thread then serves
 * the PMI-1 "simple" wire protocol from memory with poll(): the answers
 * that do not depend on the ranks (maxes, appnum, kvs name,
 * PMI_process_mapping for one node) are formatted before the gate opens,
 * puts go to a flat table, a barrier is released the moment its last rank
 * enters. There is no other host, no supervisor process, no event loop,
 * no output relay (the ranks write to pmifloor's own stdout and stderr),
 * no failure detection: nothing a real launcher must do and could be
 * slow at. Like gorun (launcher/topology.go), it discovers the machine's
 * topology once with libhwloc, every I/O object kept, seals the XML in a
 * memfd and hands it to the ranks (HWLOC_XMLFILE=/proc/self/fd/N,
 * HWLOC_THISSYSTEM=1), so they skip their own discovery in MPI_Init;
 * PMIFLOOR_TOPOLOGY=0 leaves them to discover it themselves.
 *
 * Build: cc -O2 -o pmifloor scripts/pmifloor.c -lhwloc (libhwloc-dev).
 *
 * Exit status: 0 if every rank exited 0, 1 otherwise; an MPI_Abort kills
 * every rank and exits with the abort's code. It is a measuring tool, not
 * a launcher: it does not survive a rank that never connects.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hwloc.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXRANKS 1024
#define LINE 1100 /* PMI-1 lines are at most 1024 bytes (PMIU_MAXLINE) */
#define MAXKEYS 8192

struct rank {
    int fd;        /* our end, -1 once closed */
    pid_t pid;
    char buf[LINE];
    size_t len;
    int in_barrier;
};

static struct rank ranks[MAXRANKS];
static int np;
static char *keys[MAXKEYS], *vals[MAXKEYS];
static int nkeys;
static const char *kvsname = "pmifloor_kvs";
static char mapping[64];

static void die(const char *what) {
    perror(what);
    for (int i = 0; i < np; i++)
        if (ranks[i].pid > 0)
            kill(-ranks[i].pid, SIGKILL);
    exit(1);
}

static void reply(int r, const char *s) {
    size_t n = strlen(s), off = 0;
    while (off < n) {
        ssize_t w = write(ranks[r].fd, s + off, n - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return; /* the rank is gone; its exit status tells */
        }
        off += (size_t)w;
    }
}

/* field copies the value of key= in line into out (empty if absent). */
static void field(const char *line, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    const char *p = line;
    out[0] = 0;
    while ((p = strstr(p, key)) != NULL) {
        if ((p == line || p[-1] == ' ') && p[kl] == '=') {
            p += kl + 1;
            size_t n = strcspn(p, " \n");
            if (n >= cap)
                n = cap - 1;
            memcpy(out, p, n);
            out[n] = 0;
            return;
        }
        p += kl;
    }
}

static int trace; /* PMIFLOOR_TRACE set: every request to stderr, timed */
static struct timespec t0;

static void handle(int r, char *line) {
    char cmd[64], key[128], val[LINE], out[LINE + 128];
    field(line, "cmd", cmd, sizeof cmd);
    if (trace) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        fprintf(stderr, "%8.3f ms rank %2d %.60s\n",
                (t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6, r, line);
    }
    if (!strcmp(cmd, "init")) {
        reply(r, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
    } else if (!strcmp(cmd, "get_maxes")) {
        reply(r, "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n");
    } else if (!strcmp(cmd, "get_appnum")) {
        reply(r, "cmd=appnum appnum=0 rc=0\n");
    } else if (!strcmp(cmd, "get_my_kvsname")) {
        snprintf(out, sizeof out, "cmd=my_kvsname kvsname=%s rc=0\n", kvsname);
        reply(r, out);
    } else if (!strcmp(cmd, "get_universe_size")) {
        snprintf(out, sizeof out, "cmd=universe_size size=%d rc=0\n", np);
        reply(r, out);
    } else if (!strcmp(cmd, "put")) {
        field(line, "key", key, sizeof key);
        field(line, "value", val, sizeof val);
        if (nkeys == MAXKEYS) {
            fprintf(stderr, "pmifloor: more than %d keys\n", MAXKEYS);
            die("put");
        }
        keys[nkeys] = strdup(key);
        vals[nkeys] = strdup(val);
        nkeys++;
        reply(r, "cmd=put_result rc=0 msg=success\n");
    } else if (!strcmp(cmd, "get")) {
        field(line, "key", key, sizeof key);
        const char *v = NULL;
        if (!strcmp(key, "PMI_process_mapping"))
            v = mapping;
        for (int i = nkeys - 1; v == NULL && i >= 0; i--)
            if (!strcmp(keys[i], key))
                v = vals[i];
        if (v)
            snprintf(out, sizeof out, "cmd=get_result rc=0 msg=success value=%s\n", v);
        else
            snprintf(out, sizeof out, "cmd=get_result rc=-1 msg=key_%s_not_found\n", key);
        reply(r, out);
    } else if (!strcmp(cmd, "barrier_in")) {
        ranks[r].in_barrier = 1;
        int in = 0;
        for (int i = 0; i < np; i++)
            in += ranks[i].in_barrier;
        if (in == np)
            for (int i = 0; i < np; i++) {
                ranks[i].in_barrier = 0;
                reply(i, "cmd=barrier_out\n");
            }
    } else if (!strcmp(cmd, "finalize")) {
        reply(r, "cmd=finalize_ack\n");
    } else if (!strcmp(cmd, "abort")) {
        field(line, "exitcode", val, sizeof val);
        fprintf(stderr, "pmifloor: rank %d aborted with code %s\n", r, val);
        for (int i = 0; i < np; i++)
            kill(-ranks[i].pid, SIGKILL);
        while (wait(NULL) > 0)
            ;
        exit(atoi(val) ? atoi(val) : 1);
    } else {
        fprintf(stderr, "pmifloor: rank %d sent an unknown command: %s\n", r, line);
        die("protocol");
    }
}

/* topology_fd discovers the topology and returns a sealed memfd with its
 * XML, or -1 (the ranks then discover it themselves). */
static int topology_fd(void) {
    hwloc_topology_t topo;
    char *xml = NULL;
    int len = 0, fd = -1;
    if (hwloc_topology_init(&topo) < 0)
        return -1;
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (hwloc_topology_load(topo) == 0 && hwloc_topology_export_xmlbuffer(topo, &xml, &len, 0) == 0) {
        fd = memfd_create("pmifloor-topology", MFD_ALLOW_SEALING);
        /* the exported length counts the terminating NUL */
        if (fd >= 0 && (write(fd, xml, (size_t)len - 1) != len - 1 ||
                        fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK) < 0)) {
            close(fd);
            fd = -1;
        }
        hwloc_free_xmlbuffer(topo, xml);
    }
    hwloc_topology_destroy(topo);
    if (fd >= 0 && fd < 10) {
        /* Above 3, which each rank fills with its PMI socket. */
        int high = fcntl(fd, F_DUPFD, 10);
        close(fd);
        fd = high;
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 3 || (np = atoi(argv[1])) < 1 || np > MAXRANKS) {
        fprintf(stderr, "usage: pmifloor NP PROGRAM [ARGS...]   (1 <= NP <= %d)\n", MAXRANKS);
        return 2;
    }
    snprintf(mapping, sizeof mapping, "(vector,(0,1,%d))", np);
    const char *topo_env = getenv("PMIFLOOR_TOPOLOGY");
    int topo = topo_env && !strcmp(topo_env, "0") ? -1 : topology_fd();
    if (topo >= 0) {
        char path[64];
        /* Not close-on-exec: every rank inherits it under this number. */
        snprintf(path, sizeof path, "/proc/self/fd/%d", topo);
        setenv("HWLOC_XMLFILE", path, 1);
        setenv("HWLOC_THISSYSTEM", "1", 1);
    }
    int gate[2], tmp[2];
    /* The gate lives above descriptor 3, which each child fills with its
     * PMI socket before it waits on the gate. */
    if (pipe2(tmp, O_CLOEXEC) < 0 || (gate[0] = fcntl(tmp[0], F_DUPFD_CLOEXEC, 10)) < 0 ||
        (gate[1] = fcntl(tmp[1], F_DUPFD_CLOEXEC, 10)) < 0)
        die("pipe");
    close(tmp[0]);
    close(tmp[1]);
    for (int i = 0; i < np; i++) {
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
            die("socketpair");
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            char v[32];
            setsid();
            /* dup2 clears close-on-exec on 3, unless it is already 3 */
            if (sp[1] == 3 ? fcntl(3, F_SETFD, 0) < 0 : dup2(sp[1], 3) < 0)
                _exit(127);
            snprintf(v, sizeof v, "%d", i);
            setenv("PMI_RANK", v, 1);
            snprintf(v, sizeof v, "%d", np);
            setenv("PMI_SIZE", v, 1);
            setenv("PMI_FD", "3", 1);
            close(gate[1]);
            char c;
            while (read(gate[0], &c, 1) < 0 && errno == EINTR)
                ;
            execvp(argv[2], argv + 2);
            perror(argv[2]);
            _exit(127);
        }
        close(sp[1]);
        ranks[i].fd = sp[0];
        ranks[i].pid = pid;
    }
    trace = getenv("PMIFLOOR_TRACE") != NULL;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    close(gate[1]); /* every rank execs now */
    close(gate[0]);
    if (topo >= 0)
        close(topo);

    struct pollfd pfd[MAXRANKS];
    int open = np;
    while (open > 0) {
        for (int i = 0; i < np; i++) {
            pfd[i].fd = ranks[i].fd;
            pfd[i].events = POLLIN;
        }
        if (poll(pfd, np, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        for (int i = 0; i < np; i++) {
            if (ranks[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            struct rank *rk = &ranks[i];
            ssize_t n = read(rk->fd, rk->buf + rk->len, sizeof rk->buf - 1 - rk->len);
            if (n <= 0) {
                if (n < 0 && errno == EINTR)
                    continue;
                close(rk->fd);
                rk->fd = -1;
                open--;
                continue;
            }
            rk->len += (size_t)n;
            rk->buf[rk->len] = 0;
            char *nl;
            while ((nl = memchr(rk->buf, '\n', rk->len)) != NULL) {
                *nl = 0;
                handle(i, rk->buf);
                size_t used = (size_t)(nl + 1 - rk->buf);
                memmove(rk->buf, nl + 1, rk->len - used);
                rk->len -= used;
                rk->buf[rk->len] = 0;
            }
            if (rk->len == sizeof rk->buf - 1) {
                fprintf(stderr, "pmifloor: rank %d sent a line over %d bytes\n", i, LINE);
                die("protocol");
            }
        }
    }
    int bad = 0, st;
    for (int i = 0; i < np; i++) {
        if (waitpid(ranks[i].pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "pmifloor: rank %d (pid %d) did not exit 0 (status %#x)\n", i, ranks[i].pid, st);
            bad = 1;
        }
    }
    return bad;
}
