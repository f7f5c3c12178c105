"""One training step, several ways, side by side in one job (run under gorun
by scripts/bench-torch-step.sh):

    gorun.torch ddp   vs  torch DDP over gloo, and over gorun's backend
    gorun.torch fsdp  vs  torch FSDP2 (fully_shard) over gloo (re-gathers at
                          their reader, the default regather_ahead=0, and one
                          block ahead, regather_ahead=1)
    torch DDP and torch FSDP2 over gorun's backend  vs  the same over gloo

Every variant trains its own copy of one GPT-like model (tied embedding) on
the same batches. Rounds are paired and rotated: each round runs every
variant for STEPS steps, in an order that shifts by one each round, so
drift on a shared machine hits all of them alike. Per round, a variant's
figure is its median step; the report is the median over rounds of each
variant and of each pair's per-round ratio. Peak gathered (full) parameter
bytes are sampled at every module boundary of a step for both fsdp variants.
"""

import argparse
import json
import math
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


VARIANTS = ("torch-ddp-gorun", "gorun-ddp", "torch-ddp", "gorun-fsdp", "gorun-fsdp-0", "torch-fsdp2",
            "torch-fsdp2-gorun")


def make_variants(args):
    from torch.distributed.fsdp import fully_shard
    want = VARIANTS if not args.variants else args.variants.split(",")
    bad = [w for w in want if w not in VARIANTS]
    if bad:
        raise SystemExit("bench_torch_step: --variants: unknown %s (known: %s)" % (", ".join(bad), ", ".join(VARIANTS)))
    v = {}
    # torch DDP over gorun's own backend (its process group joins the world
    # first; gorun.torch then shares the world communicator).
    pg = dist.new_group(backend="gorun")
    if "torch-ddp-gorun" in want:
        m = nn.parallel.DistributedDataParallel(model(args), process_group=pg)
        v["torch-ddp-gorun"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    if "gorun-ddp" in want:
        m = gt.distribute(model(args), mode="ddp", trace=args.trace_dir and os.path.join(args.trace_dir, "ddp-{rank}.json"))
        v["gorun-ddp"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    if "torch-ddp" in want:
        m = nn.parallel.DistributedDataParallel(model(args))
        v["torch-ddp"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    if "gorun-fsdp" in want:
        m = gt.distribute(model(args), mode="fsdp", trace=args.trace_dir and os.path.join(args.trace_dir, "fsdp-{rank}.json"),
                          passes=args.fsdp_passes, regather_ahead=1)
        v["gorun-fsdp"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    if "gorun-fsdp-0" in want:
        m = gt.distribute(model(args), mode="fsdp", passes=args.fsdp_passes)  # the default: regather_ahead=0
        v["gorun-fsdp-0"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    for spec in args.extra:
        # An A/B variant: gorun.torch with other distribute() options, as
        # NAME=JSON (e.g. gorun-ddp-4m={"mode": "ddp", "plan_options": {"cap_bytes": 4194304}}).
        name, _, js = spec.partition("=")
        try:
            opts = json.loads(js)
        except ValueError as e:
            raise SystemExit("bench_torch_step: --extra %r: want NAME=JSON options of distribute(): %s" % (spec, e))
        m = gt.distribute(model(args), **opts)
        v[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    if "torch-fsdp2" in want:
        m = model(args)
        for b in m.blocks:
            fully_shard(b)
        fully_shard(m)
        v["torch-fsdp2"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
        v["torch-fsdp2-mem"] = FullBytes(m)
    if "torch-fsdp2-gorun" in want:
        # The same FSDP2 model on a one-dimensional CPU mesh over gorun's
        # group: the backend's all-gathers and reduce-scatters against gloo's.
        from torch.distributed.device_mesh import DeviceMesh
        mesh = DeviceMesh.from_group(pg, "cpu")
        m = model(args)
        for b in m.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(m, mesh=mesh)
        v["torch-fsdp2-gorun"] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    return v


def median_ci(xs):
    """A distribution-free 95 % confidence interval of the median: the
    order statistics x(k) and x(n-k+1) with P(Binomial(n, 1/2) < k) <= 2.5 %
    (None below 6 rounds, where no such k exists)."""
    n, xs = len(xs), sorted(xs)
    k, below = 0, 0.0
    while True:
        p = math.comb(n, k) / 2 ** n
        if below + p > 0.025:
            break
        below += p
        k += 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def quartiles(xs):
    """The median and the interquartile range (25th, 75th percentiles)."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[1], q[0], q[2]


def step(m, opt, s, args):
    loss = m(*data(s, args))
    loss.backward()
    opt.step()
    opt.zero_grad()


RATIOS = (
    ("ddp ", "gorun-ddp", "torch-ddp", "gorun/torch-DDP-gloo  ", "goal <= 1.0"),
    ("ddp ", "gorun-ddp", "torch-ddp-gorun", "gorun/torch-DDP-gorun ", "goal <= 1.0; torch DDP over gorun's backend"),
    ("fsdp", "gorun-fsdp", "torch-fsdp2", "gorun/torch-FSDP2-gloo", "goal <= 1.1; re-gathers one block ahead, regather_ahead=1"),
    ("fsdp", "gorun-fsdp-0", "torch-fsdp2", "gorun/torch-FSDP2-gloo",
     "goal <= 1.1; the default: re-gathers at their reader, regather_ahead=0"),
    ("fsdp", "gorun-fsdp-0", "gorun-fsdp", "regather_ahead=0 / regather_ahead=1", "the default's choice: step time of each"),
    ("ddp ", "torch-ddp-gorun", "torch-ddp", "torch-DDP-gorun/torch-DDP-gloo", "goal < 1.0: torch DDP, backend gorun vs gloo"),
    ("fsdp", "torch-fsdp2-gorun", "torch-fsdp2", "torch-FSDP2-gorun/torch-FSDP2-gloo",
     "goal < 1.0: torch FSDP2, backend gorun vs gloo"),
)


def report(args, n, v, per, cpu, mem):
    """Rank 0's summary: each variant's median, each pair's per-round
    ratios as median and interquartile range (how far the paired figure
    moves on this machine), exposed communication and peak memory."""
    med = {k: statistics.median(x) for k, x in per.items()}
    params = sum(p.numel() for p in model(args).parameters())
    print("model: GPT-like, %d blocks, d=%d, %d parameters; %d ranks, %d rounds x %d steps (paired, rotated)"
          % (args.blocks, args.d, params, n, args.rounds, args.steps))
    if hasattr(os, "getloadavg"):
        print("load average at the end: %.1f %.1f %.1f" % os.getloadavg())
    for k in per:
        print("  %-17s step %8.2f ms (median of round medians; rounds: %s)"
              % (k, 1e3 * med[k], " ".join("%.1f" % (1e3 * x) for x in per[k])))
    for k in cpu:
        print("  %-17s CPU  %8.2f ms per step, all ranks' threads (median of round medians)"
              % (k, 1e3 * statistics.median(cpu[k])))
    ratios = list(RATIOS)
    for name in args.extra:
        name = name.partition("=")[0]
        mode = v[name][0].mode
        base, anchor = ("gorun-ddp", "torch-ddp") if mode == "ddp" else ("gorun-fsdp-0", "torch-fsdp2")
        ratios += [(mode, name, base, name + " / " + base, "A/B"), (mode, name, anchor, name + " / " + anchor, "A/B")]
    for mode, a, b, what, goal in ratios:
        if a in per and b in per:
            rc = [x / y for x, y in zip(cpu[a], cpu[b])]
            m, q1, q3 = quartiles(rc)
            print("CPU   %s %s %.3f  IQR %.3f-%.3f  (CPU time per step, paired)" % (mode, what, m, q1, q3))
    for mode, a, b, what, goal in ratios:
        if a in per and b in per:
            rs = [x / y for x, y in zip(per[a], per[b])]
            m, q1, q3 = quartiles(rs)
            ci = median_ci(rs)
            print("RATIO %s %s %.3f  IQR %.3f-%.3f  95%%-CI of the median %s  range %.3f-%.3f  (%s/%s, %d paired "
                  "rounds; %s)" % (mode, what, m, q1, q3, "%.3f-%.3f" % ci if ci else "n/a (under 6 rounds)",
                                   min(rs), max(rs), a, b, len(rs), goal))
    for k in ("gorun-ddp", "gorun-fsdp", "gorun-fsdp-0"):
        if k not in v:
            continue
        mt = v[k][0].metrics()
        print("  %-12s exposed communication %.2f ms of %.2f ms communication per step, %d buckets%s"
              % (k, 1e3 * mt["exposed_communication"], 1e3 * mt["communication"], mt["buckets"],
                 ("; trace: " + mt["trace"]) if mt.get("trace") else ""))
    if mem is not None and "gorun-fsdp" in v and "gorun-fsdp-0" in v:
        m1, m0 = v["gorun-fsdp"][0].metrics(), v["gorun-fsdp-0"][0].metrics()
        print("PEAK full parameters: gorun fsdp regather_ahead=1 %d bytes (plan's estimate %d), the default "
              "regather_ahead=0 %d (estimate %d); FSDP2 %d bytes (its gathered outputs, sampled at module "
              "boundaries); whole model %d bytes"
              % (m1["peak_gathered_bytes"], m1["plan_peak_gathered_bytes"], m0["peak_gathered_bytes"],
                 m0["plan_peak_gathered_bytes"], mem.peak, m1["full_parameter_bytes"]))


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
    ap.add_argument("--variants", default="", help="comma-separated subset of %s (default all)" % ", ".join(VARIANTS))
    ap.add_argument("--extra", action="append", default=[],
                    help="NAME=JSON: one more gorun.torch variant with these distribute() options (repeatable); "
                         "compared with the variant of its mode and that mode's torch anchor")
    ap.add_argument("--fsdp-passes", default="reshard,blocks,overlap", help="the planner's passes for gorun fsdp")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    v = make_variants(args)
    mem = v.pop("torch-fsdp2-mem", None)
    names = list(v)
    for name in names:
        for s in range(args.warmup):
            step(*v[name], s, args)
    per = {k: [] for k in names}
    cpu = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            m, opt = v[name]
            ts, cs = [], []
            for s in range(args.steps):
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                step(m, opt, s, args)
                ts.append(time.perf_counter() - t0)
                cs.append(time.process_time() - c0)
            # The slowest rank's median is the step's; the CPU time (every
            # thread of the process) is summed over the ranks.
            t = torch.tensor([statistics.median(ts)])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            per[name].append(t.item())
            c = torch.tensor([statistics.median(cs)])
            dist.all_reduce(c)
            cpu[name].append(c.item())
    if mem is not None:
        mem.peak = 0
        step(*v["torch-fsdp2"], 0, args)
    if RANK == 0:
        report(args, n, v, per, cpu, mem)
    else:
        for k in ("gorun-ddp", "gorun-fsdp"):
            if k in v:
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
