"""gorun's planner on torch joint graphs: from a traced training step to a
step graph (stepgraph/SCHEMA.md), and from gorun's plan back to an FX graph
that runs.

    import gorun.fx as gfx
    fsdp = gfx.SimpleFSDP(model, world_size=2, rank=r, group_name="0")
    joint = gfx.trace_joint(fsdp, (tokens, labels))        # forward+loss+backward+SGD, one FX graph
    costs = gfx.profile_costs(joint, (tokens, labels))      # ns per FX node, measured
    step = gfx.to_step_graph(joint, costs)                  # the JSON `gorun plan` reads
    gfx.calibrate_comm("0", 2)                              # α-β of the real group (every rank)
    planned, summary = gfx.plan(step, "reshard,blocks,overlap")  # libgorun's gorun_plan, priced by it
    gm = gfx.apply_plan(joint, planned)                     # bucketed, reordered, re-gathered
    # chunking: step = gfx.to_step_graph(joint, costs, chunks=2), then the "chunk" pass
    outs = gm(*joint.inputs(fsdp, (tokens, labels)))

The joint graph. ``trace_joint`` runs ``make_fx`` over one training step
(the model's loss, ``torch.autograd.grad`` of it with respect to the
parameter shards, and an SGD update), so forward, loss, backward and the
optimizer are one graph of aten ops, as torchtitan's graph_trainer traces
them. The parameters are SimpleFSDP-style: each is a flat shard of
1/world_size; the forward all-gathers it with
``_c10d_functional.all_gather_into_tensor`` + ``wait_tensor`` and the
backward reduce-scatters its gradient with ``reduce_scatter_tensor`` +
``wait_tensor``, so the collectives are nodes of the graph.

Metadata. While tracing, module hooks keep ``nn_module_stack`` (the form
Dynamo writes: fqn -> (fqn, type)) in the tracer's current meta, so every
forward node carries the module path it ran under. Backward nodes are
traced by the autograd engine with no module active; hooks on every
autograd node mark them ``autograd_backward`` and give them the sequence
number of the forward op they differentiate (what aot_autograd does), and
the forward op's module stack is copied to them. The optimizer's nodes are
annotated ``custom: {"gorun_direction": "optimizer"}``.

The step graph. Every FX node that computes becomes a compute node of the
same name (cost: the profiled time of that node; size: its fake tensor's
bytes, 0 for views, which share their base's storage); every collective
becomes a start (the collective node) and a wait (its ``wait_tensor``);
regions are the blocks (children of a ModuleList/Sequential, else the
model's direct children) read from ``nn_module_stack``; directions come from
the metadata above. Views of a gathered parameter are read as the gathered
tensor itself, so a backward reader of ``t(weight)`` reads the gathered
weight and reshard can gather it again; the applied plan re-derives the
views from the re-gathered copy. A tied weight is one shard, one member,
gathered once, and read by every region that uses it.

Back. ``apply_plan`` walks the planned graph in order and emits: compute
nodes as the original FX nodes; a start of several members as one
collective on a concatenated buffer (copy-in) and its wait followed by
the copy-out, with the layout Inductor's bucketing uses; re-gathers
(``OUT@bwd``) as new all-gathers whose outputs replace the forward copy in
backward. FX frees a value after its last reader, so the forward copy of a
re-gathered parameter dies with its last forward reader.

Chunks. The chunk pass's plans (a region's nodes run once per chunk of the
batch) need to know how every tensor splits: ``chunk_layout`` traces the
step again on 1/k of the batch and decides, op by op, which tensors are
batch tensors (and along which dim), which are partial sums over the batch
(weight gradients) and which are whole; ``to_step_graph(..., chunks=2)``
writes those modes into the step graph for the pass. ``apply_plan`` emits a
chunk of an FX node as the small trace's node (its sizes are the chunk's),
Split as a slice, Concat as a cat in the whole tensor's memory order, Sum
as chunk 0 + chunk 1, and refuses, naming the node and why, what does not
split (a mean loss, an op it has no rule for, a split that would not line
up with the batch's samples).
"""

import collections
import contextlib
import operator
import time

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.nn as nn

from gorun.export import SCHEMA, _DTYPES, _blocks, _block_of

_c10d = torch.ops._c10d_functional
ALL_GATHER = _c10d.all_gather_into_tensor.default
ALL_GATHER_OUT = _c10d.all_gather_into_tensor_out.default  # what Inductor's bucketing emits
REDUCE_SCATTER = _c10d.reduce_scatter_tensor.default
ALL_REDUCE = _c10d.all_reduce.default
WAIT = _c10d.wait_tensor.default
_COLLECTIVES = {ALL_GATHER: "all_gather", REDUCE_SCATTER: "reduce_scatter", ALL_REDUCE: "all_reduce"}
REGATHER = "@bwd"  # stepgraph's suffix for a re-gathered copy


class FxError(ValueError):
    """A graph, plan or argument gorun.fx cannot handle; the text says which node and why."""


# ---------------------------------------------------------------------------
# SimpleFSDP-style parameters


class _Gather(torch.autograd.Function):
    """All-gather a flat shard into the full parameter; the gradient is
    reduce-scattered back to the shard (summed over ranks)."""

    @staticmethod
    def forward(ctx, shard, world, group, numel, shape):
        ctx.world, ctx.group, ctx.numel = world, group, numel
        full = _c10d.wait_tensor(_c10d.all_gather_into_tensor(shard, world, group))
        return full[:numel].view(shape)

    @staticmethod
    def backward(ctx, grad):
        g = grad.reshape(-1)
        pad = ctx.world * ((ctx.numel + ctx.world - 1) // ctx.world) - ctx.numel
        if pad:
            g = torch.nn.functional.pad(g, (0, pad))
        r = _c10d.wait_tensor(_c10d.reduce_scatter_tensor(g, "sum", ctx.world, ctx.group))
        return r, None, None, None, None


class _Replicate(torch.autograd.Function):
    """DDP-style: the parameter as it is; its gradient all-reduced (summed)."""

    @staticmethod
    def forward(ctx, flat, world, group, numel, shape):
        ctx.group = group
        return flat.view(shape)

    @staticmethod
    def backward(ctx, grad):
        return _c10d.wait_tensor(_c10d.all_reduce(grad.reshape(-1), "sum", ctx.group)), None, None, None, None


class SimpleFSDP(nn.Module):
    """Shards every parameter of ``module`` SimpleFSDP-style: each unique
    parameter becomes a flat shard of ceil(numel / world_size) elements
    (zero-padded), and the module that uses it all-gathers it on entry.
    A parameter used by several modules (a tied embedding) is one shard,
    gathered once per step by the first module that runs, and read by the
    others. The gradient reaches the shard through a reduce-scatter.

    ``names[i]`` is the fqn of ``shards[i]``; ``aliases`` maps each
    other fqn of a tied parameter to its first fqn.

    ``mode="replicate"`` is the DDP-style variant: every rank holds the
    whole parameter, and its gradient is all-reduced instead."""

    def __init__(self, module, world_size, rank, group_name, mode="shard"):
        super().__init__()
        if world_size < 1 or not 0 <= rank < world_size:
            raise FxError("gorun.fx: rank %d of world %d" % (rank, world_size))
        if mode not in ("shard", "replicate"):
            raise FxError("gorun.fx: SimpleFSDP mode %r: want 'shard' or 'replicate'" % mode)
        self.module, self.world, self.rank, self.group, self.mode = module, world_size, rank, group_name, mode
        self._fn = _Gather if mode == "shard" else _Replicate
        if mode == "replicate":
            world_size, rank = 1, 0  # the "shard" is the whole parameter
        self.names, self.meta, self.aliases = [], {}, {}
        shards, first = [], {}
        owners = collections.defaultdict(list)  # module -> [(attr, fqn of shard)]
        for mname, m in module.named_modules(remove_duplicate=False):
            for pname, p in list(m._parameters.items()):
                if p is None:
                    continue
                fqn = (mname + "." if mname else "") + pname
                if id(p) not in first:
                    first[id(p)] = fqn
                    n = (p.numel() + world_size - 1) // world_size
                    flat = torch.nn.functional.pad(p.detach().reshape(-1), (0, n * world_size - p.numel()))
                    shards.append(nn.Parameter(flat[rank * n:(rank + 1) * n].clone()))
                    self.names.append(fqn)
                    self.meta[fqn] = (p.numel(), tuple(p.shape))
                elif first[id(p)] != fqn:
                    self.aliases[fqn] = first[id(p)]
                owners[m].append((pname, first[id(p)]))
        self.shards = nn.ParameterList(shards)
        self._index = {n: i for i, n in enumerate(self.names)}
        self._gathered = None  # fqn -> full tensor, live during one forward
        self._bound = None  # tensors standing in for the shards while tracing
        for m, attrs in owners.items():
            for pname, _ in attrs:
                del m._parameters[pname]
            m.register_forward_pre_hook(self._gather_hook(attrs))

    def _gather_hook(self, attrs):
        def hook(mod, args):
            for pname, fqn in attrs:
                if fqn not in self._gathered:
                    numel, shape = self.meta[fqn]
                    shards = self.shards if self._bound is None else self._bound
                    self._gathered[fqn] = self._fn.apply(shards[self._index[fqn]], self.world, self.group,
                                                        numel, shape)
                setattr(mod, pname, self._gathered[fqn])
        return hook

    def forward(self, *args, **kwargs):
        self._gathered = {}
        try:
            return self.module(*args, **kwargs)
        finally:
            self._gathered = None


# ---------------------------------------------------------------------------
# Tracing the joint graph


class Joint:
    """A traced training step: ``gm(*shards, *batch)`` returns
    ``[loss, *new_shards]``. ``blocks`` are the region names in forward
    order; ``shard_names[i]`` is the fqn of placeholder i."""

    def __init__(self, gm, shard_names, n_batch, blocks, world, group, aliases, retrace=None):
        self.gm, self.shard_names, self.n_batch, self.blocks = gm, shard_names, n_batch, blocks
        self.world, self.group, self.aliases = world, group, aliases
        # retrace(k): the same step traced on 1/k of the batch (chunk_layout)
        self._retrace, self._layouts = retrace, {}

    @staticmethod
    def inputs(fsdp, batch):
        return [p.detach() for p in fsdp.shards] + list(batch)


@contextlib.contextmanager
def _module_stack_hooks(root):
    """Keeps fx_traceback's current meta["nn_module_stack"] equal to the
    stack of modules running now (fqn -> (fqn, type), outermost first)."""
    handles = []

    def push(fqn, m):
        def pre(mod, args):
            cur = fx_traceback.current_meta
            st = collections.OrderedDict(cur.get("nn_module_stack", {}))
            st[fqn] = (fqn, type(m).__qualname__)
            cur["nn_module_stack"] = st
        return pre

    def pop(fqn):
        def post(mod, args, out):
            cur = fx_traceback.current_meta
            st = collections.OrderedDict(cur.get("nn_module_stack", {}))
            st.pop(fqn, None)
            cur["nn_module_stack"] = st
        return post

    try:
        for fqn, m in root.named_modules():
            if fqn:
                # prepend: the region is set before SimpleFSDP's gather hook runs
                handles.append(m.register_forward_pre_hook(push(fqn, m), prepend=True))
                handles.append(m.register_forward_hook(pop(fqn)))
        yield
    finally:
        for h in handles:
            h.remove()
        fx_traceback.current_meta.pop("nn_module_stack", None)


def _mark_backward(loss):
    """Hooks on every autograd node reachable from loss: while a node's
    backward is traced, the created FX nodes get its forward sequence number
    and autograd_backward=True (aot_autograd's stack-trace preservation)."""
    seen, q = set(), collections.deque([loss.grad_fn])
    while q:
        n = q.popleft()
        if n is None or n in seen:
            continue
        seen.add(n)
        q.extend(f for f, _ in n.next_functions)

        def pre(grad_out, seq=n._sequence_nr()):
            fx_traceback.set_grad_fn_seq_nr(seq)
            fx_traceback._mark_autograd_backward()

        def post(grad_in, grad_out):
            fx_traceback.reset_grad_fn_seq_nr()
            fx_traceback._reset_autograd_backward()

        n.register_prehook(pre)
        n.register_hook(post)


def trace_joint(fsdp, batch, lr=0.01, blocks=None):
    """Traces one training step of ``fsdp`` (a SimpleFSDP whose module
    returns a scalar loss for ``fsdp(*batch)``) with make_fx on fake
    tensors. The process group ``fsdp.group`` must exist (a gloo group, or
    torch's fake group for tracing alone)."""
    inner = fsdp.module
    blocks = list(blocks) if blocks is not None else _blocks(inner)
    n = len(fsdp.shards)

    def step(*flat):
        shards, args = flat[:n], flat[n:]
        fsdp._bound = shards
        try:
            with _module_stack_hooks(inner):
                loss = fsdp(*args)
        finally:
            fsdp._bound = None
        if loss.dim() != 0:
            raise FxError("gorun.fx: the model returned a tensor of shape %s; want a scalar loss"
                          % tuple(loss.shape))
        value = loss.detach()  # a forward node: the step's reported loss
        _mark_backward(loss)
        grads = torch.autograd.grad(loss, list(shards))
        with fx_traceback.annotate({"gorun_direction": "optimizer"}):
            new = [s.detach() - lr * g for s, g in zip(shards, grads)]
        return [value, *new]

    from torch.fx.experimental.proxy_tensor import make_fx

    def trace(b):
        with fx_traceback.preserve_node_meta():
            # The module's buffers (a RoPE table) stay real: constants of the graph (get_attr nodes).
            gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=True)(
                *[p.detach().requires_grad_(True) for p in fsdp.shards], *b)
        _copy_forward_meta(gm.graph)
        return gm

    def retrace(k):
        sizes = {tuple(b.shape[:1]) for b in batch if isinstance(b, torch.Tensor)}
        if len(sizes) != 1 or () in sizes:
            raise FxError("gorun.fx: chunking splits the batch along dim 0, but the batch's tensors have leading "
                          "sizes %s" % sorted(sizes))
        (n,), = sizes
        if n % k:
            raise FxError("gorun.fx: a batch of %d does not split into %d equal chunks" % (n, k))
        return trace([b.narrow(0, 0, n // k) if isinstance(b, torch.Tensor) else b for b in batch])

    return Joint(trace(batch), list(fsdp.names), len(batch), blocks, fsdp.world, fsdp.group, dict(fsdp.aliases),
                 retrace)


def _copy_forward_meta(graph):
    """Backward nodes take the module stack of the forward node with their
    sequence number (the op they differentiate)."""
    fwd = {}
    for nd in graph.nodes:
        if not nd.meta.get("autograd_backward") and "nn_module_stack" in nd.meta and "seq_nr" in nd.meta:
            fwd.setdefault(nd.meta["seq_nr"], nd.meta["nn_module_stack"])
    for nd in graph.nodes:
        if nd.meta.get("autograd_backward") and not nd.meta.get("nn_module_stack"):
            st = fwd.get(nd.meta.get("seq_nr"))
            if st is not None:
                nd.meta["nn_module_stack"] = st


def direction(nd):
    """forward, backward or optimizer of one node, from its metadata alone
    (see directions, which also places autograd's gradient accumulation)."""
    if nd.meta.get("custom", {}).get("gorun_direction") == "optimizer":
        return "optimizer"
    if nd.meta.get("autograd_backward"):
        return "backward"
    return "forward"


def directions(graph):
    """Node -> forward, backward or optimizer. make_fx records ops in the
    order they ran and the forward ends before autograd starts, so every
    non-optimizer node after the first backward one is backward too: the
    gradient accumulations autograd's engine runs between nodes (the
    residual stream's adds) carry no hook of their own."""
    out, seen_bwd = {}, False
    for nd in graph.nodes:
        d = direction(nd)
        seen_bwd = seen_bwd or d == "backward"
        out[nd] = "backward" if d == "forward" and seen_bwd else d
    return out


def region(nd, blocks):
    """The innermost block on the node's nn_module_stack, or None."""
    for fqn, _ in reversed(list(nd.meta.get("nn_module_stack", {}).values())):
        b = _block_of(fqn, blocks)
        if b is not None:
            return b
    return None


def regions(graph, blocks, join=True):
    """Node -> block. A node outside every block (the loss at the model's
    top level, its gradient, autograd's accumulations) joins the block of
    the node before it, the block that was running, so its time and
    memory are accounted to that block; with ``join=False`` it has no
    region (gorun's passes handle region-less compute too). Optimizer
    nodes and placeholders have none."""
    out, cur = {}, None
    dirs = directions(graph)
    for nd in graph.nodes:
        if nd.op != "call_function" or dirs[nd] == "optimizer":
            out[nd] = None
            continue
        r = region(nd, blocks)
        cur = r if r is not None else cur
        out[nd] = cur if join else r
    return out


# ---------------------------------------------------------------------------
# Costs


def run_graph(gm, args, on_node=None):
    """Runs an FX graph node by node (freeing each value after its last
    reader, as FX's generated code does) and returns (outputs, peak), peak
    being the most bytes of tensor storage held at once that the step
    allocated (inputs excluded). ``on_node(node, seconds)`` is called after
    each compute node."""
    nodes = list(gm.graph.nodes)
    last = {}
    for i, nd in enumerate(nodes):
        for a in nd.all_input_nodes:
            last[a] = i
    frees = collections.defaultdict(list)
    for a, i in last.items():
        frees[i].append(a)
    env, it = {}, iter(args)
    inputs = {t.untyped_storage().data_ptr() for t in args if isinstance(t, torch.Tensor)}
    held = collections.Counter()  # storage ptr -> live values referencing it
    size = {}
    cur = peak = 0

    def tensors(v):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from tensors(x)

    def hold(v, d):
        nonlocal cur
        for t in tensors(v):
            p = t.untyped_storage().data_ptr()
            if p in inputs:
                continue
            if d > 0 and held[p] == 0:
                size[p] = t.untyped_storage().nbytes()
                cur += size[p]
            held[p] += d
            if d < 0 and held[p] == 0:
                cur -= size.pop(p)
                del held[p]

    for i, nd in enumerate(nodes):
        if nd.op == "placeholder":
            env[nd] = next(it)
            continue
        if nd.op == "get_attr":  # a constant of the graph: held by the module, not the step
            env[nd] = getattr(gm, nd.target)
            inputs.add(env[nd].untyped_storage().data_ptr())
            continue
        a = torch.fx.node.map_arg(nd.args, env.__getitem__)
        k = torch.fx.node.map_arg(nd.kwargs, env.__getitem__)
        if nd.op == "output":
            return a[0], peak
        if nd.op != "call_function":
            raise FxError("gorun.fx: node %s: op %s is not supported (want call_function)" % (nd.name, nd.op))
        t0 = time.perf_counter()
        env[nd] = nd.target(*a, **k)
        if on_node is not None:
            on_node(nd, time.perf_counter() - t0)
        hold(env[nd], 1)
        peak = max(peak, cur)
        for f in frees.get(i, ()):
            if f.op != "placeholder":
                hold(env[f], -1)
            del env[f]
    raise FxError("gorun.fx: graph has no output node")


def profile_costs(joint, batch, fsdp=None, repeats=3):
    """Median measured time (ns) of every FX node over ``repeats`` runs on
    real tensors (random shards of the traced shapes unless ``fsdp`` gives
    them). Collectives run on whatever group the graph names; their times
    are not used (gorun's cost model prices communication)."""
    ph = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
    if fsdp is not None:
        args = Joint.inputs(fsdp, batch)
    else:
        args = [torch.randn(n.meta["val"].shape, dtype=n.meta["val"].dtype) for n in ph[:len(ph) - len(batch)]]
        args += list(batch)
    times = collections.defaultdict(list)
    run_graph(joint.gm, args)  # warm up
    for _ in range(repeats):
        run_graph(joint.gm, args, lambda nd, s: times[nd.name].append(s))
    return {k: int(sorted(v)[len(v) // 2] * 1e9) for k, v in times.items()}


# ---------------------------------------------------------------------------
# Chunking: how each tensor of the joint graph splits along the batch


_aten = torch.ops.aten
BATCH, PARTIAL, WHOLE, NO = "batch", "partial", "whole", "no"

# Ops that stay linear in a partial sum (chunk 0's part + chunk 1's part =
# the whole) when every other tensor operand is whole.
_LINEAR = {_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default, _aten.t.default,
           _aten.transpose.int, _aten.permute.default, _aten.alias.default, _aten.clone.default,
           _aten.add.Tensor, _aten.sub.Tensor, _aten.neg.default, _aten.mul.Tensor, _aten.mul.Scalar,
           _aten.div.Tensor, _aten.div.Scalar, _aten.sum.dim_IntList, _aten.constant_pad_nd.default}
# Of these, the ones where several partial operands add up.
_ADDITIVE = {_aten.add.Tensor, _aten.sub.Tensor}
# Ops that cannot run per chunk (they read a whole-batch scalar: a mean's
# divisor) but keep row i of their batch input at row i of their result.
_ROW_PRESERVING = {_aten.nll_loss_backward.default}
# Fused attention on CPU and its backward, with how to read its dropout_p.
_SDPA = {_aten._scaled_dot_product_flash_attention_for_cpu.default: lambda f: f.args[3] if len(f.args) > 3 else 0.0,
         _aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
             lambda f: f.args[6] if len(f.args) > 6 else 0.0}
_SOFTMAX = {_aten._softmax.default: 1, _aten._log_softmax.default: 1,
            _aten._softmax_backward_data.default: 2, _aten._log_softmax_backward_data.default: 2}


class ChunkLayout:
    """How the joint graph splits into ``count`` chunks along the batch
    (dim 0 of the batch inputs), read from two traces of the same step: on
    the whole batch and on 1/count of it (``small``, node for node the same
    program). Per FX node name (a list for a node that returns several
    tensors), ``shape`` is what its shapes and strides in the two traces say
    (batch along one dim, whole, or no), and ``value`` what it holds when
    everything before it that can run per chunk does, one of:

    - ``("batch", d)``: a tensor whose dim d is the batch, outermost in
      memory, so chunk c is the c-th block of its storage, and whose rows
      are the batch's samples in order (so its split lines up with every
      other split);
    - ``("partial", None)``: a sum over the batch (a weight gradient): run
      per chunk it gives partial sums that add up to the whole;
    - ``("whole", None)``: no batch dimension and computed from no per-chunk
      tensor (a parameter, a mask);
    - ``("no", why)``: cannot be split or run per chunk, and why (a mean
      over the batch, an op whose split gorun.fx does not know).

    ``rule(node, per)`` is the mode of a node run per chunk on the inputs
    ``per`` (what apply_plan asks of every chunk copy). The rules are per op, not guessed from shapes alone: view ops are
    checked by their offsets and strides in both traces, pointwise ops (the
    aten pointwise tag) by their broadcasting, and the rest by a table
    (matmuls, layer norm, softmax, embedding and their backwards); anything
    else that would read a per-chunk tensor is ``no``."""

    def __init__(self, joint, count):
        self.count = count
        small = joint._retrace(count) if joint._retrace is not None else None
        if small is None:
            raise FxError("gorun.fx: this joint graph was not traced by trace_joint, so it cannot be chunked")
        full_nodes, small_nodes = list(joint.gm.graph.nodes), list(small.graph.nodes)
        if [(n.name, n.target) for n in full_nodes] != [(n.name, n.target) for n in small_nodes]:
            at = next((f.name for f, h in zip(full_nodes, small_nodes) if (f.name, f.target) != (h.name, h.target)),
                      "the end")
            raise FxError("gorun.fx: the step traced on 1/%d of the batch is a different program (from node %s on): "
                          "chunking needs a step whose ops do not depend on the batch size" % (count, at))
        self.small = {h.name: h for h in small_nodes}
        self._full = {f.name: f for f in full_nodes}
        self.shape, self.value = {}, {}
        ph = [n for n in full_nodes if n.op == "placeholder"]
        batch_inputs = set(ph[len(ph) - joint.n_batch:])
        for f, h in zip(full_nodes, small_nodes):
            if f.op == "output":
                continue
            m = self.shape[f.name] = self._shape_mode(f.meta.get("val"), h.meta.get("val"))
            if f in batch_inputs and m[0] != BATCH:
                raise FxError("gorun.fx: batch input %s does not split along dim 0 into %d chunks (%s)"
                              % (f.name, count, m[1]))
            self.value[f.name] = m if f.op == "placeholder" else self._value(f, m)

    def _value(self, f, m):
        """What node f's result holds when every input that can be per
        chunk is: a partial sum, a batch tensor whose rows are the batch's
        samples in order (so a split of it lines up with every other
        split), or no: neither (then a plan that splits it, or runs f per
        chunk, reaches apply_plan, which refuses it with this reason)."""
        val = lambda a: self.value.get(a.name, (WHOLE, None))  # noqa: E731
        per = {a: val(a) for a in f.all_input_nodes if _leaf_kind(val(a)) in (BATCH, PARTIAL)}
        no = [a for a in f.all_input_nodes if _leaf_kind(val(a)) == NO]
        if _leaf_kind(m) in (BATCH, NO):
            rows = [a for a in no if _leaf_kind(self.shape.get(a.name, (WHOLE, None))) != WHOLE]
            if rows:
                return (NO, "it reads %s, whose rows are not known to be the batch's samples in order" % rows[0].name)
            if not per or f.target in _ROW_PRESERVING:
                return m
            r = self.rule(f, per, check_args=False)  # layer norm's backward: [batch, partial, partial]
            return r if _leaf_kind(r) != NO else (NO, "its rows are not known to be the batch's samples in "
                                                      "order: %s" % r[1])
        r = self.rule(f, per) if per else m
        if no and _leaf_kind(r) != NO:
            r = (NO, "it reads %s, which cannot run per chunk" % no[0].name)
        return r if _leaf_kind(r) in (PARTIAL, NO) else m

    def full_val(self, name):
        """The fake tensor of FX node ``name`` on the whole batch."""
        f = self._full.get(name)
        return None if f is None else f.meta.get("val")

    def step_mode(self, name):
        """The step graph's chunk mode of FX node ``name``'s tensor
        (batch, partial, replicated), or None where it has none."""
        m = self.value.get(name)
        return _STEP_MODE.get(m[0]) if isinstance(m, tuple) else None

    def rule(self, f, per, check_args=True):
        """The mode of FX node f's result when it runs per chunk and
        ``per`` maps the inputs it reads per chunk to their modes (the
        others it reads whole): (batch, d), (partial, None), or (no, why)."""
        h = self.small[f.name]
        shape = self.shape[f.name]
        if f.target is operator.getitem:
            src = per.get(f.args[0])
            return src[f.args[1]] if isinstance(src, list) else (NO, "getitem of %s" % f.args[0].name)
        modes = {a: per.get(a, (WHOLE, None)) for a in f.all_input_nodes}
        for a in f.all_input_nodes:
            if a not in per and _leaf_kind(self.shape.get(a.name, (WHOLE, None))) == BATCH:
                return (NO, "it reads %s whole, a batch-sized tensor, where a chunk of it is wanted" % a.name)
        if not per:
            return (NO, "it reads nothing per chunk")
        why = _scalar_args_differ(f, h) if check_args else None
        if why:
            return (NO, why)
        partial = [a for a in per if _leaf_kind(per[a]) == PARTIAL]
        if partial:
            return self._after_partial(f, list(per), partial, shape)
        return self._batch_rule(f, modes, shape)

    # -- shapes and layouts

    def _shape_mode(self, fv, hv):
        if isinstance(fv, (list, tuple)):
            return [self._shape_mode(a, b) for a, b in zip(fv, hv)]
        if not isinstance(fv, torch.Tensor):
            return (WHOLE, None)
        if fv.shape == hv.shape:
            return (WHOLE, None)
        diff = [d for d in range(fv.dim()) if fv.shape[d] != hv.shape[d]] if fv.dim() == hv.dim() else None
        if not diff or len(diff) != 1 or fv.shape[diff[0]] != self.count * hv.shape[diff[0]]:
            return (NO, "its shape is %s on the batch and %s on 1/%d of it: no one batch dimension"
                    % (tuple(fv.shape), tuple(hv.shape), self.count))
        d = diff[0]
        if fv.stride() != hv.stride() or any(fv.stride(j) * fv.shape[j] > fv.stride(d)
                                             for j in range(fv.dim()) if j != d and fv.shape[j] > 1):
            return (NO, "its batch dimension %d is not outermost in memory (strides %s)" % (d, tuple(fv.stride())))
        return (BATCH, d)

    # -- one node

    def _after_partial(self, f, per, partial, shape):
        """f reads a partial sum per chunk: it may run per chunk only if
        the chunks' results still add up to the whole result (f is linear
        in its partial operands)."""
        name, t = _op_name(f), f.target
        if t not in _LINEAR:
            return (NO, "%s of %s, a partial sum over the batch: only linear ops may follow one per chunk" % (
                name, partial[0].name))
        if len(partial) != len(per):
            return (NO, "%s mixes the partial sum %s with per-chunk batch tensors" % (name, partial[0].name))
        if t in _ADDITIVE:
            # (a0 + b0) + (a1 + b1) = a + b only when every term is partial:
            # a whole term (a bias, a constant) would be added once per chunk.
            terms = f.args[:2]
            if not all(isinstance(x, torch.fx.Node) and x in partial for x in terms):
                return (NO, "%s adds a term that is not a partial sum to %s: per chunk it would be counted "
                            "%d times" % (name, partial[0].name, self.count))
        elif len(partial) > 1:
            return (NO, "%s of several partial sums (%s) is not linear" % (name, ", ".join(x.name for x in partial)))
        elif t in (_aten.div.Tensor, _aten.div.Scalar) and f.args[0] is not partial[0]:
            return (NO, "%s divides by the partial sum %s" % (name, partial[0].name))
        elif t is _aten.constant_pad_nd.default and len(f.args) > 2 and f.args[2] != 0:
            return (NO, "%s pads the partial sum %s with %r, not 0" % (name, partial[0].name, f.args[2]))
        if shape != (WHOLE, None):
            return (NO, "%s: a partial sum whose shape changes with the batch" % name)
        return (PARTIAL, None)

    def _batch_rule(self, f, modes, shape):
        """The mode of compute f that reads only batch and whole tensors."""
        t, name = f.target, _op_name(f)
        bd = lambda a: modes[a][1] if isinstance(a, torch.fx.Node) and modes[a][0] == BATCH else None  # noqa: E731
        val = f.meta.get("val")
        reduce_to = None  # the mode the table says, when it says one
        if t is _aten.mm.default:
            a, b = f.args[:2]
            if bd(a) == 1 and bd(b) == 0:
                reduce_to = (PARTIAL, None)
            elif bd(a) == 0 and bd(b) is None:
                reduce_to = (BATCH, 0)
            elif bd(a) is None and bd(b) == 1:
                reduce_to = (BATCH, 1)
            else:
                return (NO, "mm of %s (batch dim %s) and %s (batch dim %s)" % (a.name, bd(a), b.name, bd(b)))
        elif t is _aten.bmm.default:
            if bd(f.args[0]) != 0 or bd(f.args[1]) != 0:
                return (NO, "bmm whose operands are not both split along dim 0")
            reduce_to = (BATCH, 0)
        elif t is _aten.sum.dim_IntList:
            x, dims = f.args[0], [d % f.args[0].meta["val"].dim() for d in f.args[1]]
            reduce_to = (PARTIAL, None) if bd(x) in dims else (BATCH, None)
        elif t in (_aten.mean.dim, _aten.amax.default, _aten.amin.default):
            x, dims = f.args[0], [d % f.args[0].meta["val"].dim() for d in f.args[1]]
            if bd(x) in dims:
                return (NO, "%s over the batch dimension is not a sum of the chunks'" % name)
        elif t is _aten.cat.default:
            xs, dim = f.args[0], (f.args[1] if len(f.args) > 1 else 0)
            dims = {bd(a) for a in xs}
            if len(dims) != 1 or None in dims or dim % val.dim() in dims:
                return (NO, "cat of tensors split along dims %s, along dim %d" % (sorted(map(str, dims)), dim))
        elif t is _aten.embedding.default:
            if bd(f.args[0]) is not None:
                return (NO, "embedding of a per-chunk weight")
            reduce_to = (BATCH, None)
        elif t is _aten.embedding_dense_backward.default:
            reduce_to = (PARTIAL, None)
        elif t is _aten.native_layer_norm.default:
            x = f.args[0]
            if bd(x) is None or bd(x) >= x.meta["val"].dim() - len(f.args[1]) or any(bd(a) is not None for a in f.args[2:4]
                                                                                       if isinstance(a, torch.fx.Node)):
                return (NO, "layer norm over the batch dimension")
        elif t is _aten.native_layer_norm_backward.default:
            g, x = f.args[0], f.args[1]
            if bd(g) is None or bd(g) != bd(x) or bd(g) >= x.meta["val"].dim() - len(f.args[2]):
                return (NO, "layer norm backward over the batch dimension")
            if not isinstance(shape, list) or len(shape) != 3:
                return (NO, "layer norm backward with outputs %s" % (shape,))
            return [shape[0], (PARTIAL, None) if shape[1] == (WHOLE, None) else shape[1],
                    (PARTIAL, None) if shape[2] == (WHOLE, None) else shape[2]]
        elif t in _SDPA:
            # fused attention: each (sample, head) on its own; no dropout, a
            # mask (if any) the same for every sample
            qkv = [a for a in f.all_input_nodes]
            if any(bd(a) not in (0, None) for a in qkv) or bd(f.args[0]) != 0:
                return (NO, "%s with inputs not split along dim 0" % name)
            if _SDPA[t](f) != 0.0:
                return (NO, "%s with dropout: the chunks would draw other random numbers" % name)
            if not isinstance(shape, list) or any(m[0] != BATCH for m in shape):
                return (NO, "%s returns %s" % (name, shape))
        elif t in _SOFTMAX:
            x, dim = f.args[0], f.args[_SOFTMAX[t]]
            if dim % x.meta["val"].dim() == bd(x):
                return (NO, "%s along the batch dimension" % name)
        elif _is_view(f) or t in (_aten._unsafe_view.default, _aten.clone.default, _aten._to_copy.default):
            why = self._view_ok(f, modes)
            if why:
                return (NO, why)
        elif torch.Tag.pointwise in getattr(t, "tags", ()):
            why = _broadcast_ok(f, modes, val)
            if why:
                return (NO, why)
        else:
            return (NO, "%s: gorun.fx does not know how it splits along the batch" % name)
        if reduce_to == (PARTIAL, None):
            return reduce_to if shape == (WHOLE, None) else (NO, "%s sums over the batch but keeps a batch dim" % name)
        if reduce_to is not None and reduce_to[1] is not None and shape != reduce_to:
            return (NO, "%s should split along dim %d, but its shapes say %s" % (name, reduce_to[1], shape))
        leaves = shape if isinstance(shape, list) else [shape]
        for m in leaves:
            if m[0] == NO:
                return m
            if m[0] == WHOLE:
                return (NO, "%s reads per-chunk tensors but its result does not change with the batch "
                            "(a reduction over it that is not a known sum)" % name)
        return shape

    def _view_ok(self, f, modes):
        """A view (or a copy that keeps the layout) splits when it maps each
        chunk's block of storage onto the same block: its result's batch
        dim is outermost (the shape check), spans the same storage as its
        input's, and starts at the same offset from it in both traces."""
        x = f.args[0]
        if not isinstance(x, torch.fx.Node) or modes[x][0] != BATCH:
            return "%s of %s, which is not split along the batch" % (_op_name(f), getattr(x, "name", x))
        if f.target in (_aten.clone.default, _aten._to_copy.default):
            return None  # a copy of the same shape: element for element
        fx_, hx = x.meta["val"], self.small[x.name].meta["val"]
        fo, ho = f.meta["val"], self.small[f.name].meta["val"]
        # in bytes: view_as_complex / view_as_real change the element size
        span = fx_.stride(modes[x][1]) * fx_.shape[modes[x][1]] * fx_.element_size()
        outs = list(zip(fo, ho)) if isinstance(fo, (list, tuple)) else [(fo, ho)]
        for a, b in outs:
            m = self._shape_mode(a, b)
            if m[0] != BATCH:
                return None  # the shape check names it
            if a.stride(m[1]) * a.shape[m[1]] * a.element_size() != span:
                return "%s maps the batch onto a different span of storage (%d bytes, not %d)" % (
                    _op_name(f), a.stride(m[1]) * a.shape[m[1]] * a.element_size(), span)
            if a.storage_offset() - fx_.storage_offset() != b.storage_offset() - hx.storage_offset():
                return "%s takes a different part of its input on 1/%d of the batch" % (_op_name(f), self.count)
        return None


def _leaf_kind(m):
    if isinstance(m, list):
        kinds = {x[0] for x in m}
        return NO if NO in kinds else PARTIAL if PARTIAL in kinds else BATCH if BATCH in kinds else WHOLE
    return m[0]


def _op_name(f):
    return "aten." + str(f.target).replace("aten.", "") if isinstance(f.target, torch._ops.OpOverload) \
        else getattr(f.target, "__name__", str(f.target))


def _broadcast_ok(f, modes, val):
    """A pointwise op splits when each per-chunk operand's batch dim lines
    up (right-aligned broadcasting) with the result's."""
    if not isinstance(val, torch.Tensor):
        return "%s returns %s" % (_op_name(f), type(val).__name__)
    want = None
    for a in f.all_input_nodes:
        m = modes[a]
        if m[0] != BATCH:
            continue
        d = m[1] + val.dim() - a.meta["val"].dim()
        if want is not None and d != want:
            return "%s lines up batch dims %d and %d" % (_op_name(f), want, d)
        want = d
    return None


def _scalar_args_differ(f, h):
    """Why the per-chunk copy of f (the small trace's node h) cannot be
    trusted, or None: every non-tensor argument must be the same in both
    traces, except integers inside a size list (a view's shape)."""
    def walk(a, b, in_list, where):
        if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
            return None
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
            for x, y in zip(a, b):
                r = walk(x, y, True, where)
                if r:
                    return r
            return None
        if a == b:
            return None
        if in_list and isinstance(a, int) and isinstance(b, int):
            return None
        return "%s: argument %s is %r on the batch and %r on a chunk of it, not a size, so a chunk would compute " \
               "something else (a mean's divisor, an index)" % (_op_name(f), where, a, b)
    for i, (a, b) in enumerate(zip(f.args, h.args)):
        r = walk(a, b, False, i)
        if r:
            return r
    for k in f.kwargs:
        r = walk(f.kwargs[k], h.kwargs.get(k), False, k)
        if r:
            return r
    return None


def chunk_layout(joint, count=2):
    """The ChunkLayout of ``joint`` for ``count`` chunks, traced once and
    kept (the trace needs the process group the step names: trace inside
    it, e.g. in to_step_graph(..., chunks=2))."""
    if count < 2:
        raise FxError("gorun.fx: a chunk count of %d; want 2 or more" % count)
    if count not in joint._layouts:
        joint._layouts[count] = ChunkLayout(joint, count)
    return joint._layouts[count]


_STEP_MODE = {BATCH: "batch", PARTIAL: "partial", WHOLE: "replicated"}


# ---------------------------------------------------------------------------
# Joint graph -> step graph


def _is_view(nd):
    s = getattr(nd.target, "_schema", None)
    if s is None or not s.returns:
        return False
    a = s.returns[0].alias_info
    return a is not None and not a.is_write


def _bytes(val):
    if isinstance(val, torch.Tensor):
        return val.numel() * val.element_size()
    if isinstance(val, (list, tuple)):
        return sum(_bytes(v) for v in val)
    return 0


def _dtype(val, nd):
    if not isinstance(val, torch.Tensor) or val.dtype not in _DTYPES:
        raise FxError("gorun.fx: collective %s: dtype %s has no step-graph dtype"
                      % (nd.name, getattr(val, "dtype", type(val).__name__)))
    return _DTYPES[val.dtype]


def gathered_views(graph):
    """Maps each view of an all-gather's result (slice, view, t, ...,
    transitively) to that result: the wait_tensor node."""
    root = {}
    for nd in graph.nodes:
        if nd.op == "call_function" and nd.target is WAIT and nd.args[0].target is ALL_GATHER:
            root[nd] = nd
        elif nd.op == "call_function" and _is_view(nd) and nd.args and isinstance(nd.args[0], torch.fx.Node) \
                and nd.args[0] in root:
            root[nd] = root[nd.args[0]]
    return root


def to_step_graph(joint, costs=None, prefetch=1, group=None, join_regions=True, chunks=None):
    """The step graph (gorun.stepgraph/v1, as a dict) of a traced joint
    graph. ``costs`` maps FX node names to ns (profile_costs); without it
    every compute node costs 1 ns.

    Issue order. The traced graph waits on each collective right after
    issuing it (the autograd function's order); a step graph says where
    the runtime issues and waits, so this places them as FSDP does: a
    forward all-gather is issued at the start of the forward of the block
    ``prefetch`` blocks before its own (0: its own block), or once its
    shard exists if later; every other collective as soon as its input
    exists; every wait right before the first reader of its result (or
    the end of the step). gorun's passes then bucket and move them.

    Collectives keep the FX graph's process-group name unless ``group``
    renames them (graphs with one group only). ``join_regions``: see
    regions.

    ``chunks=k`` declares every tensor's chunk mode for the chunk pass,
    from chunk_layout(joint, k): batch (split along its batch dim),
    partial (a weight gradient: per-chunk parts are summed), replicated
    (no batch dim: parameters, masks). It traces the step once more, on
    1/k of the batch, in the process group the step names. Without it the
    chunk pass falls back on its defaults, which treat weight gradients as
    batch tensors; apply_plan then refuses the plan."""
    g = joint.gm.graph
    costs = costs or {}
    layout = chunk_layout(joint, chunks) if chunks else None

    def declare(t, nd):
        if layout is not None:
            m = layout.step_mode(nd.name)
            if m is not None:
                t["chunk"] = m
        return t
    dirs, regs = directions(g), regions(g, joint.blocks, join_regions)
    view_root = gathered_views(g)
    waits = {}  # collective node -> its wait
    for nd in g.nodes:
        if nd.op == "call_function" and nd.target is WAIT:
            c = nd.args[0]
            if c.target not in _COLLECTIVES:
                raise FxError("gorun.fx: wait %s waits on %s, not a collective" % (nd.name, c.name))
            if c in waits:
                raise FxError("gorun.fx: collective %s has two waits (%s, %s)" % (c.name, waits[c].name, nd.name))
            waits[c] = nd

    def name_of(a):
        # A read of a view of a gathered parameter is a read of the gathered tensor.
        return view_root[a].name if a in view_root and a is not view_root[a] else a.name

    tensors, body, colls = [], [], []
    for nd in g.nodes:
        val = nd.meta.get("val")
        if nd.op in ("placeholder", "get_attr"):  # get_attr: a constant (a buffer), an input of the step
            tensors.append(declare({"name": nd.name, "bytes": _bytes(val), "input": True}, nd))
            continue
        if nd.op == "output" or (nd.op == "call_function" and nd.target is WAIT):
            continue
        if nd.op != "call_function":
            raise FxError("gorun.fx: node %s: op %s is not supported" % (nd.name, nd.op))
        dirn, reg = dirs[nd], regs[nd]
        if nd.target in _COLLECTIVES:
            w = waits.get(nd)
            if w is None:
                raise FxError("gorun.fx: collective %s has no wait_tensor" % nd.name)
            if reg is None and dirn != "optimizer":
                raise FxError("gorun.fx: collective %s (%s) ran outside every block %s"
                              % (nd.name, dirn, joint.blocks))
            inp = nd.args[0]
            st = {"name": nd.name, "kind": "start", "direction": dirn, "op": _COLLECTIVES[nd.target],
                  "group": nd.args[-1] if group is None else group, "dtype": _dtype(inp.meta.get("val"), nd),
                  "members": [{"in": name_of(inp), "out": w.name, "bytes": _bytes(inp.meta.get("val"))}]}
            wt = {"name": w.name + ".wait", "kind": "wait", "direction": dirn, "of": nd.name}
            if reg is not None:
                st["region"] = wt["region"] = reg
            colls.append((st, wt))
            tensors.append({"name": w.name, "bytes": _bytes(w.meta.get("val"))})
            continue
        reads = []
        for a in nd.all_input_nodes:
            r = name_of(a)
            if r not in reads:
                reads.append(r)
        cn = {"name": nd.name, "kind": "compute", "direction": dirn, "cost_ns": max(1, int(costs.get(nd.name, 1))),
              "reads": reads, "writes": [nd.name]}
        if reg is not None:
            cn["region"] = reg
        body.append(cn)
        tensors.append(declare({"name": nd.name, "bytes": 0 if _is_view(nd) else _bytes(val)}, nd))

    # Place starts and waits among the compute nodes (positions: "before body[i]").
    writer = {t: i for i, c in enumerate(body) for t in c["writes"]}
    first_reader = {}
    for i, c in enumerate(body):
        for t in c["reads"]:
            first_reader.setdefault(t, i)
    fwd_first = {}
    for i, c in enumerate(body):
        if c["direction"] == "forward" and c.get("region") is not None:
            fwd_first.setdefault(c["region"], i)
    order = [b for b in joint.blocks if b in fwd_first]
    before = collections.defaultdict(list)
    for st, wt in colls:
        m = st["members"][0]
        at = writer[m["in"]] + 1 if m["in"] in writer else 0
        if st["op"] == "all_gather" and st["direction"] == "forward":
            k = order.index(st["region"]) if st["region"] in order else 0
            at = max(at, fwd_first[order[max(0, k - prefetch)]] if order else 0)
        w_at = first_reader.get(m["out"], len(body))
        if w_at < at:
            raise FxError("gorun.fx: collective %s: its result is read (by %s) before its input %s exists"
                          % (st["name"], body[w_at]["name"], m["in"]))
        before[at].append((0, st))
        before[w_at].append((1, wt))
    nodes = []
    for i in range(len(body) + 1):
        # at one position, starts before waits, each in traced order
        nodes.extend(x for _, x in sorted(before.get(i, ()), key=lambda p: p[0]))
        if i < len(body):
            nodes.append(body[i])
    used = {n.get("region") for n in nodes}
    groups = sorted({n["group"] for n in nodes if n["kind"] == "start"})
    return {"schema": SCHEMA, "groups": [{"name": gr, "size": joint.world} for gr in groups],
            "regions": [b for b in joint.blocks if b in used], "tensors": tensors, "nodes": nodes}


# ---------------------------------------------------------------------------
# gorun's planner


_CALIBRATED = {}  # process-group name -> calibrate_comm's figures, in this process


def calibrate_comm(group, world, reps=9, small=8, big=1 << 16):
    """Measures gorun's α-β communication model on the process group named
    ``group`` (``world`` ranks; every rank must call it, as a collective):
    all-gathers and reduce-scatters of ``small`` and ``big`` f32 elements
    per rank, each timed ``reps`` times between barriers (median), fitted
    as latency + bus bytes / bus bandwidth (bus bytes: (world-1)/world of
    the gathered buffer, as gorun's model counts them), plus the copy rate
    of a ``big``·world clone (a bucket's copy-in and copy-out). Every rank
    measures; the figures are agreed by a MAX over ranks of latency and of
    1/bandwidth (the slowest rank's link prices the step), so every rank
    gets the same dict and plans the same graph. The result
    ({"latency_ns", "bus_bandwidth", "copy_bandwidth"}, gorun_plan's keys)
    is also remembered for ``group`` in this process: ``plan`` uses it by
    default for a step graph on that group."""
    import torch.distributed as dist
    if world < 2:
        raise FxError("gorun.fx: calibrate_comm: group %r has %d rank(s); a collective needs 2 or more"
                      % (group, world))
    if small < 1 or big <= small or reps < 1:
        raise FxError("gorun.fx: calibrate_comm: want 1 <= small < big and reps >= 1 (got small=%d big=%d reps=%d)"
                      % (small, big, reps))

    def med(fn):
        fn()  # warm up: first use of a size allocates and connects
        ts = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2]

    def fit(t_small, t_big):
        bus = lambda n: (world - 1) / world * n * 4 * world  # noqa: E731 (bytes of the gathered buffer)
        inv_bw = max(t_big - t_small, 1e-9) / (bus(big) - bus(small))  # s per bus byte
        return max(t_small - bus(small) * inv_bw, 1e-7), inv_bw

    fits = []
    for op in ("all_gather", "reduce_scatter"):
        def run(n, op=op):
            if op == "all_gather":
                x = torch.zeros(n)
                return _c10d.wait_tensor(_c10d.all_gather_into_tensor(x, world, group))
            x = torch.zeros(n * world)
            return _c10d.wait_tensor(_c10d.reduce_scatter_tensor(x, "sum", world, group))
        fits.append(fit(med(lambda: run(small)), med(lambda: run(big))))
    buf = torch.zeros(big * world)
    t_copy = med(buf.clone)
    mine = torch.tensor([max(f[0] for f in fits), max(f[1] for f in fits), t_copy / buf.nbytes],
                        dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=_group_by_name(group))
    lat, inv_bw, inv_copy = mine.tolist()
    out = {"latency_ns": int(round(lat * 1e9)), "bus_bandwidth": 1.0 / inv_bw, "copy_bandwidth": 1.0 / inv_copy}
    _CALIBRATED[group] = out
    return out


def _group_by_name(name):
    from torch.distributed.distributed_c10d import _resolve_process_group
    try:
        return _resolve_process_group(name)
    except Exception as e:
        raise FxError("gorun.fx: no process group named %r in this process (%s)" % (name, e)) from e


def calibration(step):
    """The calibrate_comm figures remembered for the one group of step
    graph ``step``, or None (no calibration in this process, or several
    groups)."""
    names = {g["name"] for g in step.get("groups", ())}
    return _CALIBRATED.get(names.pop()) if len(names) == 1 else None


def plan(step, passes="blocks,overlap", comm=None, **options):
    """Runs gorun's passes on a step graph through libgorun's gorun_plan
    (the planner of ``gorun plan``, in process); returns (planned graph,
    summary), both dicts: the planned graph in the step-graph schema (the
    input itself when no pass rewrote it), the summary as ``gorun plan
    --json`` prints it, plus "comm": the communication constants used
    (None: gorun_plan's defaults).

    Communication is priced by measurement, not by constants: ``comm`` is
    calibrate_comm's dict; None (the default) takes the one calibrate_comm
    measured in this process for the step graph's group, if any; False
    plans with gorun_plan's default constants. Explicit ``options``
    (cap_bytes, latency_ns, bus_bandwidth, copy_bandwidth,
    reshard_prefetch, peak_budget_bytes, ...) win over ``comm``."""
    from gorun import _lib, _planner
    if comm is None:
        comm = calibration(step)
    if comm:
        bad = set(comm) - {"latency_ns", "bus_bandwidth", "copy_bandwidth"}
        if bad:
            raise FxError("gorun.fx: plan: comm has unknown keys %s (want calibrate_comm's)" % sorted(bad))
        options = dict(comm, **options)
    try:
        r = _planner.plan(step, passes, **options)
    except _lib.GorunError as e:
        raise FxError("gorun.fx: gorun_plan --passes %r: %s" % (passes, e)) from e
    summary = dict(r["plan"], comm=dict(comm) if comm else None, hash=r["hash"])
    return r.get("graph") or step, summary


# ---------------------------------------------------------------------------
# Step graph -> FX graph


def apply_plan(joint, planned):
    """An FX GraphModule that runs ``joint``'s step in the order and with
    the collectives of ``planned`` (a step graph that gorun's passes made
    from ``to_step_graph(joint)``). Its outputs equal the joint graph's."""
    src = joint.gm.graph
    by_name = {n.name: n for n in src.nodes}
    view_root = gathered_views(src)
    out = torch.fx.Graph()
    env = {}  # step-graph tensor name -> node of the new graph
    for nd in src.nodes:
        if nd.op in ("placeholder", "get_attr"):
            env[nd.name] = out.node_copy(nd)
            env[nd.name].meta = dict(nd.meta)
    pending = {}
    rederived = {}
    ch = _Chunker(joint, planned, out, env)

    def value(a, reads, where):
        """The new graph's value for FX arg ``a`` of a node that reads ``reads``."""
        base = view_root[a].name if a in view_root else None
        if base is not None:
            again = base + REGATHER
            if again in reads:
                return rederive(a, again)
        if a.name in env:
            return env[a.name]
        raise FxError("gorun.fx: node %s reads %s, which the plan has not produced by then" % (where, a.name))

    def rederive(a, again):
        """View chain a <- ... <- gathered, replayed on the re-gathered copy."""
        key = (a.name, again)
        if key not in rederived:
            if a is view_root[a]:
                rederived[key] = env[again]
            else:
                base = rederive(a.args[0], again)
                rest = torch.fx.node.map_arg(a.args[1:], lambda x: env[x.name])
                rederived[key] = out.call_function(a.target, (base, *rest), dict(a.kwargs))
                rederived[key].meta = dict(a.meta)
        return rederived[key]

    for sn in planned["nodes"]:
        kind, name = sn["kind"], sn["name"]
        if kind == "compute" and sn.get("builtin"):
            ch.builtin(sn)
        elif kind == "compute" and sn.get("chunk"):
            of = sn["chunk"].get("of")
            if of not in by_name:
                raise FxError("gorun.fx: planned chunk %s runs %s, which has no FX node in the joint graph" % (name, of))
            ch.compute(sn, by_name[of], lambda a, reads=set(sn.get("reads", ())): value(a, reads, name))
        elif kind == "compute":
            nd = by_name.get(name)
            if nd is None:
                raise FxError("gorun.fx: planned compute %s has no FX node in the joint graph" % name)
            reads = set(sn.get("reads", ()))
            new = out.node_copy(nd, lambda a: value(a, reads, name))
            new.meta = dict(nd.meta)
            env[name] = new
        elif kind == "start":
            ch.check_start(sn)
            pending[name] = _emit_start(out, sn, env, by_name)
        elif kind == "wait":
            of = sn["of"]
            if of not in pending:
                raise FxError("gorun.fx: wait %s: its start %s has not run" % (name, of))
            _emit_wait(out, pending.pop(of), env, by_name, ch)
        else:
            raise FxError("gorun.fx: planned node %s: unknown kind %r" % (name, kind))
    outn = [n for n in src.nodes if n.op == "output"][0]
    out.output(torch.fx.node.map_arg(outn.args[0], lambda a: value(a, (), "output")))
    out.lint()
    return torch.fx.GraphModule(joint.gm, out)


def chunk_of(name):
    """(author's name, chunk index) of a step-graph name the chunk pass
    made (``T#c``, primed ``T#c'`` when an earlier split took the name),
    or None."""
    base = name.rstrip("'")
    if "#" not in base:
        return None
    b, _, c = base.rpartition("#")
    return (b, int(c)) if c.isdigit() else None


class _Chunker:
    """apply_plan's half for the chunk pass's nodes: per-chunk copies of
    FX nodes (the op and arguments of the same node traced on a chunk of
    the batch), Split (a slice along the batch dim), Concat (a cat along
    it, in the whole tensor's memory order) and Sum (chunk 0 + chunk 1 +
    ..., in chunk order). Every split, copy and recombination is checked
    against chunk_layout; what does not split is refused, naming the node."""

    def __init__(self, joint, planned, out, env):
        self.joint, self.out, self.env = joint, out, env
        counts = {n["chunk"]["count"] for n in planned["nodes"] if n.get("chunk")}
        counts |= {len(n["writes"]) for n in planned["nodes"] if n.get("builtin") == "split"}
        if len(counts) > 1:
            raise FxError("gorun.fx: the plan splits into %s chunks; one count per plan" % sorted(counts))
        self.count = counts.pop() if counts else None
        self._layout = None
        self.mode = {}  # per-chunk tensor name -> its mode, as made

    @property
    def layout(self):
        if self._layout is None:
            self._layout = chunk_layout(self.joint, self.count)
        return self._layout

    def _whole(self, t, where):
        if t not in self.env:
            raise FxError("gorun.fx: node %s reads %s, which the plan has not produced by then" % (where, t))
        return self.env[t]

    def _per(self, t, where):
        if t not in self.mode:
            raise FxError("gorun.fx: node %s reads chunk %s, which the plan has not produced by then" % (where, t))
        return self.env[t], self.mode[t]

    def builtin(self, sn):
        op, name, reads, writes = sn["builtin"], sn["name"], sn.get("reads", []), sn.get("writes", [])
        if op == "split":
            (t,) = reads
            m = self.layout.value.get(t, (NO, "%s is not a node of the joint graph" % t))
            if m[0] != BATCH:
                raise FxError("gorun.fx: %s: the plan splits %s along the batch, but %s" % (
                    name, t, m[1] if m[0] == NO else "it has no batch dimension (%s)" % m[0]))
            x, d = self._whole(t, name), m[1]
            h = self.layout.small[t].meta["val"].shape[d]
            for c, w in enumerate(writes):
                self.env[w] = self.out.call_function(_aten.slice.Tensor, (x, d, c * h, (c + 1) * h))
                self.mode[w] = m
            return
        (t,) = writes
        parts = [self._per(r, name) for r in reads]
        kinds = {_leaf_kind(m) for _, m in parts}
        if op == "concat":
            if kinds != {BATCH} or len({m for _, m in parts}) != 1:
                raise FxError("gorun.fx: %s: concatenates %s, whose chunks are %s, not split along one batch dim"
                              % (name, t, sorted(kinds)))
            self.env[t] = self._cat([p for p, _ in parts], parts[0][1][1], t)
        elif op == "sum":
            if kinds != {PARTIAL}:
                raise FxError("gorun.fx: %s: sums the chunks of %s, which are %s, not partial sums" % (
                    name, t, sorted(kinds)))
            acc = parts[0][0]
            for p, _ in parts[1:]:
                acc = self.out.call_function(_aten.add.Tensor, (acc, p))
            self.env[t] = acc
        else:
            raise FxError("gorun.fx: %s: unknown builtin %r" % (name, op))

    def _cat(self, parts, d, t):
        """cat along batch dim d, laid out as the whole tensor was (a
        transposed tensor comes back transposed, so what reads it runs the
        same kernels on the same strides)."""
        fv = self.layout.full_val(t)
        if not isinstance(fv, torch.Tensor) or fv.is_contiguous():
            return self.out.call_function(_aten.cat.default, (parts, d))
        order = sorted(range(fv.dim()), key=lambda j: (-fv.stride(j), j))
        if order[0] != d:
            return self.out.call_function(_aten.cat.default, (parts, d))
        inv = [order.index(j) for j in range(fv.dim())]
        ps = [self.out.call_function(_aten.permute.default, (p, order)) for p in parts]
        return self.out.call_function(_aten.permute.default,
                                      (self.out.call_function(_aten.cat.default, (ps, 0)), inv))

    def compute(self, sn, nd, whole_value):
        """Chunk c of FX node nd: the small trace's op and arguments, with
        per-chunk reads from the chunks the plan made and the rest whole."""
        name, c = sn["name"], sn["chunk"]["index"]
        per_reads = {}
        for r in sn.get("reads", ()):
            p = chunk_of(r)
            if p is not None:
                if p[1] != c:
                    raise FxError("gorun.fx: %s (chunk %d) reads %s, a tensor of chunk %d" % (name, c, r, p[1]))
                per_reads[p[0]] = r
        per = {}
        for a in nd.all_input_nodes:
            if a.name in per_reads:
                per[a] = self._per(per_reads[a.name], name)[1]
        m = self.layout.rule(nd, per)
        if _leaf_kind(m) == NO:
            raise FxError("gorun.fx: node %s: the plan runs %s per chunk, but it cannot: %s" % (name, nd.name, m[1]))
        h = self.layout.small[nd.name]
        full = {x.name: x for x in nd.all_input_nodes}

        def arg(x):
            if x.name in per_reads:
                return self.env[per_reads[x.name]]
            return whole_value(full[x.name])
        new = self.out.call_function(h.target, torch.fx.node.map_arg(h.args, arg), torch.fx.node.map_arg(h.kwargs, arg))
        new.meta = dict(h.meta)
        (w,) = sn["writes"]
        self.env[w] = new
        self.mode[w] = m

    def check_start(self, sn):
        """A collective of per-chunk members: partial sums reduce-scatter or
        all-reduce chunk by chunk (their Sum afterwards adds the reduced
        parts); batch chunks only all-reduce, since an all-gather or a
        reduce-scatter lays ranks out along dim 0, where the chunks are."""
        for m in sn["members"]:
            if chunk_of(m["in"]) is None:
                continue
            _, mode = self._per(m["in"], sn["name"])
            if _leaf_kind(mode) == BATCH and sn["op"] != "all_reduce":
                raise FxError("gorun.fx: start %s: %s of %s, a chunk of the batch: ranks and chunks would "
                              "interleave along dim 0, so the chunks' results do not concatenate to the whole"
                              % (sn["name"], sn["op"], m["in"]))
            self.mode[m["out"]] = mode

    def shape_of(self, t, by_name):
        p = chunk_of(t)
        if p is not None and _leaf_kind(self.mode.get(t, (WHOLE, None))) == BATCH:
            return list(self.layout.small[p[0]].meta["val"].shape)
        return list(by_name[p[0] if p else t].meta["val"].shape)


def _emit_start(out, sn, env, by_name):
    op, members = sn["op"], sn["members"]
    ins = []
    for m in members:
        if m["in"] not in env:
            raise FxError("gorun.fx: start %s reads %s before anything wrote it" % (sn["name"], m["in"]))
        ins.append(env[m["in"]])
    # The author's collective of the first member gives the world size and
    # the reduce op (a re-gather is named after the gather it repeats).
    src_name = (members[0].get("from") or sn["name"]).split(REGATHER)[0]
    orig = by_name.get(src_name)
    if orig is None or orig.target not in _COLLECTIVES:
        raise FxError("gorun.fx: start %s: no FX collective named %s" % (sn["name"], src_name))
    world, group = orig.args[-2], orig.args[-1]  # the FX graph's own group, whatever the step graph calls it
    if op == "all_gather":
        buf = ins[0] if len(ins) == 1 else out.call_function(torch.ops.aten.cat.default, (ins,))
        coll = out.call_function(ALL_GATHER, (buf, world, group))
    elif op == "reduce_scatter":
        if len(ins) == 1:
            buf = ins[0]
        else:
            # rank-major: row r of the buffer is every member's r-th chunk
            rows = [out.call_function(torch.ops.aten.view.default, (x, [world, -1])) for x in ins]
            buf = out.call_function(torch.ops.aten.view.default,
                                    (out.call_function(torch.ops.aten.cat.default, (rows, 1)), [-1]))
        coll = out.call_function(REDUCE_SCATTER, (buf, orig.args[1], world, group))
    elif op == "all_reduce":
        buf = ins[0] if len(ins) == 1 else out.call_function(
            torch.ops.aten.cat.default, ([out.call_function(torch.ops.aten.view.default, (x, [-1])) for x in ins],))
        coll = out.call_function(ALL_REDUCE, (buf, orig.args[1], group))
        world = 1
    else:
        raise FxError("gorun.fx: start %s: op %s is not supported" % (sn["name"], op))
    return coll, sn, world


def _emit_wait(out, pending, env, by_name, ch):
    coll, sn, world = pending
    w = out.call_function(WAIT, (coll,))
    members, op = sn["members"], sn["op"]
    if len(members) == 1:
        env[members[0]["out"]] = w
        return
    # Copy-out: per member, elements (bytes / itemsize) of each rank's row.
    es = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "i32": 4, "i64": 8, "u8": 1}[sn["dtype"]]
    sizes = [m["bytes"] // es for m in members]
    if op == "all_gather":
        rows = out.call_function(torch.ops.aten.view.default, (w, [world, -1]))
        parts = out.call_function(torch.ops.aten.split_with_sizes.default, (rows, sizes, 1))
        for i, m in enumerate(members):
            p = out.call_function(_getitem, (parts, i))
            env[m["out"]] = out.call_function(torch.ops.aten.view.default,
                                              (out.call_function(torch.ops.aten.clone.default, (p,),
                                                                 {"memory_format": torch.contiguous_format}), [-1]))
    elif op == "reduce_scatter":  # this rank's row holds every member's shard in turn
        parts = out.call_function(torch.ops.aten.split_with_sizes.default, (w, [s // world for s in sizes]))
        for i, m in enumerate(members):
            env[m["out"]] = out.call_function(_getitem, (parts, i))
    else:  # all_reduce: members back to their shapes
        parts = out.call_function(torch.ops.aten.split_with_sizes.default, (w, sizes))
        for i, m in enumerate(members):
            shape = ch.shape_of(m["out"].split(REGATHER)[0], by_name)
            env[m["out"]] = out.call_function(torch.ops.aten.view.default,
                                              (out.call_function(_getitem, (parts, i)), shape))


def _getitem(x, i):
    return x[i]


def count_collectives(gm):
    """{"all_gather": n, "reduce_scatter": n, "all_reduce": n} issued by an FX graph."""
    c = collections.Counter()
    for nd in gm.graph.nodes:
        if nd.op == "call_function" and (nd.target in _COLLECTIVES or nd.target is ALL_GATHER_OUT):
            c["all_gather" if nd.target is ALL_GATHER_OUT else _COLLECTIVES[nd.target]] += 1
    return dict(c)


# ---------------------------------------------------------------------------
# Inductor's own passes on the same joint graph, for comparison


def inductor_bucketing(gm):
    """torch._inductor.fx_passes.bucketing as Inductor's post-grad pass
    runs it: every all-gather and reduce-scatter bucketed by size (its
    default cap), then a stable topological sort. Mutates and returns gm."""
    from torch._inductor.fx_passes import bucketing
    from torch._inductor.pattern_matcher import stable_topological_sort
    bucketing.bucket_all_gather(gm)
    bucketing.bucket_reduce_scatter(gm)
    stable_topological_sort(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return gm


def inductor_overlap(gm, costs=None):
    """torch._inductor.fx_passes.overlap_scheduling as
    schedule_overlap_bucketing runs it (FSDP pre-bucketing, the overlap
    scheduler, overlap-preserving bucketing), with compute times from
    ``costs`` (ns per node name, the same profile gorun's graph carries)
    and Inductor's own analytical model for collectives. Returns (gm, its
    estimate of exposed communication in ns)."""
    from torch._inductor.fx_passes.fsdp import pre_bucket_fsdp_collectives
    from torch._inductor.fx_passes.overlap_scheduling import OverlapScheduler
    costs = costs or {}

    def estimate(nd, override):
        if nd.target in _COLLECTIVES or nd.name not in costs:
            return None
        return costs[nd.name] / 1e6  # ms

    pre_bucket_fsdp_collectives(gm)
    s = OverlapScheduler(gm, max_in_flight_gb=5, max_compute_pre_fetch=200, collective_bucketing=True,
                         insert_overlap_deps=False, compute_overlap_multipler=1.0, max_coll_distance=200,
                         custom_runtime_estimation=estimate, compute_estimator="analytical")
    exposed = 0.0
    gm = s.run()
    for ci in s.collective_info.values():
        exposed += ci.exposed_time_ms
    gm.graph.lint()
    gm.recompile()
    return gm, int(exposed * 1e6)
