#!/usr/bin/env python3
"""What gathering N tensors for one library call costs in Python, by way
(notes/torch-backend.md, "The coalesced call's own part"): the backend's
check-and-gather (gorun.backend._vectors) beside the alternatives it was
chosen over. One process, no library calls:

    PYTHONPATH=python python bench/torch_vectors.py [--n 64] [--numel 256]

Prints the best of 7 repeats of 2000 calls, in us per call.
"""
import argparse
import array
import ctypes
import os
import sys
import timeit

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from gorun import backend  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--numel", type=int, default=256)
    a = p.parse_args()
    torch.set_num_threads(1)
    ts = [torch.zeros(a.numel) for _ in range(a.n)]
    strided, dtype = torch.strided, torch.float32

    def former():  # the loop the backend had: checks, two lists, two ctypes arrays
        ptrs, counts = [], []
        for t in ts:
            if not (t.is_cpu and t.layout is strided and t.is_contiguous() and t.dtype is dtype):
                raise ValueError
            k = t.numel()
            ptrs.append(t.data_ptr() if k else None)
            counts.append(k)
        return (ctypes.c_void_p * len(ts))(*ptrs), (ctypes.c_size_t * len(ts))(*counts)

    def checks():
        for t in ts:
            if not (t.is_cpu and t.layout is strided and t.dtype is dtype and t.is_contiguous()):
                raise ValueError

    def comprehensions():
        return [t.data_ptr() for t in ts], [t.numel() for t in ts]

    def maps():
        return array.array("Q", map(torch.Tensor.data_ptr, ts)), array.array("Q", map(torch.Tensor.numel, ts))

    ptrs, counts = [t.data_ptr() for t in ts], [t.numel() for t in ts]
    rows = [("former loop", former), ("checks alone", checks), ("list comprehensions", comprehensions),
            ("maps into array.array", maps),
            ("ctypes arrays from lists", lambda: ((ctypes.c_void_p * len(ts))(*ptrs),
                                                  (ctypes.c_size_t * len(ts))(*counts))),
            ("array.array from lists", lambda: (array.array("Q", ptrs), array.array("Q", counts))),
            ("group by device and dtype (C++)", lambda: torch._C._group_tensors_by_device_and_dtype([ts], False)),
            ("storage bound per tensor", lambda: [t.untyped_storage().nbytes() >= (t.storage_offset() + t.numel()) * 4
                                                  for t in ts]),
            ("backend._vectors (now)", lambda: backend._vectors(ts, "bench"))]
    print("# %d tensors of %d float32, torch %s: best of 7 x 2000 calls" % (a.n, a.numel, torch.__version__))
    for name, f in rows:
        best = min(timeit.repeat(f, number=2000, repeat=7)) / 2000 * 1e6
        print("  %-34s %8.2f us" % (name, best))


if __name__ == "__main__":
    main()
