"""One rank of gorun.fx's checks, and the parent that starts them.

Each rank (torchrun-style environment: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) joins a gloo group, builds the same GPT and SimpleFSDP shards,
traces the joint graph itself (same code, same node names as the parent's
trace, which it checks), runs the unbucketed graph and every side of the
spec on its own batch, and reports per side: collectives, peak bytes, step
time (median over repeats of the slowest rank), and whether every output
is bitwise equal to the unbucketed graph's on every rank. It also checks
the unbucketed graph against plain autograd on the unsharded model (loss
and the SGD update, to float tolerance), so the joint graph itself is
known to be a training step.

    python3 fxrank.py SPEC.json OUT.json      # one rank (env as above)
"""

import copy
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, ".."))


def batch_for(rank, vocab, batch, seq):
    import torch
    g = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def build(spec, rank, world, group):
    """(fsdp, model copy before sharding, batch, joint) for one rank."""
    import gorun.fx as gfx
    mk = dict(spec["model"])
    blocks = None
    if mk.pop("kind", "gpt") == "torchtitan-llama3":
        m, blocks = torchtitan_llama3(**mk)
        mk["vocab"] = m.m.config.vocab_size
    else:
        from tinymodels import gpt
        m, _ = gpt(**mk)
    ref = copy.deepcopy(m)
    batch = batch_for(rank, mk.get("vocab", 128), spec.get("batch", 4), spec.get("seq", 32))
    fsdp = gfx.SimpleFSDP(m, world, rank, group, mode=spec.get("mode", "shard"))
    joint = gfx.trace_joint(fsdp, batch, lr=spec.get("lr", 0.01), blocks=blocks)
    return fsdp, ref, batch, joint


def torchtitan_llama3(layers=2, seed=0):
    """torchtitan 0.3.0's llama3 "debugmodel" (dim 256, 16 heads, vocab
    2048; RMSNorm, fused QKV, complex RoPE, SwiGLU) cut to ``layers``
    blocks, as (module returning the mean cross-entropy, its blocks).
    torchtitan 0.3.0 supports only flex and varlen attention for language
    models, and flex attention has no backward on CPU: each block's inner
    attention is causal SDPA here, the rest is torchtitan's. Positions are
    left to the model (None: RoPE over 0..T-1). Needs torchtitan (not a
    test dependency: the bench adds this graph on request)."""
    import torch
    from torchtitan.models.llama3 import llama3_configs
    torch.manual_seed(seed)
    cfg = llama3_configs["debugmodel"](attn_backend="flex")
    cfg.layers = cfg.layers[:layers]
    m = cfg.build()
    m.init_states() if hasattr(m, "init_states") else None

    class Causal(torch.nn.Module):
        def forward(self, q, k, v, attention_masks=None, **kw):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                enable_gqa=kw.get("enable_gqa", False)).transpose(1, 2)

    for mod in m.modules():
        if hasattr(mod, "inner_attention"):
            mod.inner_attention = Causal()

    class Loss(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, tokens, labels):
            return torch.nn.functional.cross_entropy(self.m(tokens, None, None).flatten(0, 1), labels.flatten())

    names = [n for n, _ in m.named_children()]
    blocks = ["m." + n for n in names if n != "layers"]
    blocks[1:1] = ["m.layers.%d" % i for i in range(len(m.layers))]
    return Loss(m), blocks


def reference_check(fsdp, ref, batch, outs, lr, world):
    """The joint graph's loss and updated shards against autograd on the
    unsharded model with gradients summed over ranks."""
    import torch
    import torch.distributed as dist
    loss = ref(*batch)
    names = fsdp.names
    params = dict(ref.named_parameters())
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    ok = torch.allclose(outs[0], loss.detach(), rtol=1e-5, atol=1e-6)
    for i, (n, g) in enumerate(zip(names, grads)):
        g = g.detach().reshape(-1).clone()
        dist.all_reduce(g)
        numel = g.numel()
        k = fsdp.shards[i].numel()
        full = params[n].detach().reshape(-1) - lr * g
        full = torch.nn.functional.pad(full, (0, max(0, k * world - numel)))
        r = 0 if fsdp.mode == "replicate" else fsdp.rank  # a replica holds the whole parameter
        want = full[r * k:(r + 1) * k]
        ok = ok and torch.allclose(outs[1 + i], want, rtol=1e-4, atol=1e-6)
    return bool(ok)


def reorder_bound(joint, inputs, world):
    """Per output of the joint graph, how far a plan that sums the partial
    sums over the batch in another order (the chunk pass in backward) may
    move it: None where no such sum reaches it (the output must be bitwise
    equal), else a tensor bound.

    Every weight gradient is a sum of n products (n = the rows of every
    rank's batch); any two summation orders of the same terms differ by at
    most 2·γ(n)·Σ|terms| per element (γ(n) = n·u / (1 − n·u), u = 2⁻²⁴),
    whatever blocking or FMA either uses. Σ|terms| is computed here by
    running the unchunked graph once more with a shadow |·| of each sum:
    mm(|a|, |b|) for a matmul that contracts the batch, Σ|g·x̂| and Σ|g| for
    a layer norm's weight and bias gradients, carried through the linear
    ops after them (views, pads, adds, the reduce-scatter itself, the SGD
    update's scaling by lr). The SGD update rounds twice after the sum:
    one ulp of lr·g and one of the new shard are added."""
    import operator
    import torch
    import gorun.fx as gfx
    aten = torch.ops.aten
    lay = gfx.chunk_layout(joint, 2)
    ph = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
    rows = inputs[len(ph) - joint.n_batch].numel() * world
    u = 2.0 ** -24
    gamma = rows * u / (1 - rows * u)
    env, shadow = {}, {}
    for n, x in zip(ph, inputs):
        env[n] = x
    for n in joint.gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":  # a constant of the graph (a RoPE table)
            env[n] = getattr(joint.gm, n.target)
            continue
        a = torch.fx.node.map_arg(n.args, env.__getitem__)
        if n.op == "output":
            outs = []
            for o, v in zip(n.args[0], a[0]):
                sh = shadow.get(o)
                if sh is None:
                    outs.append(None)
                else:
                    ulp = lambda t: torch.nextafter(t.abs(), torch.tensor(float("inf"))) - t.abs()  # noqa: E731
                    outs.append(2.01 * gamma * sh + ulp(sh) + 2 * ulp(v))
            return outs
        env[n] = n.target(*a, **torch.fx.node.map_arg(n.kwargs, env.__getitem__))
        sh_in = [x for x in n.all_input_nodes if x in shadow]
        t = n.target
        if t is aten.mm.default and lay.value.get(n.name) == ("partial", None):
            shadow[n] = torch.mm(a[0].abs(), a[1].abs())
        elif t is aten.sum.dim_IntList and not sh_in and lay.value.get(n.name) == ("partial", None):
            shadow[n] = torch.sum(a[0].abs(), *a[1:])  # an RMSNorm's weight gradient
        elif t is operator.getitem and n.args[0].target is aten.native_layer_norm_backward.default \
                and n.args[1] in (1, 2):
            g, x, ns, mean, rstd = (env[y] if isinstance(y, torch.fx.Node) else y for y in n.args[0].args[:5])
            lead = list(range(g.dim() - len(ns)))
            term = (g * (x - mean) * rstd).abs() if n.args[1] == 1 else g.abs()
            shadow[n] = term.sum(lead)
        elif t is operator.getitem:
            continue
        elif not sh_in:
            continue
        elif t in (aten.add.Tensor, aten.sub.Tensor):
            shadow[n] = sum(shadow[x] for x in sh_in)
        elif t in (aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar):
            other = [y for y in n.args if y is not sh_in[0]]
            o = env[other[0]] if isinstance(other[0], torch.fx.Node) else other[0]
            o = o.abs() if isinstance(o, torch.Tensor) else abs(o)
            shadow[n] = shadow[sh_in[0]] * o if t in (aten.mul.Tensor, aten.mul.Scalar) else shadow[sh_in[0]] / o
        elif t is gfx.WAIT or t in (aten.view.default, aten._unsafe_view.default, aten.t.default, aten.clone.default,
                                    aten.constant_pad_nd.default, aten.transpose.int, aten.permute.default,
                                    aten.alias.default, aten.sum.dim_IntList, gfx.REDUCE_SCATTER, gfx.ALL_REDUCE):
            b = list(n.args)
            b[0] = shadow[n.args[0]]
            b = torch.fx.node.map_arg(b, lambda y: shadow.get(y, env[y]))
            shadow[n] = n.target(*b, **n.kwargs)
        else:
            raise SystemExit("fxrank: reorder_bound: no shadow rule for %s (reads %s)" % (n.format_node(),
                                                                                          sh_in[0].name))
    raise SystemExit("fxrank: reorder_bound: graph has no output")


def rank_main(spec_path, out_path):
    import torch
    import torch.distributed as dist
    import gorun.fx as gfx
    torch.set_num_threads(1)
    with open(spec_path) as f:
        spec = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = dist.group.WORLD.group_name
    if spec.get("calibrate"):
        m = gfx.calibrate_comm(group, world)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(m, f)
        dist.destroy_process_group()
        return
    fsdp, ref, batch, joint = build(spec, rank, world, group)
    names = [n.name for n in joint.gm.graph.nodes]
    if names != spec["fx_nodes"]:
        raise SystemExit("fxrank: rank %d traced a different graph than the parent (%d vs %d nodes)"
                         % (rank, len(names), len(spec["fx_nodes"])))
    inputs = gfx.Joint.inputs(fsdp, batch)
    base, base_peak = gfx.run_graph(joint.gm, inputs)
    plans = {}
    if spec.get("plan_on_rank"):
        # Each rank calibrates on the real group and plans its own trace:
        # by default with the calibration, and with gorun_plan's defaults.
        comm = gfx.calibrate_comm(group, world)
        step = spec.get("step") or gfx.to_step_graph(joint)  # the parent's profiled one: the same on every rank
        for side in spec["sides"]:
            if side["kind"] == "gorun" and "planned" not in side:
                side["planned"], summ = gfx.plan(step, side["passes"], comm=side.get("comm"))
                plans[side["name"]] = {"hash": summ["hash"], "comm": summ["comm"]}
        plans["measured"] = comm
    ref_ok = reference_check(fsdp, ref, batch, base, spec.get("lr", 0.01), world)
    bound = reorder_bound(joint, inputs, world) if any(s.get("bound") for s in spec["sides"]) else None
    built, side_outs = [], []
    for side in spec["sides"]:
        est = side.get("exposed_ns")
        kind = side["kind"]
        if kind == "unbucketed":
            gm = joint.gm
        elif kind == "gorun":
            gm = gfx.apply_plan(joint, side["planned"])
        elif kind == "inductor-bucketing":
            gm = gfx.inductor_bucketing(copy.deepcopy(joint.gm))
        elif kind == "inductor-overlap":
            gm, est = gfx.inductor_overlap(copy.deepcopy(joint.gm), side.get("costs"))
        else:
            raise SystemExit("fxrank: unknown side kind %r" % kind)
        if side.get("compile"):
            # torch.compile of the rewritten graph (backend named by the side);
            # run_graph walks FX nodes, so a compiled side is run as a callable.
            compiled = torch.compile(gm, backend=side["compile"], fullgraph=True)
            outs, peak = list(compiled(*inputs)), 0
            gm = _Compiled(gm, compiled)
        else:
            outs, peak = gfx.run_graph(gm, inputs)
        # "equal_to": compare with an earlier side's outputs (a compiled
        # graph with the compiled unbucketed one) instead of the unbucketed graph's
        ref = base if side.get("equal_to") is None else side_outs[side["equal_to"]]
        side_outs.append(outs)
        equal = len(outs) == len(ref) and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(outs, ref))
        side["max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(outs, base))
        # outputs (0: the loss, 1+i: shard i) not bitwise equal to the unbucketed graph's, on this rank
        side["unequal"] = [i for i, (a, b) in enumerate(zip(outs, base)) if not torch.equal(a, b)]
        if side.get("bound"):
            # within: every output bitwise equal or, where a reordered sum
            # reaches it, within reorder_bound; ratio: the largest |diff| / bound
            side["within_bound"], side["bound_ratio"] = True, 0.0
            for a, b, bd in zip(outs, base, bound):
                d = (a - b).abs()
                if bd is None:
                    side["within_bound"] &= bool(torch.equal(a, b))
                    continue
                side["within_bound"] &= bool((d <= bd).all())
                nz = d > 0
                if nz.any():
                    side["bound_ratio"] = max(side["bound_ratio"], float((d[nz] / bd[nz]).max()))
        built.append((side, gm, est, peak, equal))
    # Timing: the sides interleaved round by round, so load on a shared
    # machine falls on all of them alike; the slowest rank's time counts.
    times = [[] for _ in built]
    for _ in range(spec.get("repeats", 5)):
        for k, (_, gm, _, _, _) in enumerate(built):
            dist.barrier()
            t0 = time.perf_counter()
            gm(*inputs)
            times[k].append(time.perf_counter() - t0)
    results = []
    for k, (side, gm, est, peak, equal) in enumerate(built):
        flags = torch.tensor([0.0 if equal else 1.0, float(peak)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        t = torch.tensor(times[k], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        uneq = [None] * world
        dist.all_gather_object(uneq, (side["unequal"], side.get("within_bound"), side.get("bound_ratio")))
        bound_res = {}
        if side.get("bound"):
            bound_res = {"within_bound": all(u[1] for u in uneq), "bound_ratio": max(u[2] for u in uneq)}
        uneq = [u[0] for u in uneq]
        results.append({"name": side["name"], "collectives": gfx.count_collectives(gm), "peak_bytes": int(flags[1]),
                        "unequal": sorted({i for u in uneq for i in u}),
                        "equal": flags[0].item() == 0.0, "step_s": sorted(t.tolist())[len(times[k]) // 2],
                        "exposed_ns": est, "max_abs_diff": side["max_abs_diff"], **bound_res})
    okt = torch.tensor([0.0 if ref_ok else 1.0])
    dist.all_reduce(okt, op=dist.ReduceOp.MAX)
    every = [None] * world  # every rank's plans, to check that they agree
    dist.all_gather_object(every, plans)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"world": world, "reference_ok": okt.item() == 0.0, "base_peak_bytes": base_peak,
                       "sides": results, "plans": every}, f)
    dist.destroy_process_group()


class _Compiled:
    """A compiled side: called like its GraphModule, counted by its graph."""

    def __init__(self, gm, fn):
        self.graph, self._fn = gm.graph, fn

    def __call__(self, *args):
        return self._fn(*args)


def free_port():
    # Below the kernel's ephemeral range, as the other torchrun-style tests pick.
    for _ in range(50):
        port = 20000 + (os.getpid() * 7919 + int(time.time() * 1000)) % 10000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                time.sleep(0.01)
    raise RuntimeError("fxrank: no free port")


def run_ranks(world, spec, timeout=300):
    """Starts ``world`` ranks as plain subprocesses with a torchrun-style
    environment, waits for all of them (killing all on timeout or on the
    first failure), and returns rank 0's report."""
    with tempfile.TemporaryDirectory(prefix="gorun-fxrank-") as d:
        sp, op = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        port = free_port()
        procs = []
        try:
            for r in range(world):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                           PYTHONWARNINGS="ignore", TORCH_CPP_LOG_LEVEL="ERROR",
                           PYTHONPATH=PYDIR + os.pathsep + HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), sp, op], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout
            outs = [b""] * world
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for i, p in enumerate(procs):
                outs[i] = p.communicate()[0]
        codes = [p.returncode for p in procs]
        if any(c != 0 for c in codes):
            raise RuntimeError("fxrank: ranks exited %s; rank outputs:\n%s" % (codes, "\n".join(
                "--- rank %d ---\n%s" % (i, o.decode(errors="replace")[-3000:]) for i, o in enumerate(outs))))
        with open(op) as f:
            return json.load(f)


if __name__ == "__main__":
    sys.path[:0] = [PYDIR, HERE]
    rank_main(sys.argv[1], sys.argv[2])
    # torch 2.15 over gloo aborts now and then at interpreter exit after a
    # finished run ("terminate called without an active exception": gloo's
    # worker threads are torn down after the interpreter). The group is
    # destroyed and the output written, so the program leaves past teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def fake_group(world):
    """A context in which torch's fake process group of ``world`` ranks is
    the default group (tracing and planning need no peers)."""
    import contextlib
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    @contextlib.contextmanager
    def ctx():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        try:
            yield dist.group.WORLD.group_name
        finally:
            dist.destroy_process_group()
    return ctx()


def prepare(spec, world, profile=True, chunks=None):
    """In the parent: trace rank 0's joint graph on the fake group, profile
    it, and return (joint, costs, step graph); records the FX node names
    in spec["fx_nodes"] for the ranks to check."""
    import gorun.fx as gfx
    with fake_group(world) as group:
        fsdp, _, batch, joint = build(spec, 0, world, group)
        costs = gfx.profile_costs(joint, batch, fsdp, repeats=spec.get("profile_repeats", 3)) if profile else None
        step = gfx.to_step_graph(joint, costs, chunks=chunks)
    spec["fx_nodes"] = [n.name for n in joint.gm.graph.nodes]
    return joint, costs, step
