"""The plan from the model the runtime sees: regions, members, costs → a
step graph (stepgraph/SCHEMA.md) → gorun's planner → the planned graph the
executor runs.

Regions are module paths: the root's children, with block lists (ModuleList,
Sequential, ModuleDict, and any module holding one) opened so that each
block is a region of its own. Members are the trainable parameters, one per
tensor: a tied parameter (one tensor under several names) is one member,
read by every region that holds one of its names. Its gradient is complete
only after the last of those regions has run backward, so its collective
belongs to the reader that comes first in forward order.
"""

import hashlib
import json

import torch.nn as nn

from .. import _planner

ROOT = "<root>"  # the region of parameters registered on the root module itself

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)

DTYPES = {"torch.float32": "f32", "torch.float64": "f64", "torch.bfloat16": "bf16", "torch.float16": "f16"}


_LISTS = (nn.ModuleList, nn.ModuleDict)


def _holds_list(m):
    return any(isinstance(c, _LISTS) for c in m.modules() if c is not m)


def find_regions(model):
    """[(fqn, module)] in registration order; ROOT first if the root holds
    parameters of its own. A block list's children are regions whatever
    they hold (a block's own Sequential MLP stays inside it); a module
    above a block list (a `transformer` holding `h`) is opened."""
    out = []
    if any(True for _ in model.named_parameters(recurse=False)):
        out.append((ROOT, model))

    def blocks(prefix, c):
        for bn, b in c.named_children():
            if isinstance(b, _LISTS):
                blocks(prefix + bn + ".", b)
            else:
                out.append((prefix + bn, b))

    def walk(prefix, m):
        for name, c in m.named_children():
            fqn = prefix + name
            if isinstance(c, _CONTAINERS):
                blocks(fqn + ".", c)
            elif _holds_list(c):
                if any(True for _ in c.named_parameters(recurse=False)):
                    out.append((fqn, c))
                walk(fqn + ".", c)
            else:
                out.append((fqn, c))

    walk("", model)
    return out


def region_of(name, regions):
    """The region a parameter name belongs to: the longest region path that
    is a module prefix of it (ROOT when none is)."""
    best, blen = ROOT, -1
    for r in regions:
        if r != ROOT and name.startswith(r + ".") and len(r) > blen:
            best, blen = r, len(r)
    return best


class Member:
    """One trainable tensor: its first name, every region that reads it."""

    def __init__(self, name, param, readers):
        self.name = name
        self.param = param
        self.readers = readers  # region names, registration order
        self.bytes = param.numel() * param.element_size()
        self.dtype = DTYPES.get(str(param.dtype))
        if self.dtype is None:
            raise TypeError("gorun.torch: parameter %r is %s; float32, float64, bfloat16 and float16 are supported"
                            % (name, param.dtype))


def find_members(model, region_names):
    """Trainable parameters as members, tied ones once (named_parameters
    with remove_duplicate=False gives every alias)."""
    by_id = {}
    order = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            continue
        m = by_id.get(id(p))
        r = region_of(name, region_names)
        if m is None:
            m = by_id[id(p)] = Member(name, p, [r])
            order.append(m)
        elif r not in m.readers:
            m.readers.append(r)
    return order


def fingerprint(model):
    """A hash of what every rank must share before a plan exists: parameter
    and buffer names, shapes, dtypes, which ones train, and which are tied."""
    h = hashlib.blake2b(digest_size=8)
    ids = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        alias = ids.setdefault(id(p), len(ids))
        h.update(("%s|%s|%s|%s|%d\n" % (name, tuple(p.shape), p.dtype, p.requires_grad, alias)).encode())
    for name, b in model.named_buffers():
        h.update(("%s|%s|%s\n" % (name, tuple(b.shape), b.dtype)).encode())
    return int.from_bytes(h.digest(), "little")


def ddp_graph(order, members, fwd_ns, bwd_ns, world):
    """The step graph of one data-parallel step: forward and backward
    compute per region (measured costs), one all-reduce per gradient, issued
    in the region whose backward completes it, waited before the optimizer."""
    pos = {r: i for i, r in enumerate(order)}
    owned = {r: [] for r in order}
    tensors = [{"name": "x", "input": True}]
    for m in members:
        owner = min(m.readers, key=lambda r: pos[r])
        owned[owner].append(m)
        tensors.append({"name": "p/" + m.name, "bytes": m.bytes, "input": True})
    reads = {r: [] for r in order}
    for m in members:
        for r in m.readers:
            reads[r].append("p/" + m.name)
    nodes = []
    prev = "x"
    for r in order:
        nodes.append({"name": "fwd/" + r, "kind": "compute", "direction": "forward", "region": r,
                      "cost_ns": max(int(fwd_ns.get(r, 0)), 1000), "reads": [prev] + reads[r], "writes": ["a/" + r]})
        prev = "a/" + r
    nodes.append({"name": "loss", "kind": "compute", "cost_ns": 1000, "reads": [prev], "writes": ["d/loss"]})
    dprev = "d/loss"
    starts = []
    for i in range(len(order) - 1, -1, -1):
        r = order[i]
        act = "a/" + order[i - 1] if i > 0 else "x"
        # Autograd finishes a region's gradients roughly in reverse
        # registration order; the bucket starts when its last one is in.
        mine = list(reversed(owned[r]))
        nodes.append({"name": "bwd/" + r, "kind": "compute", "direction": "backward", "region": r,
                      "cost_ns": max(int(bwd_ns.get(r, 0)), 1000), "reads": [dprev, act] + reads[r],
                      "writes": ["d/" + r] + ["g/" + m.name for m in mine]})
        dprev = "d/" + r
        for m in mine:
            s = "ar/" + m.name
            starts.append(s)
            nodes.append({"name": s, "kind": "start", "direction": "backward", "region": r, "op": "all_reduce",
                          "group": "dp", "dtype": m.dtype,
                          "members": [{"in": "g/" + m.name, "out": "G/" + m.name, "bytes": m.bytes}]})
    for s in starts:
        nodes.append({"name": s + ".w", "kind": "wait", "direction": "optimizer", "of": s})
    nodes.append({"name": "opt", "kind": "compute", "direction": "optimizer", "cost_ns": 1000,
                  "reads": ["G/" + m.name for m in members] + [dprev], "writes": ["done"]})
    return {"schema": "gorun.stepgraph/v1", "groups": [{"name": "dp", "size": world}], "regions": list(order),
            "tensors": tensors, "nodes": nodes}


def run_planner(graph, passes="blocks,overlap", regather_ahead=0, options=None):
    """Plans graph (a dict) with gorun's passes, in process (libgorun's
    gorun_plan, with the GIL released); returns (the planned graph as JSON
    text, the planner's summary: buckets, estimates, peak bytes). The one
    place the planner is reached."""
    res = _planner.plan(graph, passes=passes, reshard_prefetch=regather_ahead, **(options or {}))
    planned = res.get("graph", graph)
    if not isinstance(planned, str):
        planned = json.dumps(planned)
    summary = res["plan"]
    summary["buckets_hash"] = res.get("buckets_hash")
    summary["hash"] = res.get("hash")
    return planned, summary


class Unit:
    """One flat shard: the trainable members owned by one region (their
    gradients complete in its backward), concatenated and padded to a
    multiple of the group size; each rank holds 1/size of it."""

    def __init__(self, region, members, world):
        self.region = region
        self.members = members
        dts = {m.param.dtype for m in members}
        if len(dts) != 1:
            raise TypeError("gorun.torch: region %r mixes parameter dtypes %s; fsdp mode flattens a region's "
                            "parameters into one shard of one dtype" % (region, sorted(map(str, dts))))
        self.dtype = members[0].param.dtype
        self.dtype_name = members[0].dtype
        self.es = members[0].param.element_size()
        self.numel = sum(m.param.numel() for m in members)
        self.padded = -(-self.numel // world) * world
        self.shard_numel = self.padded // world
        self.readers = []
        for m in members:
            for r in m.readers:
                if r not in self.readers:
                    self.readers.append(r)
        self.name = region


def units_of(order, members, world, replicated=(ROOT,)):
    """Members grouped into units by owner region (the first reader in
    forward order). Members owned by a region in replicated stay whole and
    are all-reduced (the root's own parameters are read all through the
    root's forward, so no module hook can free them)."""
    pos = {r: i for i, r in enumerate(order)}
    owned, rest = {}, []
    for m in members:
        owner = min(m.readers, key=lambda r: pos[r])
        if owner in replicated:
            rest.append(m)
        else:
            owned.setdefault(owner, []).append(m)
    return [Unit(r, owned[r], world) for r in order if r in owned], rest


def fsdp_graph(order, units, replicated, fwd_ns, bwd_ns, world, shard=None):
    """The step graph of one fully sharded step: before a region's forward,
    an all-gather of every unit it reads that is not gathered yet; after its
    backward, a reduce-scatter of every unit whose gradients it completes.
    The reshard pass decides what is gathered again for backward.

    Hybrid (shard < world): gathers and reduce-scatters run on group
    "shard" (shard ranks), and each reduced shard is then all-reduced on
    group "replica" (world/shard ranks): its wait comes before the next
    region's backward and the all-reduce starts right after it, since it
    reads the reduce-scatter's output. Parameters kept whole are
    all-reduced on group "dp" (every rank); in hybrid mode in two hops
    like the shards (on "shard", then on "replica" after its wait), so
    that no collective spans every rank: under fault tolerance no
    communicator does."""
    shard = shard or world
    sg = "shard" if shard < world else "dp"
    pos = {r: i for i, r in enumerate(order)}
    tensors = [{"name": "x", "input": True}]
    for u in units:
        tensors.append({"name": "s/" + u.name, "bytes": u.shard_numel * u.es, "input": True})
    for m in replicated:
        tensors.append({"name": "p/" + m.name, "bytes": m.bytes, "input": True})
    reads = {r: [] for r in order}
    for u in units:
        for r in u.readers:
            reads[r].append("F/" + u.name)
    for m in replicated:
        for r in m.readers:
            reads[r].append("p/" + m.name)
    nodes, starts = [], []
    gathered = set()
    prev = "x"
    for r in order:
        for u in units:
            if r in u.readers and u.name not in gathered:
                gathered.add(u.name)
                s = "ag/" + u.name
                nodes.append({"name": s, "kind": "start", "direction": "forward", "region": r, "op": "all_gather",
                              "group": sg, "dtype": u.dtype_name,
                              "members": [{"in": "s/" + u.name, "out": "F/" + u.name, "bytes": u.shard_numel * u.es}]})
                nodes.append({"name": s + ".w", "kind": "wait", "direction": "forward", "region": r, "of": s})
        nodes.append({"name": "fwd/" + r, "kind": "compute", "direction": "forward", "region": r,
                      "cost_ns": max(int(fwd_ns.get(r, 0)), 1000), "reads": [prev] + reads[r], "writes": ["a/" + r]})
        prev = "a/" + r
    nodes.append({"name": "loss", "kind": "compute", "cost_ns": 1000, "reads": [prev], "writes": ["d/loss"]})
    dprev = "d/loss"
    replicate = []  # reduce-scatters whose replica all-reduce follows the next backward region
    for i in range(len(order) - 1, -1, -1):
        r = order[i]
        act = "a/" + order[i - 1] if i > 0 else "x"
        for u in replicate:
            nodes.append({"name": u.first + ".w", "kind": "wait", "direction": "backward", "region": r,
                          "of": u.first})
            starts.append("ar/" + u.name)
            nodes.append({"name": "ar/" + u.name, "kind": "start", "direction": "backward", "region": r,
                          "op": "all_reduce", "group": "replica", "dtype": u.dtype_name,
                          "members": [{"in": "G/" + u.name, "out": "R/" + u.name, "bytes": u.shard_numel * u.es}]})
        replicate = []
        mine_u = [u for u in units if u.region == r]
        mine_m = [m for m in replicated if min(m.readers, key=lambda q: pos[q]) == r]
        nodes.append({"name": "bwd/" + r, "kind": "compute", "direction": "backward", "region": r,
                      "cost_ns": max(int(bwd_ns.get(r, 0)), 1000), "reads": [dprev, act] + reads[r],
                      "writes": ["d/" + r] + ["g/" + u.name for u in mine_u] + ["g/" + m.name for m in mine_m]})
        dprev = "d/" + r
        for u in mine_u:
            s = "rs/" + u.name
            nodes.append({"name": s, "kind": "start", "direction": "backward", "region": r, "op": "reduce_scatter",
                          "group": sg, "dtype": u.dtype_name,
                          "members": [{"in": "g/" + u.name, "out": "G/" + u.name, "bytes": u.padded * u.es}]})
            if shard < world:
                replicate.append(_SecondHop(u, s))
            else:
                starts.append(s)
        for m in mine_m:
            if shard < world:
                s = "sar/" + m.name
                replicate.append(_SecondHop(m))
            else:
                s = "ar/" + m.name
                starts.append(s)
            nodes.append({"name": s, "kind": "start", "direction": "backward", "region": r, "op": "all_reduce",
                          "group": sg, "dtype": m.dtype,
                          "members": [{"in": "g/" + m.name, "out": "G/" + m.name, "bytes": m.bytes}]})
    for u in replicate:  # the first region's: after its backward, before the optimizer
        nodes.append({"name": u.first + ".w", "kind": "wait", "direction": "optimizer", "of": u.first})
        starts.append("ar/" + u.name)
        nodes.append({"name": "ar/" + u.name, "kind": "start", "direction": "optimizer", "op": "all_reduce",
                      "group": "replica", "dtype": u.dtype_name,
                      "members": [{"in": "G/" + u.name, "out": "R/" + u.name, "bytes": u.shard_numel * u.es}]})
    for s in starts:
        nodes.append({"name": s + ".w", "kind": "wait", "direction": "optimizer", "of": s})
    final = "R/" if shard < world else "G/"
    nodes.append({"name": "opt", "kind": "compute", "direction": "optimizer", "cost_ns": 1000,
                  "reads": [final + u.name for u in units] + [final + m.name for m in replicated] + [dprev],
                  "writes": ["done"]})
    if shard < world:
        groups = [{"name": "replica", "size": world // shard}, {"name": "shard", "size": shard}]
    else:
        groups = [{"name": "dp", "size": world}]
    return {"schema": "gorun.stepgraph/v1", "groups": groups, "regions": list(order),
            "tensors": tensors, "nodes": nodes}


class _SecondHop:
    """What a hybrid plan all-reduces across replicas after the first hop
    within the shard group (first: that hop's start): a unit's reduced
    shard, or a parameter kept whole."""

    def __init__(self, x, first=None):
        self.name = x.name
        if isinstance(x, Unit):
            self.first, self.dtype_name, self.shard_numel, self.es = first, x.dtype_name, x.shard_numel, x.es
        else:
            self.first, self.dtype_name = "sar/" + x.name, x.dtype
            self.shard_numel, self.es = x.bytes, 1


REGATHER = "@bwd"  # the reshard pass's suffix on re-gathered outputs


def gather_schedule(planned):
    """What the runtime does around each compute of a planned graph, for the
    all-gathers (the collectives the program, not autograd, decides on):
    before[compute] lists ("start", [member ins]) and ("wait", out) actions
    in plan order; free_after[compute] the gathered outputs whose last
    reader it is; and the plan's peak of gathered bytes held at once (from
    a start to the last reader of its output)."""
    g = json.loads(planned) if isinstance(planned, str) else planned
    before, free_after, pending = {}, {}, []
    gathers = {}
    out_bytes = {}
    size = {gr["name"]: gr["size"] for gr in g["groups"]}
    for n in g["nodes"]:
        if n["kind"] == "start" and n["op"] == "all_gather":
            gathers[n["name"]] = n
            for mb in n["members"]:
                out_bytes[mb["out"]] = mb["bytes"] * size[n["group"]]
    last = {}
    for i, n in enumerate(g["nodes"]):
        if n["kind"] == "compute":
            for t in n.get("reads", []):
                if t in out_bytes:
                    last[t] = n["name"]
    held, peak = 0, 0
    # The first hop of a hybrid plan's reductions (a reduce-scatter, or a
    # whole parameter's all-reduce within the shard group): the program
    # waits for it, then starts the replica all-reduce of its output.
    scatters = {n["name"]: n for n in g["nodes"] if n["kind"] == "start" and
                (n["op"] == "reduce_scatter" or (n["op"] == "all_reduce" and n["group"] == "shard"))}
    for n in g["nodes"]:
        if n["kind"] == "start" and n["name"] in gathers:
            pending.append(("start", [(mb["in"], mb["out"]) for mb in n["members"]]))
            held += sum(out_bytes[mb["out"]] for mb in n["members"])
            peak = max(peak, held)
        elif n["kind"] == "wait" and n["of"] in gathers:
            pending.append(("wait", gathers[n["of"]]["members"][0]["out"]))
        elif n["kind"] == "wait" and n["of"] in scatters:
            pending.append(("wait", scatters[n["of"]]["members"][0]["out"]))
        elif n["kind"] == "start" and n["op"] == "all_reduce" and n["group"] == "replica":
            pending.append(("replicate", [(mb["in"], mb["out"]) for mb in n["members"]]))
        elif n["kind"] == "compute":
            before[n["name"]] = pending
            pending = []
            frees = [t for t, c in last.items() if c == n["name"]]
            free_after[n["name"]] = frees
            held -= sum(out_bytes[t] for t in frees)
    return before, free_after, peak
