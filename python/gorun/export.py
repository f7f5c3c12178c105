"""Exports a torch model's training step as a gorun step graph
(stepgraph/SCHEMA.md, "gorun.stepgraph/v1") for ``gorun plan``.

    import gorun.export
    g = gorun.export.step_graph(model, example_input, world_size=4, mode="dp")
    gorun.export.save(g, "step.json")          # then: gorun plan step.json

    python3 -m gorun.export mypkg.models:make -o step.json --world-size 4 --mode sharded

How: the training step is traced as one joint graph (gorun.fx): forward,
loss, backward and an SGD update, all aten ops, with make_fx on fake
tensors. The parameters are wrapped SimpleFSDP-style, so the step's
collectives are nodes of the traced graph:

- mode "dp" (DDP): every parameter whole on every rank; its gradient
  all-reduced (``_c10d_functional.all_reduce`` + ``wait_tensor``) when
  autograd has produced it;
- mode "sharded" (FSDP-style): every parameter a flat shard of
  1/world_size, all-gathered in forward by the module that uses it and its
  gradient reduce-scattered in backward. Each block's gathers are issued
  one block ahead.

Every traced op becomes a compute node; regions are the blocks — each
child of an nn.ModuleList or nn.Sequential (``layers.0``), and the model's
other direct children (``embed``, ``head``) — read from the ops' module
stacks, forward and backward alike; directions come from autograd. A
parameter shared by several modules (tied embeddings) is one parameter,
one collective, read by each region that uses it. Costs are measured: the
traced graph is run on the example input and every op timed (median of
three). The loss is the model's output when that is a scalar, else
``output.float().pow(2).mean()`` (``loss_fn`` overrides it).

Tracing needs a process group only for its name; when none is initialised
a fake one of ``world_size`` ranks is used for the trace.
"""

import argparse
import contextlib
import copy
import importlib
import json
import sys

import torch

SCHEMA = "gorun.stepgraph/v1"
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
           torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}


class ExportError(ValueError):
    """The model or the arguments cannot be exported; the text says why."""


def _blocks(model):
    """The block paths: children of ModuleLists/Sequentials (recursively
    inside direct children), else the direct children themselves."""
    out = []

    def walk(prefix, m):
        for name, c in m.named_children():
            path = prefix + name
            if isinstance(c, (torch.nn.ModuleList, torch.nn.Sequential)) and len(c) > 0:
                out.extend(path + "." + k for k, _ in c.named_children())
            elif prefix == "":
                out.append(path)
    walk("", model)
    return out


def _block_of(path, blocks):
    for b in blocks:
        if path == b or path.startswith(b + "."):
            return b
    return None


def _mean_square(out):
    return out.float().pow(2).mean()


class _WithLoss(torch.nn.Module):
    """The model with its loss: forward returns a scalar."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x):
        out = self.model(x)
        return out if isinstance(out, torch.Tensor) and out.dim() == 0 else self.loss_fn(out)


@contextlib.contextmanager
def _process_group(world_size):
    """The default group's name; a fake group of world_size ranks for the
    trace when none exists."""
    import torch.distributed as dist
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ExportError("gorun.export: world_size %d, but the initialised process group has %d ranks"
                              % (world_size, dist.get_world_size()))
        yield dist.group.WORLD.group_name
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def step_graph(model, example_input, world_size=1, mode="dp", group="dp", blocks=None, loss_fn=None,
               profile=True, prefetch=1):
    """Returns the step graph (a dict in gorun's JSON schema) of training
    ``model`` on batches like ``example_input`` (one rank's batch) on
    ``world_size`` ranks; ``mode`` is "dp" or "sharded". A copy of the
    model is wrapped and traced; ``model`` itself is left as it is."""
    if mode not in ("dp", "sharded"):
        raise ExportError("gorun.export: mode %r: want 'dp' or 'sharded'" % mode)
    if world_size < 1:
        raise ExportError("gorun.export: world_size %d < 1" % world_size)
    import gorun.fx as gfx
    blocks = list(blocks) if blocks is not None else _blocks(model)
    if not blocks:
        raise ExportError("gorun.export: %s has no child modules to make blocks of" % type(model).__name__)
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) > 1:
        raise ExportError("gorun.export: parameters of several dtypes %s; one collective dtype is needed"
                          % sorted(str(d) for d in dtypes))
    if dtypes and next(iter(dtypes)) not in _DTYPES:
        raise ExportError("gorun.export: parameter dtype %s has no step-graph dtype" % next(iter(dtypes)))
    wrapped = _WithLoss(copy.deepcopy(model), loss_fn or _mean_square)  # deepcopy keeps ties
    # Block paths are the model's; inside the wrapper they sit under "model.".
    inner_blocks = ["model." + b for b in blocks]
    with _process_group(world_size) as pg:
        fsdp = gfx.SimpleFSDP(wrapped, world_size, 0, pg, mode="shard" if mode == "sharded" else "replicate")
        try:
            joint = gfx.trace_joint(fsdp, (example_input,), blocks=inner_blocks)
        except gfx.FxError as e:
            raise ExportError(str(e).replace("gorun.fx", "gorun.export")) from e
        except Exception as e:  # make_fx's own errors say which op or construct it cannot trace
            raise ExportError("gorun.export: cannot trace %s's training step: %s: %s"
                              % (type(model).__name__, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))\
                from e
        costs = gfx.profile_costs(joint, (example_input,), fsdp) if profile else None
    g = gfx.to_step_graph(joint, costs, prefetch=prefetch, group=group)
    strip = len("model.")
    g["regions"] = [r[strip:] for r in g["regions"]]
    for n in g["nodes"]:
        if n.get("region", "").startswith("model."):
            n["region"] = n["region"][strip:]
    return g


def save(graph, path):
    with open(path, "w") as f:
        json.dump(graph, f, indent=1)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m gorun.export",
                                 description="Write a torch model's training step as a gorun step graph.")
    ap.add_argument("factory", help="MODULE:FUNCTION returning (model, example_input) for one rank")
    ap.add_argument("-o", "--output", required=True, help="the JSON file to write")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--mode", choices=["dp", "sharded"], default="dp")
    ap.add_argument("--group", default="dp", help="the process group's name in the graph")
    ap.add_argument("--no-profile", action="store_true", help="do not time the ops (every compute costs 1 ns)")
    a = ap.parse_args(argv)
    mod, _, fn = a.factory.partition(":")
    if not fn:
        ap.error("factory %r: want MODULE:FUNCTION" % a.factory)
    try:
        model, example = getattr(importlib.import_module(mod), fn)()
        g = step_graph(model, example, a.world_size, a.mode, a.group, profile=not a.no_profile)
    except ExportError as e:
        print(e, file=sys.stderr)
        return 1
    save(g, a.output)
    starts = sum(1 for n in g["nodes"] if n["kind"] == "start")
    print("gorun.export: %s: %d regions, %d nodes, %d collectives (%s, %d ranks)"
          % (a.output, len(g["regions"]), len(g["nodes"]), starts, a.mode, a.world_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
