"""Exports a torch model's training step as a gorun step graph
(stepgraph/SCHEMA.md, "gorun.stepgraph/v1") for ``gorun plan``.

    import gorun.export
    g = gorun.export.step_graph(model, example_input, world_size=4, mode="dp")
    gorun.export.save(g, "step.json")          # then: gorun plan step.json

    python3 -m gorun.export mypkg.models:make -o step.json --world-size 4 --mode sharded

How: torch.fx traces the model's forward with a tracer that records, for
every traced operation, the module path it ran under; ShapeProp runs the
example input through the traced graph for every tensor's size. Operations
are grouped into blocks — each child of an nn.ModuleList or nn.Sequential
(``layers.0``), and the model's other direct children (``embed``, ``head``) —
in the order the forward reaches them. Each block becomes a forward compute
node, and, in reverse order, a backward one; parameters belong to the block
whose path contains them. Then the collectives of data-parallel training are
added (traced graphs contain none):

- mode "dp" (DDP): after each block's backward, one all_reduce start per
  parameter gradient (``gorun plan``'s bucketing merges them), their waits
  before the optimizer;
- mode "sharded" (FSDP-style): each block's parameters live as shards of
  1/world_size; an all_gather before the block's forward (started one block
  ahead) and a reduce_scatter of its gradients after its backward.

Costs are estimates, not measurements: multiply-adds of linear layers and
matmuls (from the traced shapes) at ``flops_per_ns`` (default 2, about one
core of this kind of machine), other operations at one element per ns;
backward costs twice the forward. ``gorun plan`` uses them only to order and
size buckets and to simulate exposed communication.
"""

import argparse
import importlib
import json
import math
import sys

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

SCHEMA = "gorun.stepgraph/v1"
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
           torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}


class ExportError(ValueError):
    """The model or the arguments cannot be exported; the text says why."""


class _PathTracer(torch.fx.Tracer):
    """An fx tracer that stamps every node with the module path it was
    created under (torch 1.13's nodes carry no module stack)."""

    def __init__(self):
        super().__init__()
        self._paths = [""]

    def call_module(self, m, forward, args, kwargs):
        self._paths.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self._paths.pop()

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        n = super().create_node(kind, target, args, kwargs, name, type_expr)
        n.meta["gorun_path"] = self._paths[-1] if kind != "call_module" else str(target)
        return n


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


def _flops(node, mod):
    """Multiply-adds × 2 of a traced node, or None when not a matmul."""
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return None
    out = math.prod(meta.shape)
    if node.op == "call_module":
        m = mod.get_submodule(node.target)
        if isinstance(m, torch.nn.Linear):
            return 2 * out * m.in_features
    if node.op in ("call_function", "call_method") and node.target in (torch.matmul, torch.bmm, "matmul", "bmm",
                                                                        torch.Tensor.matmul):
        a = node.args[0]
        am = a.meta.get("tensor_meta") if isinstance(a, torch.fx.Node) else None
        if am is not None and hasattr(am, "shape") and len(am.shape) >= 1:
            return 2 * out * am.shape[-1]
    return None


def step_graph(model, example_input, world_size=1, mode="dp", group="dp", flops_per_ns=2.0, blocks=None):
    """Returns the step graph (a dict in gorun's JSON schema) of training
    ``model`` on batches like ``example_input`` (one rank's batch) on
    ``world_size`` ranks; ``mode`` is "dp" or "sharded"."""
    if mode not in ("dp", "sharded"):
        raise ExportError("gorun.export: mode %r: want 'dp' or 'sharded'" % mode)
    if world_size < 1:
        raise ExportError("gorun.export: world_size %d < 1" % world_size)
    tracer = _PathTracer()
    try:
        graph = tracer.trace(model)
    except Exception as e:  # fx's own errors say which construct it cannot trace
        raise ExportError("gorun.export: torch.fx cannot trace %s: %s" % (type(model).__name__, e)) from e
    gm = torch.fx.GraphModule(model, graph)
    ShapeProp(gm).propagate(example_input)
    blocks = list(blocks) if blocks is not None else _blocks(model)
    if not blocks:
        raise ExportError("gorun.export: %s has no child modules to make blocks of" % type(model).__name__)

    # Forward cost per block, in the order the forward reaches the blocks.
    order, cost = [], {}
    for n in graph.nodes:
        b = _block_of(n.meta.get("gorun_path", ""), blocks)
        if b is None or n.op in ("placeholder", "output", "get_attr"):
            continue
        if b not in cost:
            order.append(b)
            cost[b] = 0.0
        f = _flops(n, gm)
        if f is not None:
            cost[b] += f / flops_per_ns
        else:
            meta = n.meta.get("tensor_meta")
            cost[b] += math.prod(meta.shape) if meta is not None and hasattr(meta, "shape") else 0
    # Parameters per block, in module order; a parameter outside every
    # traced block (unused in forward) is left out.
    params = {b: [] for b in order}
    dtypes = set()
    for name, p in model.named_parameters():
        b = _block_of(name, order)
        if b is not None and p.requires_grad:
            params[b].append((name, p))
            dtypes.add(p.dtype)
    if len(dtypes) > 1:
        raise ExportError("gorun.export: parameters of several dtypes %s; one collective dtype is needed"
                          % sorted(str(d) for d in dtypes))
    pdt = dtypes.pop() if dtypes else torch.float32
    if pdt not in _DTYPES:
        raise ExportError("gorun.export: parameter dtype %s has no step-graph dtype" % pdt)
    dt, es = _DTYPES[pdt], torch.tensor([], dtype=pdt).element_size()

    def shard_bytes(p):
        return int(math.ceil(p.numel() / world_size)) * es

    act_bytes = {}
    for n in graph.nodes:
        b = _block_of(n.meta.get("gorun_path", ""), order)
        meta = n.meta.get("tensor_meta")
        if b is not None and meta is not None and hasattr(meta, "shape"):
            act_bytes[b] = math.prod(meta.shape) * torch.tensor([], dtype=meta.dtype).element_size()
    in_bytes = example_input.numel() * example_input.element_size()

    tensors = [{"name": "batch", "bytes": in_bytes, "input": True, "chunk": "batch"}]
    nodes = []
    for b in order:
        for name, p in params[b]:
            if mode == "dp":
                tensors.append({"name": "p." + name, "bytes": p.numel() * es, "input": True})
            else:
                tensors.append({"name": "p." + name + ".shard", "bytes": shard_bytes(p), "input": True})

    def gather(b, region):
        ps = params[b]
        if not ps:
            return None
        nodes.append({"name": "ag." + b, "kind": "start", "direction": "forward", "region": region,
                      "op": "all_gather", "group": group, "dtype": dt,
                      "members": [{"in": "p." + n + ".shard", "out": "p." + n, "bytes": shard_bytes(p)}
                                  for n, p in ps]})
        return "ag." + b

    # Forward. Sharded: gather block i+1's parameters while block i computes.
    prev = "batch"
    pending = gather(order[0], order[0]) if mode == "sharded" else None
    for i, b in enumerate(order):
        nxt = None
        if mode == "sharded" and i + 1 < len(order):
            nxt = gather(order[i + 1], b)
        if pending:
            nodes.append({"name": pending + ".wait", "kind": "wait", "direction": "forward", "region": b,
                          "of": pending})
        nodes.append({"name": "fwd." + b, "kind": "compute", "direction": "forward", "region": b,
                      "cost_ns": max(1, int(cost[b])),
                      "reads": [prev] + ["p." + n for n, _ in params[b]], "writes": ["act." + b]})
        tensors.append({"name": "act." + b, "bytes": act_bytes.get(b, 0)})
        prev, pending = "act." + b, nxt
    nodes.append({"name": "loss", "kind": "compute", "direction": "forward", "region": order[-1],
                  "cost_ns": max(1, act_bytes.get(order[-1], 0) // max(es, 1)), "reads": [prev],
                  "writes": ["loss"]})

    # Backward, blocks in reverse; each block's gradient collectives start
    # right after its backward.
    grad_in = "loss"
    waits = []
    for b in reversed(order):
        writes = ["d." + b] + ["g." + n for n, _ in params[b]]
        nodes.append({"name": "bwd." + b, "kind": "compute", "direction": "backward", "region": b,
                      "cost_ns": max(1, int(2 * cost[b])),
                      "reads": [grad_in, "act." + b] + ["p." + n for n, _ in params[b]], "writes": writes})
        tensors.append({"name": "d." + b, "bytes": act_bytes.get(b, 0)})
        for n, p in params[b]:
            tensors.append({"name": "g." + n, "bytes": p.numel() * es, "chunk": "partial"})
            if mode == "dp":
                start = {"name": "ar." + n, "kind": "start", "direction": "backward", "region": b,
                         "op": "all_reduce", "group": group, "dtype": dt,
                         "members": [{"in": "g." + n, "out": "G." + n, "bytes": p.numel() * es}]}
            else:
                # reduce_scatter's member bytes are the full input per rank;
                # the gradient is padded to a whole number of shards.
                start = {"name": "rs." + n, "kind": "start", "direction": "backward", "region": b,
                         "op": "reduce_scatter", "group": group, "dtype": dt,
                         "members": [{"in": "g." + n, "out": "G." + n + ".shard",
                                      "bytes": shard_bytes(p) * world_size}]}
            nodes.append(start)
            waits.append((start["name"], b, start["members"][0]["out"]))
        grad_in = "d." + b
    for name, b, _ in waits:
        nodes.append({"name": name + ".wait", "kind": "wait", "direction": "optimizer", "region": b, "of": name})
    nodes.append({"name": "optimizer", "kind": "compute", "direction": "optimizer",
                  "cost_ns": max(1, sum(p.numel() for b in order for _, p in params[b]) // max(world_size if mode == "sharded" else 1, 1)),
                  "reads": [out for _, _, out in waits], "writes": ["updated"]})
    return {"schema": SCHEMA, "groups": [{"name": group, "size": world_size}], "regions": order,
            "tensors": tensors, "nodes": nodes}


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
    ap.add_argument("--flops-per-ns", type=float, default=2.0)
    a = ap.parse_args(argv)
    mod, _, fn = a.factory.partition(":")
    if not fn:
        ap.error("factory %r: want MODULE:FUNCTION" % a.factory)
    try:
        model, example = getattr(importlib.import_module(mod), fn)()
        g = step_graph(model, example, a.world_size, a.mode, a.group, a.flops_per_ns)
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
