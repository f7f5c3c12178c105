"""One training step, several ways, side by side in one job (run under gorun
by scripts/bench-torch-step.sh):

    gorun.torch ddp   vs  torch DDP over gloo, and over gorun's backend
    gorun.torch fsdp  vs  torch FSDP2 (fully_shard) over gloo (re-gathers at
                          their reader, the default regather_ahead=0, and one
                          block ahead, regather_ahead=1)

Every variant trains its own copy of one GPT-like model (tied embedding) on
the same batches. Rounds are paired and rotated: each round runs every
variant for STEPS steps, in an order that shifts by one each round, so
drift on a shared machine hits all of them alike. Per round, a variant's
figure is its median step; the report is the median over rounds of each
variant and of each pair's per-round ratio. Peak gathered (full) parameter
bytes are sampled at every module boundary of a step for both fsdp variants.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
import gorun.torch as gt  # noqa: E402
from step_prog import GPT, Block  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


def data(step, args):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    idx = torch.randint(0, args.vocab, (args.batch, args.ctx), generator=g)
    return idx, torch.roll(idx, -1, 1)


def model(args):
    torch.manual_seed(0)
    return GPT(vocab=args.vocab, d=args.d, blocks=args.blocks, heads=4, ctx=args.ctx)


class FullBytes:
    """Samples the bytes of FSDP2's gathered parameters (every FSDPParam's
    all-gather outputs whose storage is allocated) at every module boundary
    of a step, forward and backward. It leaves out FSDP2's transient flat
    all-gather buffer, so it can only understate FSDP2's peak."""

    def __init__(self, m):
        self.params = []
        for mod in m.modules():
            if hasattr(mod, "_get_fsdp_state"):
                pg = mod._get_fsdp_state()._fsdp_param_group
                if pg is not None:
                    self.params.extend(pg.fsdp_params)
        self.peak = 0
        for mod in m.modules():
            mod.register_forward_pre_hook(lambda *a: self.sample())
            mod.register_forward_hook(lambda *a: self.sample())
            if isinstance(mod, (Block, GPT)) or not list(mod.children()):
                mod.register_full_backward_pre_hook(lambda *a: self.sample())
                mod.register_full_backward_hook(lambda *a: self.sample())

    def sample(self):
        n, seen = 0, set()
        for fp in self.params:
            for t in fp.all_gather_outputs:
                st = t.untyped_storage()
                if st.nbytes() and st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    n += st.nbytes()
        self.peak = max(self.peak, n)


def make_variants(args):
    from torch.distributed.fsdp import fully_shard
    v = {}
    # torch DDP over gorun's own backend (its process group joins the world
    # first; gorun.torch then shares the world communicator).
    pg = dist.new_group(backend="gorun")
    m = nn.parallel.DistributedDataParallel(model(args), process_group=pg)
    v["torch-ddp-gorun"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    m = gt.distribute(model(args), mode="ddp", trace=args.trace_dir and os.path.join(args.trace_dir, "ddp-{rank}.json"))
    v["gorun-ddp"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    m = nn.parallel.DistributedDataParallel(model(args))
    v["torch-ddp"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    m = gt.distribute(model(args), mode="fsdp", trace=args.trace_dir and os.path.join(args.trace_dir, "fsdp-{rank}.json"),
                      passes=args.fsdp_passes, regather_ahead=1)
    v["gorun-fsdp"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    m = gt.distribute(model(args), mode="fsdp", passes=args.fsdp_passes)  # the default: regather_ahead=0
    v["gorun-fsdp-0"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    m = model(args)
    for b in m.blocks:
        fully_shard(b)
    fully_shard(m)
    v["torch-fsdp2"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    v["torch-fsdp2-mem"] = FullBytes(m)
    return v


def step(m, opt, s, args):
    loss = m(*data(s, args))
    loss.backward()
    opt.step()
    opt.zero_grad()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--trace-dir", default="")
    ap.add_argument("--fsdp-passes", default="reshard,blocks,overlap", help="the planner's passes for gorun fsdp")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    v = make_variants(args)
    mem = v.pop("torch-fsdp2-mem")
    names = list(v)
    for name in names:
        for s in range(args.warmup):
            step(*v[name], s, args)
    per = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            m, opt = v[name]
            ts = []
            for s in range(args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                step(m, opt, s, args)
                ts.append(time.perf_counter() - t0)
            # The slowest rank's median is the step's.
            t = torch.tensor([statistics.median(ts)])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            per[name].append(t.item())
    mem.peak = 0
    step(*v["torch-fsdp2"], 0, args)
    fs = v["gorun-fsdp"][0]
    if RANK == 0:
        med = {k: statistics.median(x) for k, x in per.items()}
        ratio = lambda a, b: statistics.median([x / y for x, y in zip(per[a], per[b])])
        params = sum(p.numel() for p in model(args).parameters())
        print("model: GPT-like, %d blocks, d=%d, %d parameters; %d ranks, %d rounds x %d steps (paired, rotated)"
              % (args.blocks, args.d, params, n, args.rounds, args.steps))
        for k in names:
            print("  %-12s step %8.2f ms (median of round medians; rounds: %s)"
                  % (k, 1e3 * med[k], " ".join("%.1f" % (1e3 * x) for x in per[k])))
        print("RATIO ddp  gorun/torch-DDP-gloo   %.3f (goal <= 1.0)" % ratio("gorun-ddp", "torch-ddp"))
        print("RATIO ddp  gorun/torch-DDP-gorun  %.3f (goal <= 1.0; torch DDP over gorun's backend)"
              % ratio("gorun-ddp", "torch-ddp-gorun"))
        print("RATIO fsdp gorun/torch-FSDP2-gloo %.3f (goal <= 1.1; re-gathers one block ahead, regather_ahead=1)"
              % ratio("gorun-fsdp", "torch-fsdp2"))
        print("RATIO fsdp gorun/torch-FSDP2-gloo %.3f (goal <= 1.1; the default: re-gathers at their reader, regather_ahead=0)"
              % ratio("gorun-fsdp-0", "torch-fsdp2"))
        print("RATIO fsdp regather_ahead=0 / regather_ahead=1 %.3f (the default's choice: step time of each, paired)"
              % ratio("gorun-fsdp-0", "gorun-fsdp"))
        for k in ("gorun-ddp", "gorun-fsdp", "gorun-fsdp-0"):
            mt = v[k][0].metrics()
            print("  %-12s exposed communication %.2f ms of %.2f ms communication per step, %d buckets%s"
                  % (k, 1e3 * mt["exposed_communication"], 1e3 * mt["communication"], mt["buckets"],
                     ("; trace: " + mt["trace"]) if mt.get("trace") else ""))
        m1, m0 = fs.metrics(), v["gorun-fsdp-0"][0].metrics()
        print("PEAK full parameters: gorun fsdp regather_ahead=1 %d bytes (plan's estimate %d), the default regather_ahead=0 %d (estimate %d); "
              "FSDP2 %d bytes (its gathered outputs, sampled at module boundaries); whole model %d bytes"
              % (m1["peak_gathered_bytes"], m1["plan_peak_gathered_bytes"], m0["peak_gathered_bytes"],
                 m0["plan_peak_gathered_bytes"], mem.peak, m1["full_parameter_bytes"]))
    else:
        for k in ("gorun-ddp", "gorun-fsdp"):
            v[k][0].metrics()  # writes this rank's trace
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
