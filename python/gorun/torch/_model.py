"""distribute(): a torch module trained on gorun's plan and executor.

The wrapper translates; it does not schedule. Module hooks tell the
executor which region runs (gorun_executor_enter), gradient hooks hand it
each finished gradient (ready), and the end of backward waits for the step
(finish). Which gradients share a bucket, the order buckets go out, the
plan-hash exchange and the packing happen in Go (libgorun, overlap).
"""

import ctypes
import os
import statistics
import time
from contextlib import contextmanager

import torch
import torch.nn as nn

from . import _abi, _plan
from ._abi import PlanMismatchError

MODES = ("ddp", "fsdp", "hsdp")


def _mismatch(what, values, me):
    """PlanMismatchError if values (one per rank) are not all equal."""
    if all(v == values[0] for v in values):
        return
    others = [r for r, v in enumerate(values) if v != values[me]]
    desc = "; ".join("rank %d has %016x" % (r, v) for r, v in enumerate(values))
    raise PlanMismatchError("gorun.torch: ranks disagree on the %s: %s (ranks %s differ from this rank, %d): "
                            "every rank must wrap the same model" % (what, desc, others, me), others)


class DistributedModel(nn.Module):
    """A module whose gradients are reduced on gorun's plan. Made by
    distribute(); use it like DDP: ``loss = model(x); loss.backward();
    opt.step()``."""

    def __init__(self, module, mode="ddp", reshard_after_forward=True, shard_size=None, plan=None, group=None,
                 deterministic=False, trace=None, refresh_every=50, bucket_view=True, passes="blocks,overlap",
                 regather_ahead=0, dump_plan=None, micro_batches=None, plan_options=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError("gorun.torch.distribute: mode %r: want one of %s" % (mode, ", ".join(MODES)))
        if mode == "ddp" and shard_size not in (None, 0):
            raise ValueError("gorun.torch.distribute: shard_size=%r means nothing in ddp mode (every rank holds "
                             "every parameter); use mode='hsdp'" % (shard_size,))
        if group is not None and not isinstance(group, int):
            raise TypeError("gorun.torch.distribute: group must be a libgorun communicator handle (an int), got %s"
                            % type(group).__name__)
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if t.device.type != "cpu":
                raise RuntimeError(
                    "gorun.torch.distribute: %r is on %s; gorun.torch runs host (CPU) tensors only here: "
                    "move the model to the CPU (there is no silent CPU fallback for device tensors)" % (name, t.device))
        self.module = module
        self.mode = mode
        self._failed = None  # the error that failed this step (fault-tolerant mode only)
        self._join(group, deterministic)
        self._micro = self._check_micro(micro_batches, deterministic)
        self._micro_done = 0  # micro-batches run (forward with gradients) this step
        self._micro_grads = {}  # member -> its scaled gradient per micro-batch of this step
        self._kept = {}  # gradients of members no rank used this step, as they were before it
        self._nowhere = set()  # members no rank produced a gradient for this step
        self._flag_unused = True  # exchange used-flags this step (see _unused_everywhere)
        self._trace = trace
        self._refresh = max(int(refresh_every or 0), 0)
        self._bucket_view = bucket_view
        self._passes = passes
        self._regather_ahead = regather_ahead
        if plan_options is not None and not isinstance(plan_options, dict):
            raise TypeError("gorun.torch.distribute: plan_options must be a dict of the planner's options "
                            "(cap_bytes, latency_ns, ...), got %s" % type(plan_options).__name__)
        self._plan_options = dict(plan_options or {})
        for k, arg in (("passes", "passes"), ("reshard_prefetch", "regather_ahead")):
            if k in self._plan_options:
                raise ValueError("gorun.torch.distribute: plan_options[%r]: pass it as distribute(%s=...)" % (k, arg))
        self._dump_plan = dump_plan
        self._fixed_plan = plan
        self._agree(module)
        regions = _plan.find_regions(module)
        self._region_names = [r for r, _ in regions]
        self._members = _plan.find_members(module, self._region_names)
        self._codes = {m.name: _abi.dtype_code(m.param.dtype) for m in self._members}
        # deterministic micro-batches: each micro-batch's gradient is
        # scaled by 1/micro_batches (the same numbers at every world size)
        # and nothing is scaled again.
        self._scale = 1.0 if self._micro else 1.0 / self.world_size
        self._setup()
        self._hooks = []
        for r, m in regions:
            if r == _plan.ROOT:
                continue
            self._hooks.append(m.register_forward_pre_hook(self._pre_hook(r)))
            self._hooks.append(m.register_forward_hook(self._post_hook(r)))
        self._hook_fns = {}
        for m in self._members:
            self._hook_fns[m.name] = self._grad_hook(m)
            self._hooks.append(m.param.register_post_accumulate_grad_hook(self._hook_fns[m.name]))
        self._exec = None
        self._measured = 0  # steps whose costs were measured and planned from
        self._plans = 0  # executors made (a changed plan makes a new one)
        self._views = {}
        self._summary = None
        self._step = 0
        self._sync = True
        self._in_step = False
        self._queued = False
        self._order = []  # regions entered this step, forward order
        self._fwd_t0 = {}
        self._fwd_ns = {}
        self._grad_t = {}
        self._back_t0 = None
        self._t_begin = 0
        self._history = []

    # ---- the group: who takes part, and the collectives outside the plan --

    def _join(self, group, deterministic):
        """Sets the communicator the step's collectives run over, this
        rank's place in it and its size."""
        self._comm = group if group is not None else _abi.world(deterministic)
        self.rank, self.world_size = _abi.rank_size(self._comm)

    def _agree(self, module):
        """Before anything is exchanged, ranks must wrap the same model; then
        every rank starts from rank 0's parameters and buffers."""
        self._check_same("model (parameter names, shapes, dtypes, ties)", _plan.fingerprint(module))
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                if t.numel() and self.world_size > 1:
                    if t.is_contiguous():
                        self._dp_broadcast(t)
                    else:
                        c = t.contiguous()
                        self._dp_broadcast(c)
                        t.copy_(c)

    def _check_same(self, what, value):
        """PlanMismatchError unless every rank holds the same 64-bit value."""
        _mismatch(what, _abi.allgather_u64(self._comm, value), self.rank)

    def _guarded(self, collective, *args):
        """Runs one collective outside the plan. A fault-tolerant step
        keeps its error instead of raising it (see _ft.py)."""
        return collective(*args)

    def _dp_broadcast(self, t):
        """t from rank 0 to every rank, in place (outside the plan)."""
        self._guarded(_abi.broadcast_tensor, self._comm, t)

    def _dp_allreduce(self, t):
        """t summed over every rank, in place (outside the plan)."""
        self._guarded(_abi.allreduce_tensor, self._comm, t)

    def _new_executor(self, planned, groups, config):
        return _abi.Executor(planned, groups, config)

    # ---- the step --------------------------------------------------------

    def forward(self, *args, **kwargs):
        sync = self._sync and torch.is_grad_enabled()
        if self._micro and torch.is_grad_enabled():
            per = self._micro // self.world_size
            if sync != (self._micro_done == per - 1):
                raise RuntimeError(
                    "gorun.torch: deterministic=True with micro_batches=%d on %d ranks: each step is %d "
                    "micro-batches per rank, the first %d under no_sync() and the last outside it; this is "
                    "micro-batch %d of the step, %s no_sync()" % (
                        self._micro, self.world_size, per, per - 1, self._micro_done + 1,
                        "outside" if sync else "inside"))
            self._micro_done += 1
        if sync:
            if self._in_step:
                raise RuntimeError(
                    "gorun.torch: forward of step %d began before the backward of the previous one ran; every "
                    "forward with gradients (outside no_sync and torch.no_grad) needs its backward" % self._step)
            self._begin()
        out = self.module(*args, **kwargs)
        if sync:
            self._forward_done(out)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._backward_started)
        return out

    def _forward_done(self, out):
        pass

    # What a mode adds around the step (ddp: nothing).
    def _setup(self):
        self._allreduced = self._members

    def _entered(self, region):
        pass

    def _left(self, region, out):
        pass

    def _unused_everywhere(self, members):
        """The members no rank produced a gradient for this step (DDP's
        globally unused parameters): one small all-reduce of flags, which
        every rank issues whatever it saw. It runs on measured and refresh
        steps, and on every step after one where some rank left a member
        unused; a model whose every parameter got a gradient on every rank
        skips it until the next refresh (the same decision on every rank:
        the flags are reduced)."""
        if not members:
            return set()
        if self.world_size == 1:
            return {m.name for m in members if m.name not in self._grad_t}
        refresh = self._exec is None or (self._refresh and self._step % self._refresh == self._refresh - 1)
        if not (self._flag_unused or refresh):
            return set()
        used = torch.tensor([1.0 if m.name in self._grad_t else 0.0 for m in members], dtype=torch.float32)
        self._dp_allreduce(used)
        counts = used.tolist()
        self._flag_unused = any(u < self.world_size for u in counts)
        return {m.name for m, u in zip(members, counts) if u == 0.0}

    def _before_finish(self):
        # A parameter that got no gradient on this rank this step (unused
        # here, perhaps used on another rank) takes part with zeros, so
        # every replica gets the same average and none drifts. One that no
        # rank used keeps the gradient it had before the step (None after
        # zero_grad), as in DDP: _restore_unused puts it back after the
        # collectives, so an optimizer's weight decay leaves it alone.
        self._kept = {}
        nowhere = self._nowhere = self._unused_everywhere(self._members)
        for m in self._allreduced:
            if m.name not in self._grad_t:
                with torch.no_grad():
                    if m.name in nowhere:
                        g = m.param.grad
                        self._kept[m.name] = None if g is None else g.detach().clone()
                    v = self._views.get(m.name)
                    if v is not None:
                        v.zero_()
                        m.param.grad = v
                    else:
                        m.param.grad = torch.zeros_like(m.param)
                self._exec.ready("g/" + m.name, m.param.grad, m.param.grad, self._codes[m.name])

    def _after_finish(self, m):
        pass

    def _restore_unused(self):
        with torch.no_grad():
            for m in self._allreduced:
                if m.name not in self._kept:
                    continue
                old, v = self._kept[m.name], self._views.get(m.name)
                if old is None:
                    m.param.grad = None
                elif v is not None:
                    v.copy_(old)
                    m.param.grad = v
                else:
                    m.param.grad = old
        self._kept = {}

    def _begin(self):
        self._in_step = True
        self._t_begin = time.perf_counter_ns()
        self._order = []
        self._fwd_t0.clear()
        self._fwd_ns = {}
        self._grad_t = {}
        self._back_t0 = None
        if self._exec is not None:
            self._exec.begin(self._step)
            if self._region_names and self._region_names[0] == _plan.ROOT:
                self._exec.enter(_plan.ROOT)
        if self._region_names and self._region_names[0] == _plan.ROOT:
            self._order.append(_plan.ROOT)

    def _backward_started(self, g):
        if self._back_t0 is None:
            self._back_t0 = time.perf_counter_ns()
        return None

    def _pre_hook(self, region):
        def hook(mod, args):
            if not self._in_step:
                return None
            if self._exec is not None:
                self._exec.enter(region)  # refuses a region out of the plan's order
            elif region in self._fwd_t0:
                raise RuntimeError(
                    "gorun.torch: region %r ran twice in one forward; gorun.torch plans each module region once "
                    "per step (call a shared module through one region, or wrap its callers instead)" % region)
            self._fwd_t0[region] = time.perf_counter_ns()
            self._order.append(region)
            self._entered(region)
            return None
        return hook

    def _post_hook(self, region):
        def hook(mod, args, out):
            t0 = self._fwd_t0.get(region)
            if self._in_step and t0 is not None:
                self._fwd_ns[region] = time.perf_counter_ns() - t0
                self._left(region, out)
            return None
        return hook

    def _grad_hook(self, m):
        name = "g/" + m.name
        code = self._codes[m.name]

        def hook(p):
            if self._micro and self._micro_done:
                # Keep this micro-batch's gradient apart; the step's is the
                # fixed tree over all of them (see _micro_sum).
                i = self._micro_done - 1
                if p.grad is not None:
                    self._micro_grads.setdefault(m.name, {})[i] = p.grad * self._micro_scale
                if not self._in_step:
                    p.grad = None
                    return
                p.grad = self._micro_sum(m.name)
            if not self._in_step:
                return
            if not self._queued:
                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._grad_t[m.name] = time.perf_counter_ns()
            ex = self._exec
            if ex is None:
                return  # the measured step: reduced at its end
            g = p.grad
            v = self._views.get(m.name)
            if v is not None:
                if g is not v:
                    torch.mul(g, self._scale, out=v)
                    p.grad = v
                elif self.world_size > 1:
                    v.mul_(self._scale)
                ex.ready(name, v, v, code)
                return
            if not g.is_contiguous():
                g = p.grad = g.contiguous()
            if self.world_size > 1:
                g.mul_(self._scale)
            ex.ready(name, g, g, code)
        return hook

    def _finish(self):
        try:
            if self._micro:
                # Members whose last gradient came in an earlier micro-batch
                # of this step: their hooks did not run in this backward.
                for m in self._members:
                    if m.name in self._micro_grads and m.name not in self._grad_t:
                        m.param.grad = None
                        self._hook_fns[m.name](m.param)
        finally:
            self._queued = False
            self._micro_done = 0
            self._micro_grads = {}
        try:
            if self._exec is None:
                self._reduce_measured()
                self._replan()
            else:
                self._before_finish()
                m = self._exec.finish()
                self._restore_unused()
                self._after_finish(m)
                self._history.append((time.perf_counter_ns() - self._t_begin, m))
                del self._history[:-100]
                if self._refresh and self._step % self._refresh == self._refresh - 1:
                    self._replan()
        finally:
            self._in_step = False
            self._step += 1

    def _reduce_measured(self):
        """The first step's gradients, reduced in one flat all-reduce (the
        plan needs this step's timings, so there is none yet)."""
        nowhere = self._unused_everywhere(self._members)
        if self.world_size == 1:
            return
        by_dtype = {}
        for m in self._members:
            by_dtype.setdefault(m.param.dtype, []).append(m)
        with torch.no_grad():
            for ms in by_dtype.values():
                flat = torch.cat([(m.param.grad if m.param.grad is not None else torch.zeros_like(m.param))
                                  .reshape(-1) * self._scale for m in ms])
                self._dp_allreduce(flat)
                off = 0
                for m in ms:
                    n = m.param.numel()
                    # Every rank takes the average, also where the parameter
                    # got no gradient (see _before_finish).
                    if m.name in nowhere:
                        pass  # no rank used it: its gradient stays as it was (DDP)
                    elif m.param.grad is not None:
                        m.param.grad.copy_(flat[off:off + n].view_as(m.param))
                    else:
                        m.param.grad = flat[off:off + n].view_as(m.param).clone()
                    off += n

    # ---- deterministic micro-batches -------------------------------------

    def _check_micro(self, micro, deterministic):
        """micro_batches: the global batch's micro-batches (None: not split)."""
        if micro is None:
            return 0
        where = "gorun.torch.distribute: micro_batches=%r" % (micro,)
        if not deterministic:
            raise ValueError(where + " is the deterministic mode's global batch split; pass deterministic=True too")
        if not isinstance(micro, int) or micro < 1 or micro % self.world_size:
            raise ValueError(where + ": want a positive multiple of the world size (%d)" % self.world_size)
        per = micro // self.world_size
        if per & (per - 1):
            raise ValueError(where + " on %d ranks is %d per rank: the per-rank count must be a power of two, so "
                             "that each rank's sum is one subtree of the fixed tree" % (self.world_size, per))
        s = getattr(self, "_shard_size", None)
        if s and s < self.world_size and s & (s - 1):
            # hsdp reduces within a shard group, then across groups: that is
            # the one pairwise tree over all ranks only when a group is a
            # whole subtree of it.
            raise ValueError(where + " with shard_size=%d: the shard groups must be a power of two ranks, so that "
                             "reducing within a group and then across groups is the one fixed tree over all "
                             "ranks" % s)
        self._micro_scale = 1.0 / micro
        return micro

    def _micro_sum(self, name):
        """This step's gradient of one member on this rank: its micro-batch
        gradients summed along the fixed tree (at stride 1, 2, 4, ... entry i
        absorbs entry i+stride, i a multiple of 2*stride; a micro-batch that
        gave none counts as zero). libgorun's deterministic all-reduce
        continues the same tree over ranks, whose micro-batches are
        consecutive runs of equal power-of-two length, so the reduced
        gradient is the one tree over all micro-batches at any world size."""
        got = self._micro_grads.get(name, {})
        slots = [got.get(i) for i in range(self._micro // self.world_size)]
        stride = 1
        while stride < len(slots):
            for i in range(0, len(slots) - stride, 2 * stride):
                a, b = slots[i], slots[i + stride]
                slots[i] = b if a is None else (a if b is None else a + b)
            stride *= 2
        return slots[0]

    # ---- planning --------------------------------------------------------

    def _costs(self):
        """This step's region order and costs, as rank 0 measured them (every
        rank plans from the same numbers, so the plans are equal)."""
        order = list(self._order)
        for r in self._region_names:  # regions not run this step go last
            if r not in order:
                order.append(r)
        fwd = [float(self._fwd_ns.get(r, 0)) for r in order]
        bwd = [0.0] * len(order)
        prev = self._back_t0 or (min(self._grad_t.values()) if self._grad_t else 0)
        pos = {r: i for i, r in enumerate(order)}
        done = {}
        for m in self._members:
            t = self._grad_t.get(m.name)
            if t is not None:
                owner = min(m.readers, key=lambda r: pos[r])
                done[owner] = max(done.get(owner, 0), t)
        for r in reversed(order):
            if r in done:
                bwd[pos[r]] = float(max(done[r] - prev, 0))
                prev = done[r]
        # The order too: a region another rank skipped this step (a branch
        # taken on rank 0 only) must sit where rank 0 ran it.
        idx = [float(self._region_names.index(r)) for r in order]
        t = torch.tensor(idx + fwd + bwd, dtype=torch.float64)
        if self.world_size > 1:
            self._dp_broadcast(t)
        n = len(order)
        order = [self._region_names[int(i)] for i in t[:n].tolist()]
        return order, dict(zip(order, t[n:2 * n].tolist())), dict(zip(order, t[2 * n:].tolist()))

    def _replan(self):
        self._measured += 1
        order, fwd, bwd = self._costs()
        graph = self._step_graph(order, fwd, bwd)
        if self._fixed_plan is not None:
            planned, summary = self._fixed_plan, {}
        else:
            planned, summary = _plan.run_planner(graph, self._passes, self._regather_ahead, self._plan_options)
        config = "flush=1" + (" trace=1" if self._trace else "")
        ex = self._new_executor(planned, self._exec_groups(), config)
        try:
            self._check_same("plan", ex.hash())
        except BaseException:
            ex.close()
            raise
        if self._exec is not None:
            if self._exec.hash() == ex.hash():
                ex.close()  # the same plan: keep the views the gradients live in
                return
            self._write_trace()
            self._unview()
            self._exec.close()
        self._plans += 1
        if self._dump_plan and self.rank == 0:
            # The step graph as planned, for `gorun plan` to print again.
            with open(self._dump_plan, "w") as f:
                f.write(planned)
        self._exec, self._summary, self._graph, self._planned = ex, summary, graph, planned
        self._adopt()

    def _exec_groups(self):
        return {"dp": self._comm}

    def _step_graph(self, order, fwd, bwd):
        return _plan.ddp_graph(order, self._members, fwd, bwd, self.world_size)

    def _adopt(self):
        if self._bucket_view:
            self._make_views()

    def _unview(self):
        """Gradients that live in the executor's buckets move out, before
        the executor (and its buffers) goes."""
        for m in self._members:
            if m.name in self._views and m.param.grad is self._views[m.name]:
                m.param.grad = m.param.grad.clone()
        self._views = {}

    def _make_views(self):
        """Gradients live in their buckets' fused buffers (DDP's
        gradient_as_bucket_view): nothing is packed or scattered."""
        for m in self._members:
            ptr, n = self._exec.view("g/" + m.name)
            if not ptr:
                continue
            buf = (ctypes.c_char * n).from_address(ptr)
            v = torch.frombuffer(buf, dtype=m.param.dtype).view(m.param.shape)
            if m.param.grad is not None:
                v.copy_(m.param.grad)
                m.param.grad = v
            else:
                v.zero_()
            self._views[m.name] = v

    # ---- what users call -------------------------------------------------

    @contextmanager
    def no_sync(self):
        """Gradients accumulate locally; the first backward after the block
        reduces the sum (DDP's no_sync)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def full_state_dict(self):
        """The whole model's state dict (every rank holds all of it in ddp
        mode)."""
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Loads a whole-model state dict: full_state_dict()'s keys, or the
        wrapper's own ("module."-prefixed) ones."""
        return self.module.load_state_dict(self._module_keys(state_dict), strict=strict, assign=assign)

    def _apply(self, fn, recurse=True):
        """Every move and cast (.to, .cuda, .double, .to_empty, ...) goes
        through here. Once the model is distributed, only one that leaves
        each tensor as it is (``.to("cpu")``, ``.float()`` on float32) is
        let through: the executor's buckets, the shards and the gradients
        viewed in bucket memory were made for these CPU tensors of these
        dtypes, so a moved or cast parameter would go on training with
        gradients that are never reduced. Each tensor's kind is probed on a
        one-element CPU tensor of its dtype before anything is changed, so
        a refused call changes nothing."""
        probes = {}
        for name, t in list(self.named_parameters()) + list(self.named_buffers()):
            if t.dtype not in probes:
                p = torch.zeros(1, dtype=t.dtype)
                probes[t.dtype] = (p, fn(p))
            p, q = probes[t.dtype]
            if q is not p:
                raise RuntimeError(
                    "gorun.torch.distribute: %r (%s on %s) would become %s on %s: a distributed model's tensors "
                    "cannot be moved or cast, since its buckets and shards hold them where they are; move or cast "
                    "the model before distribute() (gorun.torch runs CPU tensors; there is no silent CPU path for "
                    "device tensors)" % (name, str(t.dtype).replace("torch.", ""), t.device,
                                         str(q.dtype).replace("torch.", ""), q.device))
        return super()._apply(fn, recurse)

    def _module_keys(self, state_dict):
        keys = list(state_dict)
        own = self.module.state_dict().keys()
        if keys and not all(k in own for k in keys) and all(k.startswith("module.") for k in keys):
            return {k[len("module."):]: v for k, v in state_dict.items()}
        return state_dict

    def plan(self):
        """The bucket plan the executor runs (buckets.Plan as a dict), or None
        before the first step has been measured."""
        return self._exec.plan() if self._exec is not None else None

    def metrics(self):
        """Medians over the recent steps (seconds, bytes) and the plan."""
        h = self._history[-20:]
        med = (lambda xs: statistics.median(xs) if xs else 0.0)
        out = {
            "mode": self.mode,
            "steps": self._step,
            "step_time": med([t / 1e9 for t, _ in h]),
            "exposed_communication": med([m["exposed_ns"] / 1e9 for _, m in h]),
            "communication": med([m["comm_ns"] / 1e9 for _, m in h]),
            "peak_gathered_bytes": 0,  # ddp gathers no parameters
            "fused_peak_bytes": max([m["fused_peak_bytes"] for _, m in h], default=0),
            "copied_bytes": med([m["copied_bytes"] for _, m in h]),
            "buckets": h[-1][1]["buckets"] if h else 0,
            "plan_hash": "%016x" % self._exec.hash() if self._exec is not None else None,
            "plans_measured": self._measured,
            "plans_made": self._plans,
            "estimate": (self._summary or {}).get("estimate"),
        }
        if self._trace:
            out["trace"] = self._write_trace()
        return out

    def _write_trace(self):
        if not self._trace or self._exec is None:
            return None
        path = self._trace.format(rank=self.rank) if "{rank}" in self._trace else "%s.rank%d.json" % (self._trace, self.rank)
        self._exec.trace(os.path.abspath(path))
        return os.path.abspath(path)

    def close(self):
        """Frees the executor (its fused buffers, gradients viewed in them
        are copied out first) and removes the hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._exec is not None:
            self._unview()
            self._write_trace()
            self._exec.close()
            self._exec = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def distribute(model, mode="ddp", reshard_after_forward=True, shard_size=None, plan=None, group=None,
               deterministic=False, trace=None, **options):
    """Wraps model for data-parallel training on gorun's plan and executor.

    mode: "ddp" (replicated parameters, gradients all-reduced in buckets),
    "fsdp" (per-region flat shards, gathered as the plan says), "hsdp"
    (fsdp within groups of shard_size ranks, replicated across them).
    plan: a planned step graph (JSON text) to run instead of planning from
    the measured first step. group: a gorun communicator handle (default:
    the world). deterministic: reduce along one fixed tree. trace: a path
    ("{rank}" is replaced) for a Perfetto timeline of the executor.
    Options: refresh_every (replan from measured costs every K steps, 0
    never), bucket_view (gradients live in the buckets, default True),
    passes (the planner's passes), regather_ahead (fsdp: how many backward
    blocks ahead of its reader a re-gather starts; 0, the default, holds the
    fewest parameters, 1 hides the re-gather behind a block's backward),
    plan_options (a dict of the planner's options, gorun_plan's keys:
    cap_bytes, latency_ns, ...),
    micro_batches (with deterministic=True: the global batch's micro-batches,
    see docs/torch-step.md; results are then the same bits at any world
    size), dump_plan
    (a path: rank 0 writes the planned step graph there, which `gorun plan
    FILE` prints), manager (a gorun.ft.Manager, with mode="hsdp": a replica
    group shards the model, and each step runs over the Manager's quorum;
    see _ft.py and docs/torch-step.md)."""
    manager = options.pop("manager", None)
    if manager is not None:
        from ._ft import FaultTolerantModel
        return FaultTolerantModel(model, manager, mode=mode, reshard_after_forward=reshard_after_forward,
                                  shard_size=shard_size, plan=plan, group=group, deterministic=deterministic,
                                  trace=trace, **options)
    if mode in ("fsdp", "hsdp"):
        from ._fsdp import ShardedModel
        cls = ShardedModel
    else:
        cls = DistributedModel
    return cls(model, mode=mode, reshard_after_forward=reshard_after_forward, shard_size=shard_size,
                            plan=plan, group=group, deterministic=deterministic, trace=trace, **options)
