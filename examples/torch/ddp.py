"""Trains a small model with DistributedDataParallel on the gorun backend.

    make build python
    bin/gorun -np 4 /usr/bin/python3 examples/torch/ddp.py
    bin/gorun -np 4 /usr/bin/python3 examples/torch/ddp.py --backend gloo   # the same run on gloo

Use the python3 that has torch (Debian's /usr/bin/python3 with python3-torch).
Rank 0 prints the loss every few steps and the mean step time; with
--deterministic the gorun backend reduces along one fixed tree, so the final
parameters are bitwise the same on every rank and in every run.
"""

import argparse
import hashlib
import os
import sys
import time

try:
    import gorun
except ImportError:  # running from a checkout without `make python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import gorun

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="gorun", help="gorun (default) or gloo")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--deterministic", action="store_true", help="gorun: bitwise-reproducible reductions")
    ap.add_argument("--tcp", action="store_true", help="gorun: TCP between ranks on one host, no shared memory")
    ap.add_argument("--fp16-hook", action="store_true", help="compress gradients to float16 (a DDP comm hook)")
    a = ap.parse_args()

    opts = gorun.Options(deterministic=a.deterministic, tcp=a.tcp) if a.backend == "gorun" else None
    dist.init_process_group(a.backend, pg_options=opts)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts it)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, a.width), torch.nn.GELU(),
        torch.nn.Linear(a.width, a.width), torch.nn.GELU(),
        torch.nn.Linear(a.width, 1))
    ddp = DDP(model)
    if a.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    # Synthetic regression: y = sin(x·w), each rank drawing its own samples.
    g = torch.Generator().manual_seed(1000 + rank)
    w = torch.randn(64, 1, generator=torch.Generator().manual_seed(7))
    times, cpus = [], []
    for step in range(a.steps):
        x = torch.randn(a.batch, 64, generator=g)
        y = torch.sin(x @ w)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)  # every thread of the process: torch's, gorun's or gloo's
        if rank == 0 and (step % 10 == 0 or step == a.steps - 1):
            print("step %d loss %.5f" % (step, loss.item()), flush=True)

    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]
    # CPU time per step, averaged over the steady steps and the ranks: with
    # more ranks than cores (4 on 2) the step time is bounded by the CPU
    # all ranks spend, so this is what a backend can save there, and it
    # suffers less than wall time from other load on the machine.
    warm = len(times) // 5  # skip warm-up
    cpu = torch.tensor([sum(cpus[warm:]) / max(len(cpus) - warm, 1)], dtype=torch.float64)
    dist.all_reduce(cpu)
    if rank == 0:
        steady = sorted(times[warm:])
        print("backend %s ranks %d: median step %.2f ms, cpu %.2f ms/step/rank, parameters sha256 %s"
              % (a.backend, world, 1000 * steady[len(steady) // 2], 1000 * cpu.item() / world, digest),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
