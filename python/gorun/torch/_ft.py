"""hsdp mode under fault tolerance: distribute(model, mode="hsdp", manager=m).

Under ``gorun --fault-tolerant --fault-tolerant-group S`` a replica is a
group of S consecutive ranks, and no communicator spans every live rank:
there is the replica group's (gorun.ft.Manager.group_comm(), for the life
of the group) and the quorum's (Manager.comm(): this rank's place in every
live group, made again whenever the participants change or a step does not
commit). The plan's two hops are exactly these: shards are gathered and
gradients reduce-scattered within the group, and each reduced shard is
all-reduced across the groups over the quorum's communicator.

A step is the Manager's: the model runs it over the quorum that
start_quorum() agreed. When the quorum's communicator is a new one, every
participant drops its executor and runs that step as the first step of a
run (every unit gathered, the gradients reduced outside the plan, costs
measured, rank 0's costs shared, a new plan checked on every participant),
so that a replacement group, which has measured nothing, and the groups
that lived on make the same plan. The gradient is averaged over every rank
of every participating group.

A collective that fails in a step (a participant died) does not raise: the
error goes to the Manager (report_error), later collectives of the step are
skipped, the step's gradients are dropped, and should_commit() is False on
every participant, so the optimizer step is not taken. The next step, on a
new quorum, starts over. A heal copies local_state_dict() (each rank's
shards, the parameters kept whole, the buffers) with the optimizer's state;
the Manager's state functions are the caller's::

    m = gorun.ft.Manager(
        state_dict=lambda: {"model": model.local_state_dict(), "optim": opt.state_dict()},
        load_state_dict=lambda sd: (model.load_local_state_dict(sd["model"]),
                                    opt.load_state_dict(sd["optim"])))
"""

import torch

from .. import _lib
from . import _abi, _plan
from ._abi import PlanMismatchError
from ._fsdp import ShardedModel

# What a failed step's finish reports (nothing was measured).
_NO_METRICS = {"exposed_ns": 0, "comm_ns": 0, "fused_peak_bytes": 0, "copied_bytes": 0, "buckets": 0}


class _KeptErrors:
    """An executor whose step calls keep their error in the model instead of
    raising it, and do nothing once the step has failed."""

    _STEP = ("begin", "enter", "ready", "wait", "end_region", "finish", "mark")

    def __init__(self, ex, model):
        self._ex, self._model = ex, model

    def __getattr__(self, name):
        f = getattr(self._ex, name)
        if name not in self._STEP:
            return f
        empty = dict(_NO_METRICS, failed=True) if name == "finish" else None

        def call(*args):
            if self._model._failed is not None:
                return empty
            try:
                return f(*args)
            except PlanMismatchError:
                raise  # ranks that disagree are a bug, not a failure
            except _lib.GorunError as e:
                self._model._fail(e)
                return empty
        setattr(self, name, call)  # found directly from now on
        return call


class FaultTolerantModel(ShardedModel):
    """distribute(mode="hsdp", manager=m): see the module comment."""

    def __init__(self, module, manager, mode="hsdp", shard_size=None, **kw):
        for k in ("group", "plan", "micro_batches"):
            if kw.get(k) is not None:
                raise ValueError("gorun.torch.distribute: %s= cannot go with manager= (%s)" % (k, {
                    "group": "the groups are the Manager's: its replica group and its quorum",
                    "plan": "the plan is made again for every quorum, whose size changes",
                    "micro_batches": "deterministic micro-batches assume a fixed world"}[k]))
        if kw.get("deterministic"):
            raise ValueError("gorun.torch.distribute: deterministic= cannot go with manager=: the Manager's "
                             "communicators reduce deterministically already")
        kw.pop("deterministic", None)
        if mode != "hsdp":
            raise ValueError("gorun.torch.distribute: manager= goes with mode='hsdp' (mode %r): for ddp over a "
                             "quorum use gorun.ft.DistributedDataParallel" % (mode,))
        s = manager.group_size
        if s < 2:
            raise ValueError("gorun.torch.distribute: mode='hsdp' with a Manager needs replica groups: run under "
                             "gorun --fault-tolerant --fault-tolerant-group S with S > 1 (this job's groups have "
                             "%d rank)" % s)
        if shard_size not in (None, s):
            raise ValueError("gorun.torch.distribute: shard_size=%r, but the Manager's replica groups have %d ranks "
                             "(gorun --fault-tolerant-group): leave shard_size out" % (shard_size, s))
        self._manager = manager
        self._rep_h = None
        self._seen = None  # the quorum the last forward ran in
        super().__init__(module, mode="hsdp", shard_size=s, **kw)

    # ---- the groups are the Manager's -----------------------------------

    def _join(self, group, deterministic):
        # Nothing is joined here: the groups exist from the first quorum on.
        m = self._manager
        self._comm = None
        self.rank, self.world_size = m.replica, m.replicas

    def _agree(self, module):
        pass  # at every new quorum (_rebuild)

    def _make_groups(self, s, w):
        return None, None  # the Manager's, set at every new quorum

    def _guarded(self, collective, *args):
        if self._failed is not None:
            return None
        try:
            return collective(*args)
        except PlanMismatchError:
            raise
        except _lib.GorunError as e:
            self._fail(e)
            return None

    def _check_same(self, what, value):
        for comm, where in ((self._shard_comm, "replica group"), (self._rep_comm, "quorum")):
            got = self._guarded(_abi.allgather_u64, comm, value)
            if got is None:
                return
            me = _abi.rank_size(comm)[0]
            if any(v != got[0] for v in got):
                others = [r for r, v in enumerate(got) if v != got[me]]
                desc = "; ".join("member %d has %016x" % (r, v) for r, v in enumerate(got))
                raise PlanMismatchError("gorun.torch: the %s disagrees on the %s: %s (members %s differ from this "
                                        "one, %d): every rank must wrap the same model" % (where, what, desc, others,
                                                                                           me), others)

    def _dp_broadcast(self, t):
        # Rank 0 of the group, then rank 0 of the quorum (whose group holds
        # the same after the first hop).
        self._guarded(_abi.broadcast_tensor, self._shard_comm, t)
        self._guarded(_abi.broadcast_tensor, self._rep_comm, t)

    def _dp_allreduce(self, t):
        self._guarded(_abi.allreduce_tensor, self._shard_comm, t)
        self._guarded(_abi.allreduce_tensor, self._rep_comm, t)

    def _new_executor(self, planned, groups, config):
        return _KeptErrors(_abi.Executor(planned, groups, config), self)

    def _exec_groups(self):
        # "dp": a quorum of one group plans one hop, within the group.
        return {"dp": self._shard_comm, "shard": self._shard_comm, "replica": self._rep_comm}

    def _replan(self):
        if self._failed is None:  # else the next step, on a new quorum, plans
            super()._replan()

    # ---- failures --------------------------------------------------------

    def _fail(self, e):
        """The step failed here: the Manager is told (should_commit() will be
        False everywhere), and nothing more of the step is exchanged."""
        if self._failed is None:
            self._failed = e
            self._manager.report_error(e)

    def _abort(self):
        """After a failed step: the executor goes (it is made again over
        the next quorum), and no gradient of the step stays."""
        if self._exec is not None:
            ex, self._exec = self._exec, None
            try:
                ex.close()
            except _lib.GorunError:
                pass  # its communicator failed; its memory is freed all the same
        for u in self._units:
            for m in u.members:
                m.param.grad = None
            for _, p, _, _ in self._pieces[u.name]:
                p.grad = None
        for m in self._replicated:
            m.param.grad = None
        self._gflat, self._rs_out, self._deferred = {}, {}, []
        self._kept = {}

    # ---- the step ----------------------------------------------------------

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self._evaluate(*args, **kwargs)
        q = self._manager.quorum()
        if q is None:
            raise RuntimeError("gorun.torch: mode='hsdp' with a Manager: call manager.start_quorum() before the "
                               "forward of each step")
        if q is not self._seen:
            # The step's first forward (a no_sync micro-batch, or the
            # step's one): errors of the step before are forgotten, as the
            # Manager forgets them, and a new quorum is taken up.
            self._seen, self._failed = q, None
            # Every participant holds the same committed step (a
            # replacement healed to it): the executor's per-step check
            # compares it.
            self._step = self._manager.current_step()
            h = self._guarded(self._manager.comm)
            if self._exec is None or h != self._rep_h:
                self._rebuild(q, h)
        return super().forward(*args, **kwargs)

    def _begin(self):
        self._step = self._manager.current_step()
        super()._begin()

    def _evaluate(self, *args, **kwargs):
        """A forward without gradients: every unit gathered over the replica
        group for the call (errors raise: no step is at stake)."""
        if self._shard_comm is None:
            raise RuntimeError("gorun.torch: mode='hsdp' with a Manager: the replica group exists from the first "
                               "step's forward on; evaluate after it")
        peak = self._peak
        held = [u for u in self._units if self._full[u.name].untyped_storage().nbytes()]
        for u in self._units:
            self._alloc(u)
            _abi.allgather_tensor(self._shard_comm, self._shards[u.name].detach(), self._full[u.name])
        try:
            with torch.no_grad():
                return self.module(*args, **kwargs)
        finally:
            for u in self._units:
                if u not in held:
                    self._free(u)
            self._peak = peak

    def _rebuild(self, q, h):
        """A new quorum: this step runs as a run's first (see the module
        comment)."""
        if self._exec is not None:
            self._write_trace()
            ex, self._exec = self._exec, None
            try:
                ex.close()
            except _lib.GorunError:
                pass
        self._rep_h = self._comm = self._rep_comm = h
        self._shard_comm = self._guarded(self._manager.group_comm)
        self.world_size = self._ssize * len(q.participants)
        self._scale = 1.0 / self.world_size
        self._flag_unused = True
        for u in self._units:
            self._alloc(u)  # the forward runs on whole parameters (garbage if a gather fails)
        if self._failed is not None:
            return
        self._check_same("model (parameter names, shapes, dtypes, ties)", _plan.fingerprint(self.module))
        if self._manager.current_step() == 0:
            # Nothing committed yet (the same on every participant): every
            # replica starts from the quorum's rank 0, as a heal would leave
            # it. The shards go across the groups at each place.
            with torch.no_grad():
                for t in [m.param for m in self._replicated] + list(self.module.buffers()):
                    if t.numel():
                        c = t.detach().contiguous()
                        self._dp_broadcast(c)
                        t.copy_(c)
                for u in self._units:
                    self._guarded(_abi.broadcast_tensor, self._rep_comm, self._shards[u.name])
        for u in self._units:
            self._gather_now(u)

    def _finish(self):
        try:
            super()._finish()
        finally:
            if self._failed is not None:
                if self._history and self._history[-1][1].get("failed"):
                    self._history.pop()  # a failed step measured nothing
                self._abort()

    def full_state_dict(self):
        """As in hsdp mode, over the current replica group (after
        start_quorum() and a step's forward)."""
        if self._shard_comm is None:
            raise RuntimeError("gorun.torch: full_state_dict() with a Manager needs the replica group: run a step "
                               "first")
        return super().full_state_dict()

    def load_state_dict(self, state_dict, strict=True, assign=False):
        raise RuntimeError("gorun.torch: load_state_dict() with a Manager: a heal loads each rank's part "
                           "(load_local_state_dict); load a whole model before distribute()")
