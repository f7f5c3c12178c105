"""Fault-tolerant data parallelism for a plain torch training loop.

Run the program under ``gorun -np R --fault-tolerant``: R replicas train
together; when one dies the others keep stepping, gorun restarts it, and the
replacement copies the live replicas' state (parameters, optimizer state,
anything the state_dict function returns) at its first quorum, with no
checkpoint file. Shaped like torchft's Manager::

    import gorun.ft

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    m = gorun.ft.Manager(state_dict=state_dict, load_state_dict=load_state_dict)
    while m.current_step() < steps:
        m.start_quorum()               # a replacement heals here
        opt.zero_grad()
        loss_fn(model(batch(m.current_step()))).backward()
        m.allreduce_grads(model.parameters())   # averaged over the participants
        if m.should_commit():          # every participant finished the step
            opt.step()
    m.close()

Under ``gorun --fault-tolerant --fault-tolerant-group S`` a replica is a
group of S ranks (HSDP's shape): each rank holds one shard, shards are
gathered and gradients reduce-scattered within the group
(group_all_gather, group_reduce_scatter, group_comm), and allreduce()
averages this rank's shard across the groups; a rank's death restarts its
group, and each new rank heals its shard from its place in a live group.

The quorum, the commit decision, the heal (the state's bytes sliced across
the live replicas, checked by digest) and every collective run in gorun's Go
runtime (package ft, through libgorun's gorun_ft_* calls); this module turns
a state dict into bytes and back, and torch tensors into buffers.

Where this differs from torchft: there is no lighthouse or per-replica store
to start (gorun serves the quorum), a replacement heals from all live
replicas at once (not one), and a survivor learns of a death from gorun as
it happens rather than at a timeout. Errors in a step's collectives are kept,
as torchft keeps them: the failed allreduce returns, later ones in the step
are skipped, and should_commit() returns False.
"""

import base64
import ctypes
import json
import pickle
from collections import namedtuple

import torch

from . import _lib
from ._lib import GorunError

__all__ = ["DistributedDataParallel", "HealError", "JobFinished", "Manager", "Quorum", "dumps", "loads"]


class JobFinished(GorunError):
    """start_quorum() in a replica that came back too late: the replicas
    that held the job's last step have finished and left, so there is
    nobody to heal from. The job's training is done; exit successfully."""


class HealError(GorunError):
    """A heal that failed on this replica's side: the state's bytes could
    not be made (state_dict raised) or loaded (load_state_dict raised, or
    the bytes were not a state this module wrote)."""


#: One step's quorum: its id (changes exactly when the participants do),
#: the committed step every participant holds, the participants' replica
#: ids (group-rank order), this replica's index among them, whether this
#: replica healed in it, and how many replicas served the heal.
Quorum = namedtuple("Quorum", "id step participants rank healed changed sources")


class _QuorumInfo(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int64), ("step", ctypes.c_int64), ("size", ctypes.c_int),
                ("rank", ctypes.c_int), ("healed", ctypes.c_int), ("changed", ctypes.c_int),
                ("sources", ctypes.c_int)]


_SAVE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_size_t))
_LOAD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)

_i64 = ctypes.c_int64
_PI = ctypes.POINTER(ctypes.c_int)
_SIGNATURES = {
    "gorun_ft_join": [ctypes.c_char_p, ctypes.POINTER(_i64)],
    "gorun_ft_info": [_i64, _PI, _PI, _PI],
    "gorun_ft_set_state": [_i64, _SAVE_FN, _LOAD_FN, ctypes.c_void_p],
    "gorun_ft_quorum": [_i64, _i64, ctypes.POINTER(_QuorumInfo), _PI, ctypes.c_int],
    "gorun_ft_allreduce": [_i64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _i64],
    "gorun_ft_comm": [_i64, ctypes.POINTER(_i64)],
    "gorun_ft_group": [_i64, _PI, _PI],
    "gorun_ft_group_comm": [_i64, ctypes.POINTER(_i64)],
    "gorun_ft_report_error": [_i64, ctypes.c_char_p],
    "gorun_ft_should_commit": [_i64, _i64, _PI],
    "gorun_ft_step": [_i64, ctypes.POINTER(_i64)],
    "gorun_ft_close": [_i64],
}
_declared = set()


def _ft_lib():
    """The library, with the gorun_ft_* signatures declared (once)."""
    lib = _lib.lib()
    if id(lib) not in _declared:
        for name, args in _SIGNATURES.items():
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise GorunError("gorun.ft: %s has no %s: it predates fault tolerance; rebuild it (make lib)"
                                 % (_lib.library_path(), name), "GORUN_ERR_INIT") from None
            f.argtypes = args
            f.restype = ctypes.c_int
        _declared.add(id(lib))
    return lib


_FLOAT_CODES = {torch.float32: _lib.FLOAT32, torch.bfloat16: _lib.BFLOAT16, torch.float16: _lib.FLOAT16,
                torch.float64: _lib.FLOAT64}
_OPS = {"avg": _lib.AVG, "sum": _lib.SUM}
_FORMAT = "gorun.ft/state v1"


# ---- a state dict as bytes ----------------------------------------------------
#
# A heal compares the bytes of several sources by digest, so equal states
# must give equal bytes: a JSON skeleton (dict order kept, tuples and lists
# told apart, tensors by reference) and the tensors' raw bytes after it, in
# the order met. pickle is used only for leaves JSON cannot hold (its
# memo depends on object identity, so it is kept out of the common path).

def _enc(obj, tensors, offset):
    if obj is None or isinstance(obj, (bool, str)):
        return obj, offset
    if isinstance(obj, int):
        return obj, offset
    if isinstance(obj, float):
        return obj, offset
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        n = t.numel() * t.element_size()
        tensors.append(t)
        node = {"t": [str(t.dtype).replace("torch.", ""), list(t.shape), offset, n]}
        return node, offset + n
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            ke, offset = _enc(k, tensors, offset)
            ve, offset = _enc(v, tensors, offset)
            items.append([ke, ve])
        return {"d": items}, offset
    if isinstance(obj, (list, tuple)):
        out = []
        for v in obj:
            ve, offset = _enc(v, tensors, offset)
            out.append(ve)
        return ({"l": out} if isinstance(obj, list) else {"u": out}), offset
    return {"p": base64.b64encode(pickle.dumps(obj, protocol=4)).decode()}, offset


def dumps(state):
    """A state dict (nested dicts, lists, tuples, tensors, numbers, strings)
    as one bytes object; equal states give equal bytes. Tensors are copied
    to the host."""
    tensors = []
    skel, total = _enc(state, tensors, 0)
    head = json.dumps({"format": _FORMAT, "bytes": total, "state": skel}, separators=(",", ":"),
                      allow_nan=True).encode()
    parts = [len(head).to_bytes(8, "little"), head]
    for t in tensors:
        if t.numel():
            parts.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def _dec(node, data, base):
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if "t" in node:
        dtype, shape, off, n = node["t"]
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError("unknown dtype %r" % dtype)
        if n == 0:
            return torch.empty(shape, dtype=dt)
        raw = torch.frombuffer(data, dtype=torch.uint8, count=n, offset=base + off)
        return raw.view(dt).reshape(shape).clone()
    if "d" in node:
        return {_dec(k, data, base): _dec(v, data, base) for k, v in node["d"]}
    if "l" in node:
        return [_dec(v, data, base) for v in node["l"]]
    if "u" in node:
        return tuple(_dec(v, data, base) for v in node["u"])
    if "p" in node:
        return pickle.loads(base64.b64decode(node["p"]))
    raise ValueError("unknown node %r" % sorted(node))


def loads(data):
    """The state dict dumps() wrote (tensors on the host, bitwise equal)."""
    data = memoryview(data)
    if len(data) < 8:
        raise ValueError("gorun.ft: %d bytes are not a state (too short)" % len(data))
    n = int.from_bytes(data[:8], "little")
    if 8 + n > len(data):
        raise ValueError("gorun.ft: a state header of %d bytes in %d bytes" % (n, len(data)))
    try:
        head = json.loads(bytes(data[8:8 + n]))
    except ValueError as e:
        raise ValueError("gorun.ft: the bytes are not a state this module wrote: %s" % e) from None
    if not isinstance(head, dict) or head.get("format") != _FORMAT:
        raise ValueError("gorun.ft: the bytes are not a state this module wrote (format %r)"
                         % (head.get("format") if isinstance(head, dict) else None))
    if 8 + n + head["bytes"] != len(data):
        raise ValueError("gorun.ft: the state says %d bytes of tensors, %d came" % (head["bytes"], len(data) - 8 - n))
    # frombuffer wants a writable buffer to avoid a warning; every tensor
    # is cloned out of it.
    buf = bytearray(data)
    return _dec(head["state"], buf, 8 + n)


# ---- the manager ----------------------------------------------------------------

class Manager:
    """This replica's side of fault-tolerant training (see the module doc).

    state_dict: a function returning what a heal copies (what must be equal
    on every replica after a committed step); load_state_dict: a function
    taking such a dict. Both are called only inside start_quorum(), on the
    calling thread: state_dict when this replica serves another's heal,
    load_state_dict when this replica heals. timeout: seconds any one call
    may wait (None: no limit of its own; gorun tells of deaths as they
    happen). config: libgorun's gorun_ft_join settings ("tcp=1", ...).

    Not thread-safe: one training loop drives it; report_error() may be
    called from any thread.
    """

    def __init__(self, state_dict=None, load_state_dict=None, timeout=None, config=None):
        if (state_dict is None) != (load_state_dict is None):
            raise ValueError("gorun.ft.Manager: give both state_dict and load_state_dict (a heal needs both sides), "
                             "or neither")
        if timeout is not None and timeout <= 0:
            raise ValueError("gorun.ft.Manager: timeout=%r: want seconds > 0 or None" % (timeout,))
        self._lib = _ft_lib()
        self._timeout_ms = -1 if timeout is None else max(1, int(timeout * 1000))
        h = _i64()
        self._check(self._lib.gorun_ft_join(config.encode() if config else None, ctypes.byref(h)), "join")
        self._h = h.value
        rep, reps, inc = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.gorun_ft_info(self._h, ctypes.byref(rep), ctypes.byref(reps), ctypes.byref(inc)), "info")
        self.replica, self.replicas, self.incarnation = rep.value, reps.value, inc.value
        gs, gi = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.gorun_ft_group(self._h, ctypes.byref(gs), ctypes.byref(gi)), "group")
        #: Ranks per replica group (gorun --fault-tolerant-group; 1: every
        #: rank is a replica) and this rank's place in its group.
        self.group_size, self.group_rank = gs.value, gi.value
        self._quorum = None
        self._errored = None
        self._cb_error = None
        self._saved = None  # the bytes the save callback handed out last
        self._parts = (ctypes.c_int * max(self.replicas, 1))()
        self._state_fns = None
        if state_dict is not None:
            self.set_state_dict_fns(state_dict, load_state_dict)

    def _check(self, rc, what):
        if rc != _lib.OK:
            raise _lib.error(rc, "gorun.ft: " + what)

    def set_state_dict_fns(self, state_dict, load_state_dict):
        """Sets what a heal copies (see the class doc); before the first
        start_quorum()."""
        self._state_fns = (state_dict, load_state_dict)
        self._save_cb = _SAVE_FN(self._on_save)
        self._load_cb = _LOAD_FN(self._on_load)
        self._check(self._lib.gorun_ft_set_state(self._h, self._save_cb, self._load_cb, None), "set_state")

    # Callbacks from Go, on this thread inside start_quorum. An exception
    # must not cross into C: it is kept and raised by start_quorum.
    def _on_save(self, _user, buf, n):
        try:
            self._saved = dumps(self._state_fns[0]())
            self._saved_ptr = ctypes.c_char_p(self._saved)
            buf[0] = ctypes.cast(self._saved_ptr, ctypes.c_void_p).value
            n[0] = len(self._saved)
            return 0
        except BaseException as e:  # noqa: BLE001 (it is re-raised by start_quorum)
            self._cb_error = ("state_dict", e)
            return 1

    def _on_load(self, _user, buf, n):
        try:
            data = ctypes.string_at(buf, n) if n else b""
            self._state_fns[1](loads(data))
            return 0
        except BaseException as e:  # noqa: BLE001
            self._cb_error = ("load_state_dict", e)
            return 1

    def start_quorum(self):
        """Starts a step: waits for this step's quorum (every live replica),
        heals this replica first if it is behind (calling load_state_dict),
        or serves the heal of another (calling state_dict). Returns the
        Quorum; errors of the previous step are forgotten. Raises
        JobFinished in a replacement that came after the others finished,
        HealError when state_dict or load_state_dict raised."""
        info = _QuorumInfo()
        self._cb_error = None
        rc = self._lib.gorun_ft_quorum(self._h, self._timeout_ms, ctypes.byref(info), self._parts, len(self._parts))
        self._saved = None
        if rc != _lib.OK:
            err = _lib.error(rc, "gorun.ft: quorum")
            if self._cb_error is not None:
                which, e = self._cb_error
                raise HealError("gorun.ft: heal: %s raised %s: %s (%s)" % (which, type(e).__name__, e, err),
                                err.status, err.rank) from e
            if rc == _lib.ERR_CLOSED:
                raise JobFinished(str(err), err.status, err.rank) from None
            raise err
        self._errored = None
        self._quorum = Quorum(info.id, info.step, tuple(self._parts[:info.size]), info.rank, bool(info.healed),
                              bool(info.changed), info.sources)
        return self._quorum

    def quorum(self):
        """The current step's Quorum (None before the first start_quorum)."""
        return self._quorum

    def allreduce(self, tensor, op="avg"):
        """Reduces tensor in place over the quorum's participants: "avg"
        (the sum over the number of participants, as torchft's default) or
        "sum". A contiguous float tensor on the host. A participant's death
        does not raise: the error is kept (errored()), the tensor's contents
        are then undefined, later allreduces of the step do nothing, and
        should_commit() returns False. Returns tensor."""
        if self._quorum is None:
            raise RuntimeError("gorun.ft.Manager.allreduce: call start_quorum() first")
        code = _FLOAT_CODES.get(tensor.dtype)
        if code is None:
            raise TypeError("gorun.ft.Manager.allreduce: dtype %s: want float32, bfloat16, float16 or float64"
                            % tensor.dtype)
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("gorun.ft.Manager.allreduce: want a contiguous tensor on the host (got %s, %s)"
                             % (tensor.device, "contiguous" if tensor.is_contiguous() else "strided"))
        if op not in _OPS:
            raise ValueError("gorun.ft.Manager.allreduce: op %r: want 'avg' or 'sum'" % (op,))
        if self._errored is not None or tensor.numel() == 0:
            return tensor
        rc = self._lib.gorun_ft_allreduce(self._h, tensor.data_ptr(), tensor.numel(), code, _OPS[op],
                                          self._timeout_ms)
        if rc != _lib.OK:
            self._errored = _lib.error(rc, "gorun.ft: allreduce")
        return tensor

    def allreduce_grads(self, params, op="avg"):
        """Averages the gradients of params over the participants: one
        allreduce per dtype over a flat copy (parameters without a gradient
        are skipped; every replica must have gradients for the same ones)."""
        by_dtype = {}
        for p in params:
            if p.grad is not None:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.allreduce(flat, op)
            off = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[off:off + n].view_as(g))
                off += n

    def comm(self):
        """The current quorum's communicator as a libgorun communicator
        handle (group rank = index among the participants), for gorun's
        other calls, e.g. gorun.torch.distribute(group=...). It changes
        when the quorum's communicator does (other participants, or after a
        step that did not commit); an old one is refused."""
        h = _i64()
        self._check(self._lib.gorun_ft_comm(self._h, ctypes.byref(h)), "comm")
        return h.value

    # ---- replica groups (HSDP) ----
    #
    # Under gorun --fault-tolerant-group S a replica is a group of S
    # consecutive ranks: a model's parameters sharded S ways within the
    # group, replicated across groups. The quorum's participants are then
    # the ranks at this rank's place in every live group, so allreduce()
    # averages this rank's shard across the groups; the group's own
    # collectives (the shard all-gather, the gradient reduce-scatter) go
    # over group_comm(). A rank's death takes its whole group out (gorun
    # restarts all S ranks, and each heals its shard from its place in a
    # live group).

    def group_comm(self):
        """The replica group's communicator as a libgorun communicator
        handle (group rank = group_rank); valid while the group lives.
        Only under --fault-tolerant-group, after start_quorum()."""
        h = _i64()
        self._check(self._lib.gorun_ft_group_comm(self._h, ctypes.byref(h)), "group_comm")
        return h.value

    def _group_call(self, name, what, tensors, call):
        if self._quorum is None:
            raise RuntimeError("gorun.ft.Manager.%s: call start_quorum() first" % name)
        if self.group_size <= 1:
            raise RuntimeError("gorun.ft.Manager.%s: this job has no replica groups (run it under gorun "
                               "--fault-tolerant-group S with S > 1)" % name)
        dtype = tensors[0].dtype
        code = _FLOAT_CODES.get(dtype)
        if code is None:
            raise TypeError("gorun.ft.Manager.%s: dtype %s: want float32, bfloat16, float16 or float64" % (name, dtype))
        for t in tensors:
            if t.dtype != dtype:
                raise TypeError("gorun.ft.Manager.%s: %s and %s: want one dtype" % (name, dtype, t.dtype))
            if t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError("gorun.ft.Manager.%s: want contiguous tensors on the host (got %s, %s)"
                                 % (name, t.device, "contiguous" if t.is_contiguous() else "strided"))
        if self._errored is not None:
            return
        rc = call(self.group_comm(), code)
        if rc != _lib.OK:
            err = _lib.error(rc, "gorun.ft: " + what)
            self.report_error(err)

    def group_all_gather(self, output, shard):
        """output (group_size * shard.numel() elements) = every group
        rank's shard, in group-rank order. A failure does not raise: as in
        allreduce(), it is kept (errored()), should_commit() is False, and
        output is undefined. Returns output."""
        if output.numel() != shard.numel() * self.group_size:
            raise ValueError("gorun.ft.Manager.group_all_gather: output has %d elements, want %d (group of %d "
                             "times %d)" % (output.numel(), shard.numel() * self.group_size, self.group_size,
                                           shard.numel()))
        self._group_call("group_all_gather", "group all-gather", (output, shard),
                         lambda h, code: _lib.lib().gorun_allgather(h, shard.data_ptr(), output.data_ptr(),
                                                                     shard.numel(), code, None))
        return output

    def group_reduce_scatter(self, output, full, op="avg"):
        """output = this group rank's block (output.numel() elements) of op
        ("avg" or "sum") over the group's full tensors (group_size *
        output.numel() elements each). Failures as in group_all_gather.
        Returns output."""
        if op not in _OPS:
            raise ValueError("gorun.ft.Manager.group_reduce_scatter: op %r: want 'avg' or 'sum'" % (op,))
        if full.numel() != output.numel() * self.group_size:
            raise ValueError("gorun.ft.Manager.group_reduce_scatter: full has %d elements, want %d (group of %d "
                             "times %d)" % (full.numel(), output.numel() * self.group_size, self.group_size,
                                           output.numel()))
        self._group_call("group_reduce_scatter", "group reduce-scatter", (output, full),
                         lambda h, code: _lib.lib().gorun_reduce_scatter(h, full.data_ptr(), output.data_ptr(),
                                                                          output.numel(), code, _OPS[op], None))
        return output

    def report_error(self, e):
        """Marks this step failed on this replica: should_commit() will be
        False for every participant."""
        self._errored = e
        self._lib.gorun_ft_report_error(self._h, str(e).encode(errors="replace"))

    def errored(self):
        """The error that failed this step on this replica, or None."""
        return self._errored

    def should_commit(self):
        """Ends the step: True only if every participant finished it; the
        same answer on every participant. On True the step counter advances
        (apply the update); on False discard it and start the next quorum."""
        c = ctypes.c_int()
        rc = self._lib.gorun_ft_should_commit(self._h, self._timeout_ms, ctypes.byref(c))
        if rc != _lib.OK:
            raise _lib.error(rc, "gorun.ft: should_commit")
        return bool(c.value)

    def current_step(self):
        """Steps committed (after a heal, the sources' count)."""
        s = _i64()
        self._check(self._lib.gorun_ft_step(self._h, ctypes.byref(s)), "step")
        return s.value

    def num_participants(self):
        """Participants of the current quorum (0 before the first)."""
        return len(self._quorum.participants) if self._quorum else 0

    def is_healing(self):
        """Whether this replica healed in the current quorum."""
        return bool(self._quorum and self._quorum.healed)

    def close(self):
        """Leaves the job gracefully (not counted as a loss). Idempotent."""
        if self._h:
            h, self._h = self._h, 0
            self._check(self._lib.gorun_ft_close(h), "close")

    shutdown = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DistributedDataParallel(torch.nn.Module):
    """gorun.torch's DDP mode (gradients reduced in planned buckets on
    gorun's executor, as gorun.torch.distribute(mode="ddp")) over the
    current quorum's participants, averaged over them.

    The wrapped model is made again whenever the quorum's communicator
    changes (a replica lost or back, a step that did not commit): the plan
    is for a group, and the group is the quorum. A collective that fails in
    backward fails the step here, not the program: call
    ``ddp.backward(loss)`` instead of ``loss.backward()``::

        ddp = gorun.ft.DistributedDataParallel(m, model)
        while m.current_step() < steps:
            m.start_quorum()
            opt.zero_grad()
            ddp.backward(loss_fn(ddp(batch)))
            if m.should_commit():
                opt.step()

    kwargs go to gorun.torch.distribute (not mode or group)."""

    def __init__(self, manager, module, **kwargs):
        super().__init__()
        for k in ("mode", "group"):
            if k in kwargs:
                raise ValueError("gorun.ft.DistributedDataParallel: %s is set by the quorum, not by the caller" % k)
        self.manager = manager
        self.module = module
        self._kwargs = kwargs
        self._model = None
        self._group = None

    def _wrapped(self):
        from . import torch as gtorch

        h = self.manager.comm()
        if self._model is None or h != self._group:
            self._drop()
            self._model = gtorch.distribute(self.module, mode="ddp", group=h, **self._kwargs)
            self._group = h
        return self._model

    def _drop(self):
        if self._model is not None:
            m, self._model, self._group = self._model, None, None
            m.close()

    def forward(self, *args, **kwargs):
        try:
            return self._wrapped()(*args, **kwargs)
        except GorunError as e:
            # A participant died while the group was being set up or the
            # step began: the step cannot commit; run the module alone so
            # that the loop goes on to should_commit.
            self._failed(e)
            return self.module(*args, **kwargs)

    def backward(self, loss):
        """loss.backward(); a collective that failed (a participant died)
        is reported to the manager, so should_commit() is False, and the
        wrapped model is made again at the next forward. Returns whether
        the gradients are good."""
        try:
            loss.backward()
            return True
        except GorunError as e:
            self._failed(e)
            return False

    def _failed(self, e):
        self.manager.report_error(e)
        try:
            self._drop()
        except GorunError:
            self._model = self._group = None

    def close(self):
        """Unwraps the module (its hooks removed, gradients copied out of
        the executor's buckets)."""
        self._drop()
