"""fsdp mode: flat per-region shards, gathered as the plan says.

Each region's trainable parameters (those whose gradients its backward
completes) become one flat shard per rank; the optimizer sees each
parameter's piece of it (a view), so that a parameter no rank used keeps no
gradient while the collectives stay flat. The module's own parameters
become views into one full buffer per region, whose memory exists only
while the plan holds the gathered copy: a region's forward pre-hook runs
the plan's actions before its compute (start the all-gathers the plan
issues there, wait for the ones it waits for), its post-forward hook frees
what the plan reads last there, and the first gradient of a region's output
runs the plan's actions before that region's backward (the re-gathers the
reshard pass added) and makes the region's parameters' gradients views into
its flat gradient, so autograd accumulates there; when the region's last
gradient is in, the hook hands the flat gradient to the executor, whose
reduce-scatter writes the shard's gradient. Parameters on the root module
itself stay whole and are all-reduced, as in ddp mode.
"""

import time

import torch

from . import _abi, _plan
from ._model import DistributedModel


class ShardedModel(DistributedModel):
    """distribute(mode="fsdp"): see the module comment."""

    def __init__(self, module, mode="fsdp", reshard_after_forward=True, shard_size=None, **kw):
        if mode == "fsdp" and shard_size not in (None, 0):
            raise ValueError("gorun.torch.distribute: shard_size=%r: fsdp mode shards over the whole group; "
                             "shard within groups and replicate across them with mode='hsdp'" % shard_size)
        if mode == "hsdp" and (not isinstance(shard_size, int) or shard_size < 1):
            raise ValueError("gorun.torch.distribute: mode 'hsdp' needs shard_size, the ranks of one shard group "
                             "(a divisor of the world size), got %r" % (shard_size,))
        if mode == "hsdp" and kw.get("group") is not None:
            raise ValueError("gorun.torch.distribute: mode 'hsdp' makes its groups from the world; group= is for "
                             "ddp and fsdp")
        self._shard_size = shard_size if mode == "hsdp" else None
        self._reshard = reshard_after_forward
        kw.setdefault("passes", "reshard,blocks,overlap" if reshard_after_forward else "blocks,overlap")
        kw["bucket_view"] = False
        super().__init__(module, mode=mode, **kw)

    # ---- set-up: shards, views, the full buffers -------------------------

    def _setup(self):
        order = self._region_names
        w = self.world_size
        s = self._shard_size or w
        if w % s != 0:
            raise ValueError("gorun.torch.distribute: shard_size=%d does not divide the world of %d ranks" % (s, w))
        self._ssize, self._srank = s, self.rank % s
        self._shard_comm, self._rep_comm = self._comm, None
        if s < w:
            self._shard_comm, self._rep_comm = self._make_groups(s, w)
        self._units, self._replicated = _plan.units_of(order, self._members, s)
        self._allreduced = self._replicated
        self._whole = {m.name: m for m in self._replicated}
        self._unit_of = {}
        self._full = {}  # unit name -> flat full tensor (storage freed when not held)
        self._shards = {}  # unit name -> this rank's flat shard (a plain tensor)
        self._pieces = {}  # unit name -> [(member, its parameter: a view of the shard, lo, hi in the shard)]
        self._slot = {}  # member name -> (unit, offset)
        with torch.no_grad():
            for u in self._units:
                full = torch.zeros(u.padded, dtype=u.dtype)
                off = 0
                for m in u.members:
                    n = m.param.numel()
                    full[off:off + n].copy_(m.param.detach().reshape(-1))
                    self._unit_of[m.name] = u
                    self._slot[m.name] = (u, off)
                    off += n
                lo = self._srank * u.shard_numel
                shard = full[lo:lo + u.shard_numel].clone()
                # What the optimizer sees: each member's part of this
                # rank's shard (perhaps empty), a parameter that views the
                # shard (FSDP2's per-parameter shards), so that one no rank
                # used can keep no gradient while the shard's collectives
                # stay flat.
                pieces, off = [], 0
                for m in u.members:
                    n = m.param.numel()
                    a = min(max(off - lo, 0), u.shard_numel)
                    b = min(max(off + n - lo, 0), u.shard_numel)
                    pieces.append((m, torch.nn.Parameter(shard[a:b]), a, b))
                    m.param.data = full[off:off + n].view(m.param.shape)
                    off += n
                self._full[u.name] = full
                self._shards[u.name] = shard
                self._pieces[u.name] = pieces
        self._held = 0
        self._unsynced = set()  # units gathered for no_sync micro-batches
        self._grad_copies = 0  # gradients that missed their view (copied)
        self._peak = 0
        self._peaks = []
        self._gflat = {}
        self._gcount = {}
        self._rs_out = {}
        self._deferred = []
        self._bwd_done = set()
        self._before, self._free_after, self._plan_peak = {}, {}, 0
        # Until the first step has been measured every unit stays gathered
        # (the full buffers hold the broadcast parameters).
        self._held = sum(self._nbytes(u) for u in self._units)

    def _make_groups(self, s, w):
        """The shard group's and the replica group's communicators: shard
        groups are runs of s ranks; a replica group holds the ranks with
        the same place in every shard group."""
        base = self.rank - self._srank
        return (_abi.new_group(self._comm, [base + i for i in range(s)], "gorun.torch.shard"),
                _abi.new_group(self._comm, [self._srank + k * s for k in range(w // s)], "gorun.torch.replica"))

    def _nbytes(self, u):
        return u.padded * u.es

    def _alloc(self, u):
        st = self._full[u.name].untyped_storage()
        if st.nbytes() == 0:
            st.resize_(self._nbytes(u))
            self._held += self._nbytes(u)
            self._peak = max(self._peak, self._held)

    def _free(self, u):
        st = self._full[u.name].untyped_storage()
        if st.nbytes() != 0:
            st.resize_(0)
            self._held -= self._nbytes(u)

    def _gather_now(self, u):
        """A blocking all-gather outside the plan (before the first step is
        measured, and for full_state_dict)."""
        self._alloc(u)
        self._guarded(_abi.allgather_tensor, self._shard_comm, self._shards[u.name].detach(), self._full[u.name])

    # ---- what the optimizer and users see ---------------------------------

    def forward(self, *args, **kwargs):
        if self._exec is not None and not torch.is_grad_enabled():
            # Evaluation: no plan runs; every unit is gathered for the call
            # (not counted in a training step's peak).
            peak = self._peak
            for u in self._units:
                self._gather_now(u)
            try:
                return self.module(*args, **kwargs)
            finally:
                for u in self._units:
                    self._free(u)
                self._peak = peak
        if self._exec is not None and not self._sync:
            # no_sync: no plan runs; the units stay gathered through this
            # backward and the next micro-batch's (the shards do not change
            # before the next step).
            for u in self._units:
                if self._full[u.name].untyped_storage().nbytes() == 0:
                    self._gather_now(u)
                    self._unsynced.add(u.name)
        elif self._unsynced:
            for u in self._units:
                if u.name in self._unsynced:
                    self._free(u)
            self._unsynced = set()
        return super().forward(*args, **kwargs)

    def no_sync(self):
        """Gradients accumulate locally, whole; the first backward after the
        block reduce-scatters the sum (FSDP1's no_sync: inside the block
        every unit stays gathered, and each parameter's gradient is held in
        full, until the next forward outside it)."""
        return super().no_sync()

    def parameters(self, recurse=True):
        """What the optimizer updates: each trainable parameter's part of
        this rank's shard (one-dimensional, perhaps empty; views of the
        flat shard), and the parameters kept whole (the root's own)."""
        for _, p in self.named_parameters():
            yield p

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """parameters() under the module's names ("module." and the first
        name of a tied parameter), as DDP's wrapper names them."""
        for u in self._units:
            for m, p, _, _ in self._pieces[u.name]:
                yield prefix + "module." + m.name, p
        for m in self._replicated:
            yield prefix + "module." + m.name, m.param

    def full_state_dict(self):
        """The whole model's state dict, gathered from the shards on every
        rank (collective: every rank must call it)."""
        with torch.no_grad():
            sd = {k: v.detach() for k, v in self.module.state_dict(keep_vars=True).items()}
            names = {}
            for name, p in self.module.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), []).append(name)
            out = {}
            for u in self._units:
                full = torch.empty(u.padded, dtype=u.dtype)
                _abi.allgather_tensor(self._shard_comm, self._shards[u.name].detach(), full)
                off = 0
                for m in u.members:
                    n = m.param.numel()
                    v = full[off:off + n].view(m.param.shape).clone()
                    for k in names[id(m.param)]:
                        out[k] = v
                    off += n
            for k, v in sd.items():
                if k not in out:
                    out[k] = v.clone()
            return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Loads a whole-model state dict (full_state_dict()'s keys, or the
        wrapper's own "module."-prefixed ones) into the model and its
        shards: each unit is gathered, loaded, and this rank's slice copied
        into its shard. Collective: every rank must call it, with the same
        dict. The optimizer's state is not touched."""
        if assign:
            raise ValueError("gorun.torch: load_state_dict(assign=True) in %s mode would replace the parameters "
                             "that are views of the flat buffers; load with assign=False" % self.mode)
        sd = self._module_keys(state_dict)
        with torch.no_grad():
            gathered, peak = [], self._peak
            for u in self._units:
                if self._full[u.name].untyped_storage().nbytes() == 0:
                    self._gather_now(u)  # parameters the dict leaves out keep their values
                    gathered.append(u)
            try:
                res = self.module.load_state_dict(sd, strict=strict)
                for u in self._units:
                    lo = self._srank * u.shard_numel
                    self._shards[u.name].copy_(self._full[u.name][lo:lo + u.shard_numel])
            finally:
                for u in gathered:
                    self._free(u)
                self._peak = peak
        return res

    def local_state_dict(self):
        """This rank's part of the model, as it holds it: its flat shard of
        every unit ("shards", by region), the parameters kept whole
        ("whole") and the module's buffers ("buffers"); tensors are this
        rank's own (not copies). What a fault-tolerant heal copies from the
        rank at the same place in a live replica group (with the
        optimizer's state), or a per-rank checkpoint."""
        return {"shards": {u.name: self._shards[u.name].detach() for u in self._units},
                "whole": {m.name: m.param.detach() for m in self._replicated},
                "buffers": dict(self.module.named_buffers())}

    def load_local_state_dict(self, state):
        """Loads local_state_dict()'s dict of a rank at this rank's place
        (the same model and shard size), in place: the shards the
        optimizer's pieces view, the whole parameters, the buffers. Not
        collective: the next step gathers the shards afresh."""
        want = self.local_state_dict()
        for part in ("shards", "whole", "buffers"):
            got = state.get(part) if isinstance(state, dict) else None
            if not isinstance(got, dict) or set(got) != set(want[part]):
                raise ValueError("gorun.torch: load_local_state_dict: %r holds %s, want %s (local_state_dict() of "
                                 "this model at this rank's place)" % (part, sorted(got) if isinstance(got, dict)
                                                                      else got, sorted(want[part])))
            for k, t in want[part].items():
                v = got[k]
                if not isinstance(v, torch.Tensor) or v.shape != t.shape or v.dtype != t.dtype:
                    raise ValueError("gorun.torch: load_local_state_dict: %s %r is %s, want %s %s" % (
                        part, k, tuple(v.shape) + (v.dtype,) if isinstance(v, torch.Tensor) else type(v).__name__,
                        tuple(t.shape), t.dtype))
        with torch.no_grad():
            for part in ("shards", "whole", "buffers"):
                for k, t in want[part].items():
                    t.copy_(state[part][k])

    # ---- the plan ---------------------------------------------------------

    def _step_graph(self, order, fwd, bwd):
        return _plan.fsdp_graph(order, self._units, self._replicated, fwd, bwd, self.world_size, self._ssize)

    def _exec_groups(self):
        g = {"dp": self._comm}
        if self._rep_comm is not None:
            g["shard"], g["replica"] = self._shard_comm, self._rep_comm
        return g

    def _adopt(self):
        self._before, self._free_after, self._plan_peak = _plan.gather_schedule(self._planned)
        self._plan_order = list(self._graph["regions"])
        self._pos = {r: i for i, r in enumerate(self._plan_order)}
        self._owned = {}
        for u in self._units:
            self._owned.setdefault(u.region, []).append(u)
        by = {u.name: u for u in self._units}
        self._by_tensor = {"s/" + u.name: u for u in self._units}
        self._by_out = {}
        for u in by.values():
            self._by_out["F/" + u.name] = u
            self._by_out["F/" + u.name + _plan.REGATHER] = u
        # From now on the plan decides what is held.
        for u in self._units:
            self._free(u)
        self._peak = self._held

    # ---- the step ---------------------------------------------------------

    def _run(self, compute):
        """The plan's gather actions before compute."""
        ex = self._exec
        for kind, arg in self._before.get(compute, ()):
            if kind == "start":
                for tin, tout in arg:
                    u = self._by_tensor[tin]
                    self._alloc(u)
                    ex.ready(tin, self._shards[u.name].detach(), self._full[u.name], _abi.dtype_code(u.dtype))
            elif kind == "replicate":
                # hsdp: the reduced shard (or a parameter kept whole, reduced
                # within the shard group), all-reduced across replicas in
                # place.
                for tin, tout in arg:
                    out = self._rs_out.get(tin[2:])
                    if out is None:
                        out = self._whole[tin[2:]].param.grad
                    ex.ready(tin, out, out, _abi.dtype_code(out.dtype))
            else:
                ex.wait(arg)

    def _release(self, compute):
        for t in self._free_after.get(compute, ()):
            self._free(self._by_out[t])

    def _begin(self):
        super()._begin()
        if self._exec is None:
            return
        # The step's peak counts from its first micro-batch: units gathered
        # for no_sync micro-batches before this forward count (the peak
        # was reset at the end of the previous step).
        self._deferred = []
        self._bwd_done = set()
        self._fwd_done = set()
        self._gflat, self._gcount, self._rs_out = {}, {}, {}
        if self._region_names and self._region_names[0] == _plan.ROOT:
            self._fwd_done.add(_plan.ROOT)
            self._run("fwd/" + _plan.ROOT)

    def _entered(self, region):
        if self._exec is not None:
            self._catch_up_forward(self._pos[region])
            self._fwd_done.add(region)
            self._run("fwd/" + region)

    def _catch_up_forward(self, upto):
        """Regions before position upto that did not run this step still
        take their collectives, so that every rank issues the same ones
        (a region one rank skips may run on another)."""
        for r in self._plan_order[:upto]:
            if r not in self._fwd_done:
                self._fwd_done.add(r)
                self._run("fwd/" + r)
                self._release("fwd/" + r)

    def _left(self, region, out):
        if self._exec is None:
            return
        self._release("fwd/" + region)
        outs = [out] if isinstance(out, torch.Tensor) else [t for t in (out if isinstance(out, (tuple, list)) else ())
                                                             if isinstance(t, torch.Tensor)]
        for t in outs:
            if t.requires_grad:
                t.register_hook(self._backward_of(region))

    def _forward_done(self, out):
        if self._exec is None:
            return
        if self._region_names and self._region_names[0] == _plan.ROOT:
            self._release("fwd/" + _plan.ROOT)
        self._catch_up_forward(len(self._plan_order))
        self._run("loss")
        self._release("loss")

    def _backward_of(self, region):
        def hook(g):
            if self._exec is not None and self._in_step and region not in self._bwd_done:
                self._enter_backward(region)
            return None
        return hook

    def _enter_backward(self, region):
        # Regions whose backward comes first but did not announce itself
        # (not run this step) go first, in plan order.
        for r in reversed(self._plan_order[self._pos[region] + 1:]):
            if r not in self._bwd_done:
                self._backward_actions(r)
        self._backward_actions(region)

    def _backward_actions(self, region):
        self._end_backward()
        if self._trace:
            self._exec.mark("backward " + region)
        self._bwd_done.add(region)
        self._deferred = [region]
        self._view_grads(region)
        self._run("bwd/" + region)

    def _view_grads(self, region):
        """The region's parameters get their gradients as views into its
        flat gradient before its backward runs, so autograd accumulates
        into the buffer the reduce-scatter reads: nothing to copy in the
        hooks (DDP's gradient_as_bucket_view, for a flat shard)."""
        for u in self._owned.get(region, ()):
            if u.name in self._gflat:
                continue
            flat = self._gflat[u.name] = torch.zeros(u.padded, dtype=u.dtype)
            for m in u.members:
                _, off = self._slot[m.name]
                v = flat[off:off + m.param.numel()].view(m.param.shape)
                if m.param.grad is not None:
                    v.copy_(m.param.grad)  # accumulated under no_sync
                m.param.grad = v

    def _end_backward(self):
        """The region whose backward ran last is over: what the plan read
        last there is freed, and its gradients go out even if some of its
        parameters got none this step (zeros in their place)."""
        for r in self._deferred:
            self._release("bwd/" + r)
            for u in self._owned.get(r, ()):
                if self._micro:
                    # Members whose gradients came in earlier micro-batches
                    # of this step only: their hooks did not run in this
                    # backward; their sum goes in now.
                    for m in u.members:
                        if m.name in self._micro_grads and m.name not in self._grad_t:
                            self._hook_fns[m.name](m.param)
                c = self._gcount.get(u.name, 0)
                if c < len(u.members):
                    # Some (or all) of its parameters got no gradient on
                    # this rank: zeros stand in, so that the ranks that
                    # did use them still get every shard's gradient.
                    self._gcount[u.name] = len(u.members)
                    if u.name not in self._gflat:
                        self._gflat[u.name] = torch.zeros(u.padded, dtype=u.dtype)
                    self._reduce(u)
        self._deferred = []

    def _grad_hook(self, m):
        u = self._unit_of.get(m.name)
        if u is None:
            return super()._grad_hook(m)  # kept whole: all-reduced as in ddp mode
        _, off = self._slot[m.name]
        n = m.param.numel()
        total = len(u.members)

        def hook(p):
            micro = self._micro and self._micro_done
            if micro:
                # deterministic micro-batches (as in ddp mode): this
                # micro-batch's gradient is kept apart, and the step's is
                # their fixed-tree sum.
                i = self._micro_done - 1
                if p.grad is not None:
                    self._micro_grads.setdefault(m.name, {})[i] = p.grad * self._micro_scale
                p.grad = None
                if not self._in_step:
                    return
            elif not self._in_step:
                return
            if not self._queued:
                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._grad_t[m.name] = time.perf_counter_ns()
            g = self._micro_sum(m.name) if micro else p.grad
            if self._exec is None:
                p.grad = g
                return  # the measured step: reduced at its end
            flat = self._gflat.get(u.name)
            if flat is None:
                flat = self._gflat[u.name] = torch.zeros(u.padded, dtype=u.dtype)
            if micro:
                if g is not None:
                    flat[off:off + n].copy_(g.reshape(-1))
            elif g.data_ptr() != flat.data_ptr() + off * u.es:
                # Not in its view (its region's backward did not announce
                # itself first): copied in.
                flat[off:off + n].copy_(g.reshape(-1))
                self._grad_copies += 1
            c = self._gcount[u.name] = self._gcount.get(u.name, 0) + 1
            if c == total:
                self._reduce(u)
        return hook

    def _reduce(self, u):
        flat = self._gflat[u.name]
        if self.world_size > 1:
            flat.mul_(self._scale)
        out = self._rs_out[u.name] = torch.empty(u.shard_numel, dtype=u.dtype)
        self._exec.ready("g/" + u.name, flat, out, _abi.dtype_code(u.dtype))

    def _before_finish(self):
        # Regions whose backward never announced itself (an input layer
        # whose output needs no gradient): their actions still run, in plan
        # order, so that every rank issues the same collectives.
        for r in reversed(self._plan_order):
            if r not in self._bwd_done:
                self._backward_actions(r)
        self._end_backward()
        super()._before_finish()  # the root's own parameters (zeros where unused)
        self._run("opt")  # hsdp: the first region's replica all-reduces

    def _after_finish(self, m):
        for u in self._units:
            for mm in u.members:
                mm.param.grad = None  # views of the flat gradients, done with
        for name, out in self._rs_out.items():
            self._give_grads(name, out)
        self._gflat, self._rs_out = {}, {}
        for u in self._units:
            self._free(u)  # nothing is held between steps
        self._peaks.append(self._peak)
        del self._peaks[:-100]
        self._peak = self._held  # the next step's peak starts here

    def _give_grads(self, unit, out):
        """The unit's reduced shard gradient goes to its pieces (views of
        out), added to what they hold if they hold one. A member no rank
        used this step keeps the gradient it had (None after zero_grad), as
        in DDP and FSDP2, so that an optimizer's weight decay leaves it
        alone; its zeros still took part in the reduce-scatter."""
        for m, p, a, b in self._pieces[unit]:
            if m.name in self._nowhere:
                continue
            g = out[a:b]
            p.grad = g if p.grad is None else p.grad + g

    def _reduce_measured(self):
        """The measured first step: every unit was gathered; its gradients
        are reduce-scattered (blocking) into the shards, the root's
        all-reduced."""
        self._nowhere = self._unused_everywhere(self._members)
        with torch.no_grad():
            for u in self._units:
                flat = torch.zeros(u.padded, dtype=u.dtype)
                off = 0
                for m in u.members:
                    n = m.param.numel()
                    if m.param.grad is not None:
                        flat[off:off + n].copy_(m.param.grad.reshape(-1))
                        m.param.grad = None
                    off += n
                flat.mul_(self._scale)
                out = torch.empty(u.shard_numel, dtype=u.dtype)
                if self._ssize > 1:
                    self._guarded(_abi.reduce_scatter_tensor, self._shard_comm, flat, out)
                else:
                    out.copy_(flat)
                if self._rep_comm is not None:
                    self._guarded(_abi.allreduce_tensor, self._rep_comm, out)
                self._give_grads(u.name, out)
            if self.world_size > 1:
                for m in self._replicated:
                    g = m.param.grad if m.param.grad is not None else torch.zeros_like(m.param)
                    g = g.contiguous().mul_(self._scale)
                    self._dp_allreduce(g)
                    if m.name not in self._nowhere:
                        m.param.grad = g

    def metrics(self):
        out = super().metrics()
        out["peak_gathered_bytes"] = max(self._peaks[-20:], default=0)
        out["plan_peak_gathered_bytes"] = self._plan_peak
        out["full_parameter_bytes"] = sum(self._nbytes(u) for u in self._units)
        out["gradient_copies"] = self._grad_copies
        return out
