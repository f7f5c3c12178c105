"""The executor's section of libgorun (gorun.h, "executor") and the few
world collectives the runtime needs outside a plan (the start-up broadcast,
the plan checks), through ctypes. ctypes releases the GIL for every call, so
packing, issue and waits run on Go threads while other Python threads go on.
"""

import ctypes
import json

from .. import _lib

_i64 = ctypes.c_int64
_p = ctypes.c_void_p
_int = ctypes.c_int
_sz = ctypes.c_size_t

_SIGNATURES = {
    "gorun_executor_new": [ctypes.c_char_p, _sz, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_i64), _int,
                           ctypes.c_char_p, ctypes.POINTER(_i64)],
    "gorun_executor_hash": [_i64, ctypes.POINTER(ctypes.c_uint64)],
    "gorun_executor_plan": [_i64, ctypes.c_char_p, _sz, ctypes.POINTER(_sz)],
    "gorun_executor_begin": [_i64, _i64],
    "gorun_executor_enter": [_i64, ctypes.c_char_p],
    "gorun_executor_ready": [_i64, ctypes.c_char_p, _p, _sz, _p, _sz, _int],
    "gorun_executor_wait": [_i64, ctypes.c_char_p],
    "gorun_executor_end_region": [_i64, ctypes.c_char_p],
    "gorun_executor_view": [_i64, ctypes.c_char_p, ctypes.POINTER(_p), ctypes.POINTER(_sz)],
    "gorun_executor_finish": [_i64, ctypes.c_char_p, _sz, ctypes.POINTER(_sz)],
    "gorun_executor_trace": [_i64, ctypes.c_char_p],
    "gorun_executor_mark": [_i64, ctypes.c_char_p],
    "gorun_executor_free": [_i64],
}

_bound = None


def lib():
    """libgorun with the executor's signatures set."""
    global _bound
    l = _lib.lib()
    if _bound is not l:
        for name, args in _SIGNATURES.items():
            try:
                f = getattr(l, name)
            except AttributeError:
                raise _lib.GorunError(
                    "gorun: %s lacks %s: rebuild it (make lib)" % (_lib.library_path(), name),
                    "GORUN_ERR_INIT") from None
            f.argtypes = args
            f.restype = _int
        _bound = l
    return l


class PlanMismatchError(_lib.GorunError):
    """Ranks disagree on the plan: their models (or plans) differ. ``ranks``
    lists every rank whose plan differs from this rank's."""

    def __init__(self, message, ranks=()):
        super().__init__(message, "GORUN_ERR_DESYNC", ranks[0] if ranks else -1)
        self.ranks = list(ranks)


def check(rc, what):
    if rc == _lib.OK:
        return
    err = _lib.error(rc, what)
    text = str(err)
    if "gorun: plan mismatch:" in text:
        raise PlanMismatchError(text, [err.rank] if err.rank >= 0 else []) from None
    raise err


_world = None
_world_settings = None


def world(deterministic=False):
    """The world communicator's handle, joining the world on first use."""
    global _world, _world_settings
    settings = "deterministic=1" if deterministic else ""
    if _world is not None and _world_settings == settings:
        return _world
    # A torch process group on the "gorun" backend joined the world
    # already (with its own settings): share its world communicator.
    from .. import backend
    if backend._world is not None and _lib.loaded():
        if deterministic and "deterministic=1" not in (backend._world_config or ""):
            raise _lib.GorunError("gorun.torch: deterministic=True, but the gorun process group joined the world "
                                  "without it: pass the backend's deterministic option too", "GORUN_ERR_INVALID")
        return backend._world
    h = _i64()
    _lib.check(lib().gorun_init(settings.encode(), ctypes.byref(h)), "gorun.torch: joining the world")
    _world, _world_settings = h.value, settings
    return _world


def rank_size(comm):
    r, n = _int(), _int()
    _lib.check(lib().gorun_comm_rank(comm, ctypes.byref(r)), "gorun_comm_rank")
    _lib.check(lib().gorun_comm_size(comm, ctypes.byref(n)), "gorun_comm_size")
    return r.value, n.value


def world_rank(comm, r):
    out = _int()
    _lib.check(lib().gorun_comm_world_rank(comm, r, ctypes.byref(out)), "gorun_comm_world_rank")
    return out.value


def new_group(world_comm, ranks, tag):
    """A communicator over ranks (world ranks) of world_comm, the world
    communicator the caller joined (with its settings: deterministic)."""
    arr = (_int * len(ranks))(*ranks)
    out = _i64()
    _lib.check(lib().gorun_comm_group(world_comm, arr, len(ranks), tag.encode(), ctypes.byref(out)),
               "gorun.torch: making group %s" % list(ranks))
    return out.value


def allgather_u64(comm, value):
    """Every rank's 64-bit value, in rank order."""
    _, n = rank_size(comm)
    send = (ctypes.c_int64 * 1)(ctypes.c_int64(value & 0xFFFFFFFFFFFFFFFF).value)
    recv = (ctypes.c_int64 * n)()
    _lib.check(lib().gorun_allgather(comm, send, recv, 1, _lib.INT64, None), "gorun.torch: plan check")
    return [v & 0xFFFFFFFFFFFFFFFF for v in recv]


def broadcast_tensor(comm, t, root=0):
    """t (a contiguous CPU tensor) from root, in place."""
    _lib.check(lib().gorun_broadcast(comm, t.data_ptr(), t.data_ptr(), t.numel(), dtype_code(t.dtype), root, None),
               "gorun.torch: broadcasting the parameters")


def allreduce_tensor(comm, t):
    """t summed over comm, in place (a contiguous CPU tensor)."""
    _lib.check(lib().gorun_allreduce(comm, t.data_ptr(), t.data_ptr(), t.numel(), dtype_code(t.dtype), _lib.SUM,
                                     None), "gorun.torch: all-reduce")


def dtype_code(dt):
    import torch
    codes = {torch.float32: _lib.FLOAT32, torch.float64: _lib.FLOAT64, torch.bfloat16: _lib.BFLOAT16,
             torch.float16: _lib.FLOAT16, torch.int32: _lib.INT32, torch.int64: _lib.INT64, torch.uint8: _lib.UINT8}
    try:
        return codes[dt]
    except KeyError:
        raise TypeError("gorun.torch: dtype %s is not supported (float32, float64, bfloat16, float16, "
                        "int32, int64, uint8 are)" % dt) from None


class Executor:
    """One planned step graph on gorun's executor (Go), by handle."""

    def __init__(self, graph_json, groups, config=""):
        names = (ctypes.c_char_p * len(groups))(*[g.encode() for g in groups])
        comms = (_i64 * len(groups))(*groups.values())
        data = graph_json.encode()
        h = _i64()
        l = lib()
        check(l.gorun_executor_new(data, len(data), names, comms, len(groups), config.encode(), ctypes.byref(h)),
              "gorun.torch: making the executor")
        self.h = h.value
        self._l = l
        self._names = {}

    def _name(self, s):
        b = self._names.get(s)
        if b is None:
            b = self._names[s] = s.encode()
        return b

    def hash(self):
        v = ctypes.c_uint64()
        check(self._l.gorun_executor_hash(self.h, ctypes.byref(v)), "gorun_executor_hash")
        return v.value

    def plan(self):
        n = _sz()
        check(self._l.gorun_executor_plan(self.h, None, 0, ctypes.byref(n)), "gorun_executor_plan")
        buf = ctypes.create_string_buffer(n.value + 1)
        check(self._l.gorun_executor_plan(self.h, buf, len(buf), ctypes.byref(n)), "gorun_executor_plan")
        return json.loads(buf.value.decode())

    def begin(self, step):
        check(self._l.gorun_executor_begin(self.h, step), "gorun.torch: step %d" % step)

    def enter(self, region):
        check(self._l.gorun_executor_enter(self.h, self._name(region)), "gorun.torch")

    def ready(self, name, t_in, t_out, code):
        """t_in is reduced into t_out (both contiguous, alive until the wait)."""
        check(self._l.gorun_executor_ready(self.h, self._name(name), t_in.data_ptr(), t_in.numel() * t_in.element_size(),
                                           t_out.data_ptr(), t_out.numel() * t_out.element_size(), code),
              "gorun.torch: %s" % name)

    def wait(self, out):
        check(self._l.gorun_executor_wait(self.h, self._name(out)), "gorun.torch: waiting for %s" % out)

    def end_region(self, region):
        check(self._l.gorun_executor_end_region(self.h, self._name(region)), "gorun.torch")

    def view(self, name):
        p, n = _p(), _sz()
        check(self._l.gorun_executor_view(self.h, self._name(name), ctypes.byref(p), ctypes.byref(n)),
              "gorun.torch: view of %s" % name)
        return p.value, n.value

    def finish(self):
        buf = ctypes.create_string_buffer(4096)
        n = _sz()
        check(self._l.gorun_executor_finish(self.h, buf, len(buf), ctypes.byref(n)), "gorun.torch: finishing the step")
        return json.loads(buf.value.decode())

    def mark(self, name):
        check(self._l.gorun_executor_mark(self.h, name.encode()), "gorun.torch: mark")

    def trace(self, path):
        check(self._l.gorun_executor_trace(self.h, path.encode()), "gorun.torch: writing the trace")

    def close(self):
        if self.h:
            h, self.h = self.h, 0
            check(self._l.gorun_executor_free(h), "gorun_executor_free")


def allgather_tensor(comm, shard, full):
    """full = every rank's shard, in rank order (contiguous CPU tensors)."""
    _lib.check(lib().gorun_allgather(comm, shard.data_ptr(), full.data_ptr(), shard.numel(), dtype_code(shard.dtype),
                                     None), "gorun.torch: all-gather")


def reduce_scatter_tensor(comm, full, shard):
    """shard = this rank's block of full summed over comm."""
    _lib.check(lib().gorun_reduce_scatter(comm, full.data_ptr(), shard.data_ptr(), shard.numel(),
                                          dtype_code(shard.dtype), _lib.SUM, None), "gorun.torch: reduce-scatter")
