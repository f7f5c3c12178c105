#!/usr/bin/env python3
"""The per-call cost of each layer between dist.all_reduce and gorun's
runtime, on one rank (no peer to wait for, so only software is timed).
Part of scripts/bench-torch.sh; run as

    gorun -np 1 PYTHON bench/torch_overhead.py   (PYTHON: the project venv's python)

Layers, fastest first (8-byte float32 sum; best of ROUNDS interleaved rounds
of N calls each, so that a busy machine inflates them all alike):
  ctypes empty call      a ctypes call into libgorun that does nothing
                         (gorun_status_name): the price of crossing into Go
  ctypes all-reduce      gorun_allreduce with a NULL request: the collective
                         runs to completion inside one library call
  noop backend           dist.all_reduce on a ProcessGroup written in Python
                         whose allreduce returns a finished Work: torch's
                         own floor for any Python backend
  gorun sync             dist.all_reduce(t) with backend gorun
  gorun async+wait       dist.all_reduce(t, async_op=True).wait()
  gloo                   dist.all_reduce(t) on a one-rank gloo group
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work

try:
    import gorun
except ImportError:  # a checkout without `make python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import gorun
from gorun import _lib


class _DoneWork(Work):
    def wait(self, timeout=datetime.timedelta(0)):
        return True

    def is_completed(self):
        return True


class _NoopGroup(ProcessGroup):
    """A Python backend that does nothing: what torch itself costs."""

    def allreduce(self, tensors, opts=None):
        return _DoneWork()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=2000, help="calls per round")
    p.add_argument("--rounds", type=int, default=25)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gorun")
    if dist.get_world_size() != 1:
        raise SystemExit("torch_overhead.py: run it on one rank (gorun -np 1)")
    t = torch.zeros(2)
    gloo = dist.new_group([0], backend="gloo")
    noop = _NoopGroup(0, 1)
    lib = _lib.lib()
    h = dist.distributed_c10d._get_default_group()._h
    ptr = t.data_ptr()
    ar, empty = lib.gorun_allreduce, lib.gorun_status_name
    layers = [
        ("ctypes empty call", lambda: empty(0)),
        ("ctypes all-reduce", lambda: ar(h, ptr, ptr, 2, _lib.FLOAT32, _lib.SUM, None)),
        ("noop backend", lambda: dist.all_reduce(t, group=noop)),
        ("gorun sync", lambda: dist.all_reduce(t)),
        ("gorun async+wait", lambda: dist.all_reduce(t, async_op=True).wait()),
        ("gloo", lambda: dist.all_reduce(t, group=gloo)),
    ]
    best = {name: float("inf") for name, _ in layers}
    for _ in range(a.rounds):
        for name, f in layers:
            for _ in range(a.n // 20):
                f()
            t0 = time.perf_counter()
            for _ in range(a.n):
                f()
            best[name] = min(best[name], (time.perf_counter() - t0) / a.n * 1e6)
    print("# per-call cost of each layer, 1 rank, 8-byte all-reduce, best of %d rounds of %d calls"
          % (a.rounds, a.n))
    print("# %-22s %9s" % ("layer", "us/call"))
    for name, _ in layers:
        print("  %-22s %9.2f" % (name, best[name]))
    print("# gorun sync above the noop floor: %.2f us; above the ctypes all-reduce: %.2f us"
          % (best["gorun sync"] - best["noop backend"], best["gorun sync"] - best["ctypes all-reduce"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
