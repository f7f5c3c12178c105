#!/usr/bin/env python3
"""The torch side of scripts/bench-compare.sh (gloo), scripts/bench-torch.sh
(--backend gorun: the backend in python/, next to gloo) and scripts/bench-gpu.sh
(--backend nccl: CUDA tensors, one GPU per LOCAL_RANK, torch's bundled NCCL).

Times torch.distributed.all_reduce (float32 sum) over the same
sweep as `gorun bench allreduce` (-n calls per size from 1 MiB up, more below:
see iters) and prints the nccl-tests table, so that
`gorun bench report` reads it next to gorun's and Open MPI's results: time is
the maximum over ranks of the mean per iteration, busbw = algbw * 2(n-1)/n,
#wrong counts elements that differ from the exact sum (small integer inputs,
so the sum is exact).

Launch with anything that sets torch's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT): `gorun -np 2 python3 torch_allreduce.py ...`,
torchrun, or by hand.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    if s and s[-1] in mult:
        return int(s[:-1]) * mult[s[-1]]
    return int(s)


def values(rank, count):
    # The value rank r contributes at index i: an integer in [-4, 4].
    i = torch.arange(count, dtype=torch.int64)
    return ((i * 7 + rank * 13) % 9 - 4).to(torch.float32)


def sync():
    """Waits for queued device work; nothing to wait for on the CPU."""


def timed(buf, warmup, iters):
    for _ in range(warmup):
        dist.all_reduce(buf)
    dist.barrier()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    return (time.perf_counter() - t0) / iters


def fmt_time(us):
    if us >= 10000:
        return "%7.0f" % us
    if us >= 100:
        return "%7.1f" % us
    return "%7.2f" % us


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-c", type=int, default=1)
    p.add_argument("--backend", default="gloo", choices=["gloo", "gorun", "nccl"])
    p.add_argument("--max-seconds", type=float, default=0.5,
                   help="below 1 MiB, time at most about this long per placement and size (never fewer than -n calls)")
    a = p.parse_args()
    minb, maxb = parse_size(a.b), parse_size(a.e)

    if a.backend == "gorun":
        try:
            import gorun  # noqa: F401  (registers the backend)
        except ImportError:  # a checkout without `make python`
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
            import gorun  # noqa: F401
    global sync
    dev = torch.device("cpu")
    if a.backend == "nccl":
        # One GPU per local rank, as gorun's --device cuda picks it; time
        # is taken after the GPU finished (nccl-tests synchronizes too).
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize
    dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    me = [socket.gethostname(), os.getpid()]
    everyone = [None] * n
    dist.all_gather_object(everyone, me)
    if rank == 0:
        extra = " (NCCL %s)" % ".".join(map(str, torch.cuda.nccl.version())) if a.backend == "nccl" else ""
        print("# torch %s %s allreduce%s, nccl-tests layout" % (torch.__version__, a.backend, extra))
        print("# nRanks %d minBytes %d maxBytes %d step: %d(factor) warmup iters: %d iters: %d validation: %d"
              % (n, minb, maxb, a.f, a.w, a.n, a.c))
        print("#\n# Using ranks")
        for r, (h, pid) in enumerate(everyone):
            print("#  Rank %2d Pid %6d on %10s" % (r, pid, h))
        print("#")
        cols = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "time", "algbw", "busbw", "#wrong")
        units = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
        f = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s"
        print(f % cols)
        print(f % units, flush=True)

    bws, allwrong = [], 0
    size = minb
    while size <= maxb:
        count = size // 4
        send = torch.zeros(count, dtype=torch.float32, device=dev)
        recv = torch.zeros(count, dtype=torch.float32, device=dev)
        t = torch.zeros(2, dtype=torch.float64, device=dev)
        w = torch.zeros(2, dtype=torch.int64, device=dev)
        # torch's all_reduce is in place only; "out-of-place" copies the
        # input into the output first, as a caller keeping its input must.
        # Small messages take microseconds: -n calls of them last less than
        # one time slice of a busy machine, and one preemption decides the
        # figure. Below 1 MiB the counts grow as the size shrinks, up to
        # 50x -n at 20 KiB and under, but never past what --max-seconds
        # of calls at the warm-up's pace hold (gloo's small calls take a
        # millisecond), so that a sweep stays short; every rank takes the
        # smallest count any rank chose.
        iters = max(a.n, min(50 * a.n, a.n * (1 << 20) // max(count * 4, 1)))
        warm = max(a.w, iters // 10)
        dist.barrier()
        w0 = time.perf_counter()
        for _ in range(warm):
            recv.copy_(send)
            dist.all_reduce(recv)
        per = (time.perf_counter() - w0) / warm
        c = torch.tensor([max(a.n, min(iters, int(a.max_seconds / max(per, 1e-9))))], dtype=torch.int64, device=dev)
        dist.all_reduce(c, op=dist.ReduceOp.MIN)
        iters = int(c[0])
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            recv.copy_(send)
            dist.all_reduce(recv)
        sync()
        t[0] = (time.perf_counter() - t0) / iters
        t[1] = timed(recv, warm, iters)
        if a.c:
            want = sum(values(r, count) for r in range(n)).to(dev)
            for p in range(2):
                recv.copy_(values(rank, count).to(dev))
                dist.all_reduce(recv)
                w[p] = int((recv != want).sum())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(w)
        if rank == 0:
            line = "%12d  %12d  %8s  %6s  %6d" % (count * 4, count, "float", "sum", -1)
            for p in range(2):
                alg = count * 4 / float(t[p]) / 1e9
                bus = alg * 2 * (n - 1) / n
                bws.append(bus)
                line += "  %s  %6.2f  %6.2f  %6s" % (fmt_time(float(t[p]) * 1e6), alg, bus,
                                                    str(int(w[p])) if a.c else "N/A")
                allwrong += int(w[p])
            print(line, flush=True)
        size *= a.f
    if rank == 0:
        print("# Out of bounds values : %d %s" % (allwrong, "FAILED" if allwrong else "OK"))
        print("# Avg bus bandwidth    : %g \n#" % (sum(bws) / max(len(bws), 1)), flush=True)
    dist.destroy_process_group()
    return 1 if allwrong else 0


if __name__ == "__main__":
    rc = main()
    # torch 2.15 over gloo aborts now and then at interpreter exit after a
    # finished run ("terminate called without an active exception": gloo's
    # worker threads are torn down after the interpreter). The group is
    # destroyed and the output written, so the program leaves past teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc or 0)
