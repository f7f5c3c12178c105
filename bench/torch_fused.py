#!/usr/bin/env python3
"""Many small all-reduces against one large one: the part of
scripts/bench-torch.sh that measures fusion through torch. Run as

    gorun -np N PYTHON bench/torch_fused.py --backend gorun|gloo

Each row moves PIECES x PIECE bytes (float32 sum, default 64 x 1 KiB) per
step, in one of these shapes:
  one             dist.all_reduce of one tensor of PIECES x PIECE bytes (the anchor)
  coalesced       dist.all_reduce_coalesced of the PIECES tensors (one call)
  async+wait      PIECES dist.all_reduce(async_op=True), then wait on each Work
  sync            PIECES dist.all_reduce one after another (no overlap: a
                  call returns when done, so nothing can be fused)
  flat            the PIECES tensors flattened into one buffer, one
                  dist.all_reduce of it, copied back (gloo's way for a
                  coalesced call, done here around the backend)
With --floor, the same shapes also run on a group of "noop", a Python
ProcessGroup that moves nothing (each call returns one completed Work):
torch's own cost of the call through a Python backend, which no Python
backend can go below. "one@noop" etc. are those rows; their /one is still
over the real backend's one 64 KiB call, so coalesced@noop's /one above 2
says the goal is out of reach of any Python backend on this machine. And on
a group of torch's C++ no-op backend ("fake", FakeProcessGroup): the rows
"@fake(C++)", the floor of a backend written in C++. --with-gloo adds the
rows of a gloo group in the same run ("@gloo").
ROUNDS rounds of STEPS steps per shape, the shapes in rotated order so that
a busy machine slows them alike. A round's time per step is the slowest
rank's mean. Prints per shape the median over rounds (us per step) and its
ratio to the anchor's median (goal for coalesced and async+wait: <= 2), then
the best round and its ratio to the anchor's best (on a loaded machine the
best round is the one least disturbed).
"""
import argparse
import importlib
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20}
    s = s.strip().upper()
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


class _NoopWork(dist.Work):
    """A call that is already complete."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True


_DONE = None


class _NoopGroup(dist.ProcessGroup):
    """The floor: a Python ProcessGroup whose calls do nothing but return a
    completed Work (one shared instance, as gorun's synchronous calls do)."""

    def __init__(self, rank, size):
        super().__init__(rank, size)

    def allreduce(self, tensors, opts=None):
        return _DONE

    def allreduce_coalesced(self, tensors, opts=None):
        return _DONE

    def barrier(self, opts=None):
        return _DONE

    def getBackendName(self):
        return "noop"


def _register_noop():
    global _DONE
    _DONE = _NoopWork()
    dist.Backend.register_backend("noop", lambda opts, pg_options: _NoopGroup(opts.group_rank, opts.group_size),
                                  extended_api=True, devices=["cpu"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gorun", choices=["gloo", "gorun"])
    p.add_argument("--pieces", type=int, default=64)
    p.add_argument("--piece", default="1K", help="bytes per small tensor (float32)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--floor", action="store_true", help="also run the shapes on no-op backends (Python, C++)")
    p.add_argument("--with-gloo", action="store_true", help="also run the shapes on a gloo group in the same run")
    a = p.parse_args()
    if a.backend == "gorun":
        try:
            import gorun  # noqa: F401  (registers the backend)
        except ImportError:  # a checkout without `make python`
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
            import gorun  # noqa: F401
    dist.init_process_group(a.backend)
    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    k = parse_size(a.piece) // 4
    big = torch.zeros(a.pieces * k)  # zeros: sums stay finite however many steps
    pieces = [torch.zeros(k) for _ in range(a.pieces)]

    def shapes_on(group, suffix):
        def one():
            dist.all_reduce(big, group=group)

        def coalesced():
            dist.all_reduce_coalesced(pieces, group=group)

        def async_wait():
            ws = [dist.all_reduce(t, async_op=True, group=group) for t in pieces]
            for w in ws:
                w.wait()

        def sync():
            for t in pieces:
                dist.all_reduce(t, group=group)

        def flat():
            # gloo's way for a coalesced call: one flat copy, one call, the
            # pieces copied back out (what a backend could do inside)
            f = torch._utils._flatten_dense_tensors(pieces)
            dist.all_reduce(f, group=group)
            torch._foreach_copy_(pieces, torch._utils._unflatten_dense_tensors(f, pieces))
        return [("one" + suffix, one), ("coalesced" + suffix, coalesced), ("async+wait" + suffix, async_wait),
                ("sync" + suffix, sync), ("flat" + suffix, flat)]

    shapes = shapes_on(None, "")
    if a.floor:
        _register_noop()
        shapes += shapes_on(dist.new_group(backend="noop"), "@noop")
        # torch's own C++ no-op backend (FakeProcessGroup, what torch's
        # tests use to trace without communicating): the floor of a C++ backend.
        importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers "fake"
        shapes += shapes_on(dist.new_group(backend="fake"), "@fake(C++)")
    if a.with_gloo and a.backend != "gloo":
        shapes += shapes_on(dist.new_group(backend="gloo"), "@gloo")
    for _, f in shapes:  # warm-up
        for _ in range(max(3, a.steps // 10)):
            f()
    times = {name: [] for name, _ in shapes}
    slowest = torch.zeros(1, dtype=torch.float64)
    for r in range(a.rounds):
        for name, f in shapes[r % len(shapes):] + shapes[:r % len(shapes)]:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                f()
            slowest[0] = (time.perf_counter() - t0) / a.steps
            dist.all_reduce(slowest, dist.ReduceOp.MAX)
            times[name].append(slowest.item() * 1e6)
    if rank == 0:
        anchor = statistics.median(times["one"])
        print("# torch %s %s, %d ranks: %d x %d B per step vs one all_reduce of %d B; median of %d rounds x %d steps"
              % (torch.__version__, a.backend, n, a.pieces, k * 4, a.pieces * k * 4, a.rounds, a.steps))
        best = min(times["one"])
        print("# %-18s %10s %8s %10s %8s   %s" % ("shape", "us/step", "/one", "best", "/one", "rounds (us/step)"))
        for name, _ in shapes:
            m, b = statistics.median(times[name]), min(times[name])
            print("  %-18s %10.1f %8.2f %10.1f %8.2f   %s" % (name, m, m / anchor, b, b / best,
                                                          " ".join("%.0f" % t for t in times[name])), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.15 over gloo aborts now and then at interpreter exit after a
    # finished run ("terminate called without an active exception": gloo's
    # worker threads are torn down after the interpreter). The group is
    # destroyed and the output written, so the program leaves past teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
