"""The torch.distributed backend "gorun": a ProcessGroup over libgorun.

Every collective checks its arguments here first (CPU, contiguous, one
tensor per list, matching dtypes and sizes) and raises ValueError or
TypeError naming the call and the argument before anything is issued, so a
bad call on one rank never reaches the wire. Then it hands the tensors'
memory (data_ptr) to the library, which runs the collective on its own
threads without copying; the returned Work holds the tensors until the call
completes.

Calls on one group complete in the order they were issued (on every rank):
that is what lets DDP's buckets, futures and comm hooks work unchanged.
"""

import array
import atexit
import collections
import ctypes
import datetime
import os
import queue
import random
import secrets
import socket
import sys
import threading
import time
import weakref
import zlib

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend, BarrierOptions, ProcessGroup, ReduceOp, Work
from torch.futures import Future

from . import _lib
from ._lib import GorunError

BACKEND = "gorun"

_DTYPES = {
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.bfloat16: _lib.BFLOAT16,
    torch.float16: _lib.FLOAT16,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.uint8: _lib.UINT8,
    torch.bool: _lib.BOOL,
}

_OPS = {
    ReduceOp.RedOpType.SUM: _lib.SUM,
    ReduceOp.RedOpType.PRODUCT: _lib.PROD,
    ReduceOp.RedOpType.MIN: _lib.MIN,
    ReduceOp.RedOpType.MAX: _lib.MAX,
    ReduceOp.RedOpType.AVG: _lib.AVG,
}

_OPS_BY_VALUE = {int(k): v for k, v in _OPS.items()}

# dist.all_reduce's default op, one object for the whole process.
_SUM = dist.ReduceOp.SUM

ENV_DETERMINISTIC = "GORUN_DETERMINISTIC"


class Options:
    """Options of the gorun backend, given as
    ``dist.init_process_group("gorun", pg_options=gorun.Options(...))``.

    deterministic: every reduction follows one fixed tree over the ranks, so
        results are bitwise the same on every rank, for every message size and
        across runs (default: $GORUN_DETERMINISTIC == "1").
    tcp: no shared memory between ranks on one host (for comparisons).
    connect_timeout: how long a communicator waits for its peers to connect
        (a datetime.timedelta or seconds; default: the library's, 60 s): the
        world's, its groups' and each point-to-point channel's. A sender that
        has not connected within it fails its receive with a timeout; a
        receive from any source instead goes on waiting for such a sender.
    deterministic, tcp and connect_timeout are the world's, set by the first
    gorun group; a later group may leave them unset or give the same.
    """

    def __init__(self, deterministic=None, tcp=False, connect_timeout=None):
        if deterministic is None:
            deterministic = os.environ.get(ENV_DETERMINISTIC, "") == "1"
        self.deterministic = bool(deterministic)
        self.tcp = bool(tcp)
        if isinstance(connect_timeout, datetime.timedelta):
            connect_timeout = connect_timeout.total_seconds()
        if connect_timeout is not None and not connect_timeout > 0:
            raise ValueError("gorun.Options: connect_timeout %r is not a positive duration" % (connect_timeout,))
        self.connect_timeout = connect_timeout

    def config(self, timeout):
        ms = 0
        if timeout is not None and timeout.total_seconds() > 0:
            ms = int(timeout.total_seconds() * 1000)
        cfg = "deterministic=%d tcp=%d timeout_ms=%d" % (self.deterministic, self.tcp, ms)
        if self.connect_timeout is not None:
            cfg += " connect_timeout_ms=%d" % max(1, int(self.connect_timeout * 1000))
        return cfg


# ---- the world ----------------------------------------------------------------

_world_lock = threading.Lock()
_world = None  # world communicator handle
_world_config = None  # the options part of gorun_init's config (options.config(timeout))
_world_timeout_ms = 0  # the world's timeout (0: none): subgroups with another enforce theirs
_world_members = None  # the global ranks of gorun's world when it is not all of torch's
# How many gorun worlds this process has begun: the store keys of each are
# its own, since a store may outlive a world (destroy_process_group, then
# init_process_group again on the same MASTER_PORT).
_world_count = 0


def _env_identity():
    """(rank, size) as the environment the process started with says:
    gorun's own variables, else torch's; None where it says nothing."""
    for rk, sk in (("GORUN_RANK", "GORUN_WORLD_SIZE"), ("RANK", "WORLD_SIZE")):
        r, n = os.environ.get(rk), os.environ.get(sk)
        if r is not None and n is not None:
            try:
                return int(r), int(n)
            except ValueError:
                return None
    return None


def _agree(store, key, mine, size):
    """Whether mine (a bool) holds on every one of the size ranks that call
    this with the same store and key: one counter of dissenters and one of
    arrivals, so each rank makes O(1) store calls."""
    key = "gorun/%d/%s" % (_world_count, key)
    store.add(key + "/no", 0 if mine else 1)
    if store.add(key + "/arrived", 1) == size:
        store.set(key + "/done", "1")
    store.wait([key + "/done"])
    return store.add(key + "/no", 0) == 0


def _identity_env(store, rank, size):
    """gorun_init's env.NAME=VALUE overrides that make the library's rank
    the one torch passed (init_process_group's rank and world_size, or a
    group's), whatever the environment the process started with says:
    Go's runtime reads that environment, not later os.environ changes.

    When every rank was started by gorun as exactly this rank of this world
    (gorun -np N with env:// or any init_method), gorun's own rendezvous is
    used as it is: no overrides. Otherwise (torchrun, mp.spawn with tcp:// or
    file://, WORLD_SIZE without RANK, children of a gorun rank, a gorun
    group of some of torch's ranks) the rendezvous is bootstrapped through
    torch's store: rank 0 picks a free port next to MASTER_ADDR, a random
    secret and a job id, and every rank takes its identity from torch, its
    host-local numbering from torch's LOCAL_RANK/LOCAL_WORLD_SIZE when the
    environment's RANK/WORLD_SIZE are torch's too (torchrun) or else from
    the hosts the ranks publish in the store. The decision is taken by all
    ranks together, so that none joins gorun's rendezvous while another
    bootstraps its own."""
    launched = "GORUN_RDZV_ENDPOINT" in os.environ and "GORUN_SECRET" in os.environ
    env = _env_identity()
    if store is None:
        if size == 1 and env in (None, (0, 1)):
            return ""  # a world of one needs nobody
        raise GorunError("gorun: torch gave no store to agree on a rendezvous through (rank %d of %d)"
                         % (rank, size), "GORUN_ERR_INIT")
    if _agree(store, "launch", launched and env == (rank, size), size):
        return ""
    torchrun = env == (rank, size) and "LOCAL_RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ
    if _agree(store, "torchrun", torchrun, size):
        local, nlocal = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    else:
        host = os.environ.get("GORUN_HOST") or socket.gethostname()
        store.set("gorun/%d/host/%d" % (_world_count, rank), host)
        hosts = [store.get("gorun/%d/host/%d" % (_world_count, r)).decode() for r in range(size)]
        mates = [r for r in range(size) if hosts[r] == host]
        local, nlocal = mates.index(rank), len(mates)
    w = "gorun/%d/" % _world_count
    if rank == 0:
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        store.set(w + "rdzv", "%s:%d" % (host, _rdzv_port("127.0.0.1" if host == "localhost" else host)))
        store.set(w + "secret", secrets.token_hex(32))
        store.set(w + "job", "torch-" + secrets.token_hex(8))
    return (" env.GORUN_RDZV_ENDPOINT=%s env.GORUN_SECRET=%s env.GORUN_JOB_ID=%s env.GORUN_RANK=%d "
            "env.GORUN_WORLD_SIZE=%d env.GORUN_LOCAL_RANK=%d env.GORUN_LOCAL_WORLD_SIZE=%d" % (
                store.get(w + "rdzv").decode(), store.get(w + "secret").decode(),
                store.get(w + "job").decode(), rank, size, local, nlocal))


def _rdzv_port(host):
    """A free port for rank 0's rendezvous, chosen below the kernel's
    ephemeral range. The port is closed again before gorun's rendezvous
    binds it, and a port from bind(0) could meanwhile be handed to any
    socket that binds port 0 or connects out (a rank's data-plane or
    gossip listener among them), after which the ranks would dial that
    socket as the seed until the formation timeout. Below the range only
    an explicit bind can take it."""
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    bottom = max(1024, lo - 12000)
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(bottom, lo) if lo > bottom else 0
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((host, port))
            return s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
    raise GorunError("gorun: no free port for the rendezvous on %s below %d" % (host, lo), "GORUN_ERR_INIT")


def _timeout_ms(timeout):
    if timeout is None or timeout.total_seconds() <= 0:
        return 0
    return int(timeout.total_seconds() * 1000)


def _init_world(store, rank, size, options, timeout, members=None):
    """gorun's world: every rank of torch's default group (rank and size as
    torch passed them), or, when members is given (a gorun group made while
    the default group has another backend, so that only the group's
    members run this), those global ranks alone, as a world of their own
    bootstrapped through the group's store. One world per process at a
    time: destroy_process_group (or finalize()) ends it."""
    global _world, _world_config, _world_members, _world_timeout_ms, _world_count
    with _world_lock:
        cfg = options.config(timeout)
        if _world is not None:
            raise GorunError("gorun: a gorun world already exists in this process (%s); destroy_process_group() "
                             "ends it before another init_process_group" % _world_config, "GORUN_ERR_INVALID")
        extra = _identity_env(store, rank, size)
        l = _lib.lib()
        h = ctypes.c_int64()
        _lib.check(l.gorun_init((cfg + extra).encode(), ctypes.byref(h)), "gorun_init")
        _world, _world_config, _world_members = h.value, cfg, members
        _world_timeout_ms = _timeout_ms(timeout)
        _world_count += 1
        return _world


atexit.register(lambda: _finalize_at_exit())


def finalize():
    """Closes every gorun communicator and leaves the world (at exit this
    runs by itself). After it, init_process_group("gorun") starts afresh."""
    global _world, _world_config, _world_members, _world_timeout_ms
    with _world_lock:
        if _world is None or not _lib.loaded():
            return
        for pg in list(_live_groups):
            pg._stop()
        _world, _world_config, _world_members, _world_timeout_ms = None, None, None, 0
        _lib.check(_lib.lib().gorun_finalize(), "gorun_finalize")


def _finalize_at_exit():
    """finalize() as the interpreter exits. A world that failed (a lost
    peer, a desync) fails finalize too, with what the program's own calls
    most likely raised already: one line on stderr then, not a second
    traceback (Python's "Error in atexit._run_exitfuncs") after the
    program's own. The exit status is Python's either way."""
    try:
        finalize()
    except GorunError as e:
        sys.stderr.write("gorun: at exit: %s\n" % e)


# ---- Work ------------------------------------------------------------------------


class _Completer(threading.Thread):
    """Completes the futures of one group's calls as they finish, so that
    DDP's buckets and comm hooks (which only chain on futures) progress
    without anyone calling wait. Calls complete in issue order, so waiting
    for them one after another in that order loses nothing."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.q = queue.SimpleQueue()

    def run(self):
        while True:
            w = self.q.get()
            if w is None:
                return
            w._wait_native(-1)


class GorunWork(Work):
    """An issued call: wait, is_completed, is_success, exception, result and
    get_future behave like torch's own backends'."""

    def __init__(self, pg, what, reqs, keep, outputs, post=None):
        super().__init__()
        self._pg = pg
        pg._adopt(self)
        self._what = what
        self._reqs = reqs  # library requests, in issue order
        self._keep = keep  # tensors the library reads or writes
        self._outputs = outputs
        self._post = post  # runs once on success (copies out of temporaries)
        self._mu = threading.Lock()
        self._done = False  # set under _mu, read without it (a bool store is atomic)
        self._exc = None
        self._future = None
        self._issued = None  # a threading.Event while the call waits for its channel (point-to-point)
        self._anysource = False  # a receive through the group's matcher: learn its source
        self._source = None  # the group rank it received from, once complete

    # -- completion --
    def _finish(self, exc):
        with self._mu:
            if self._done:
                return
            if exc is None and self._post is not None:
                try:
                    self._post()
                except Exception as e:  # a copy that failed: report, never hang
                    exc = e
            self._exc = exc
            l = _lib.lib() if _lib.loaded() else None
            if l is not None:
                if exc is None and self._anysource:
                    src = ctypes.c_int(-1)
                    rc = l.gorun_request_source(self._reqs[0], ctypes.byref(src))
                    if rc == _lib.OK:
                        self._source = src.value
                    else:
                        self._exc = _lib.error(rc, "gorun %s" % self._what)
                for r in self._reqs:
                    l.gorun_request_free(r)
            self._keep = None
            self._done = True
            fut = self._future
        self._pg._retire(self)
        if fut is not None:
            _settle(fut, self._outputs, exc)

    def _wait_native(self, timeout_ms):
        """Waits for every request; returns False on a timeout."""
        if self._done:
            return True
        if self._issued is not None and not self._issued.wait(None if timeout_ms < 0 else timeout_ms / 1000):
            return False
        if self._done:
            return True  # the channel failed: _finish ran
        l = _lib.lib()
        for r in self._reqs:
            rc = l.gorun_wait(r, timeout_ms)
            if self._done:
                return True  # another thread finished it meanwhile
            if rc == _lib.ERR_TIMEOUT and timeout_ms >= 0:
                return False
            if rc != _lib.OK:
                self._finish(_lib.error(rc, "gorun %s" % self._what))
                return True
        self._finish(None)
        return True

    # -- torch's Work interface --
    def wait(self, timeout=datetime.timedelta(0)):
        ms = -1
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
            ms = int(timeout.total_seconds() * 1000)
        elif isinstance(timeout, (int, float)) and timeout > 0:
            ms = int(timeout * 1000)
        bounded = ms < 0 and self._pg._wait_ms > 0
        if bounded:
            ms = self._pg._wait_ms
        if not self._wait_native(ms):
            if bounded:
                msg = "gorun %s: not complete after the group's timeout of %d ms; the group is aborted" % (
                    self._what, ms)
                self._pg.abort(msg)
                self._wait_native(-1)
                raise _lib.GorunTimeout(msg, "GORUN_ERR_TIMEOUT", -1)
            raise _lib.GorunTimeout("gorun %s: not complete after %d ms (the call goes on)" % (self._what, ms),
                                    "GORUN_ERR_TIMEOUT", -1)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        if self._done:
            return True
        if self._issued is not None and not self._issued.is_set():
            return False
        l = _lib.lib()
        done = ctypes.c_int()
        for r in self._reqs:
            rc = l.gorun_test(r, ctypes.byref(done))
            if self._done:
                return True
            if rc != _lib.OK:
                self._finish(_lib.error(rc, "gorun %s" % self._what))
                return True
            if not done.value:
                return False
        self._finish(None)
        return True

    def is_success(self):
        if not self.is_completed():
            raise RuntimeError("gorun %s: is_success called before the call completed" % self._what)
        return self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        self.wait()
        return self._outputs

    def source_rank(self):
        """The group rank a receive got its message from (torch's recv
        without src reads it after wait)."""
        if not self._done:
            raise RuntimeError("gorun %s: source_rank called before the receive completed" % self._what)
        if self._source is None:
            raise RuntimeError("gorun %s: source_rank: not a receive that completed" % self._what)
        return self._source

    _source_rank = source_rank

    def synchronize(self):
        pass  # CPU tensors: nothing to synchronise

    def get_future(self):
        with self._mu:
            if self._future is None:
                self._future = Future()
                if self._done:
                    _settle(self._future, self._outputs, self._exc)
                else:
                    self._pg._complete_in_order(self)
            return self._future


def _settle(fut, outputs, exc):
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(outputs)


class _DoneWork(GorunWork):
    """A call that needs no communication (e.g. a group of one)."""

    def __init__(self, pg, what, outputs, post=None):
        super().__init__(pg, what, [], None, outputs, post)
        self._finish(None)


class _WorkList(GorunWork):
    """The Work of several calls issued separately (end_coalescing): it
    completes when they all have, with the first failure."""

    def __init__(self, pg, what, works):
        super().__init__(pg, what, [], None, [o for w in works for o in (w._outputs or [])])
        self._works = works

    def _wait_native(self, timeout_ms):
        for w in self._works:
            if not w._wait_native(timeout_ms):
                return False
        self._finish(next((w._exc for w in self._works if w._exc is not None), None))
        return True

    def is_completed(self):
        if all(w.is_completed() for w in self._works):
            return self._wait_native(-1)
        return False


class _SyncWork(Work):
    """A call that already completed on the caller's thread (see
    _caller_waits): every query answers at once. One instance, _SYNC_DONE,
    serves every such call: the torch function that called the group
    (async_op=False) only waits on it and drops it, and building a Work
    through pybind11 costs about as much as the rest of a small call's
    Python (notes/torch-backend.md)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        # Never reached through torch's functions (they only wait); a
        # result it does not have must not pass for an empty one.
        raise RuntimeError("gorun: result() of a synchronous call's Work: the outputs are the call's own tensors")

    def synchronize(self):
        pass

    def get_future(self):
        raise RuntimeError("gorun: get_future() of a synchronous call's Work (call with async_op=True for a future)")


_SYNC_DONE = _SyncWork()


# ---- synchronous callers ----------------------------------------------------------

# torch.distributed's functions that, with async_op=False, issue one call on
# the group and wait for it at once (``work = group.allreduce(...);
# work.wait()``). Called from one of these, a collective runs to completion
# inside one library call (gorun_* with a NULL request): the caller's thread
# runs it with no hand-off to gorun's worker thread and back, no request
# handle and no Work to track — on a small message that is most of the cost
# of a call (notes/torch-backend.md). Any other caller (async_op=True, DDP's
# C++ reducer, a direct pg.allreduce) gets an asynchronous call and a Work.
def _sync_codes():
    import inspect
    c10d = dist.distributed_c10d
    names = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
             "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all_single",
             "all_to_all", "gather", "scatter", "barrier", "all_reduce_coalesced", "all_gather_coalesced")
    codes = set()
    for n in names:
        f = getattr(c10d, n, None)
        if f is not None and hasattr(f, "__code__"):
            f = inspect.unwrap(f)
            if "async_op" in f.__code__.co_varnames:
                codes.add(f.__code__)
    return frozenset(codes)


_SYNC_CODES = _sync_codes()
_ALL_REDUCE_CODE = next((c for c in _SYNC_CODES if c.co_name == "all_reduce"), None)


def _code_of(name):
    import inspect
    f = getattr(dist.distributed_c10d, name, None)
    f = inspect.unwrap(f) if f is not None else None
    return getattr(f, "__code__", None)


_RECV_CODE, _IRECV_CODE = _code_of("recv"), _code_of("irecv")


def _called_by_dist_recv():
    """Whether the group method being run was called (C++ frames aside) by
    torch's dist.recv, directly or through dist.irecv (as torch 2.15's
    recv does), which asks the Work for its source rank after waiting."""
    try:
        f = sys._getframe(2)
        if f.f_code is _IRECV_CODE and f.f_back is not None:
            f = f.f_back
        return _RECV_CODE is not None and f.f_code is _RECV_CODE
    except ValueError:
        return False


def _caller_waits(depth=3):
    """Whether the collective method being run (depth-1 frames up from
    here: method → _issue → this by default) was called by one of torch's
    functions with async_op=False, which waits for the Work before doing
    anything else."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return False
    return f.f_code in _SYNC_CODES and f.f_locals.get("async_op") is False


# ---- argument checks ----------------------------------------------------------


def _dtype(t, what, name="tensor"):
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise TypeError("gorun %s: %s has dtype %s, which is not supported (supported: %s)" %
                        (what, name, t.dtype, ", ".join(str(d).replace("torch.", "") for d in _DTYPES)))
    return dt


def _check(t, what, name="tensor"):
    """The gorun dtype of t, a dense contiguous CPU tensor; otherwise a
    TypeError or ValueError naming the call and the argument."""
    # The common case in four attribute reads, since it runs on every call;
    # the error path below says which condition failed.
    try:
        if t.is_cpu and t.layout is _STRIDED and t.is_contiguous():
            dt = _DTYPES.get(t.dtype)
            if dt is not None:
                return dt
    except AttributeError:
        pass
    if not isinstance(t, torch.Tensor):
        raise TypeError("gorun %s: %s is a %s, not a tensor" % (what, name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("gorun %s: %s is on %s; the gorun backend moves CPU tensors (for CUDA tensors "
                         "init_process_group(\"cpu:gorun,cuda:nccl\") gives them to NCCL)" % (what, name, t.device))
    if t.layout != torch.strided:
        raise ValueError("gorun %s: %s has layout %s; only dense tensors are supported" % (what, name, t.layout))
    if not t.is_contiguous():
        raise ValueError("gorun %s: %s is not contiguous (call .contiguous() first)" % (what, name))
    return _dtype(t, what, name)


_STRIDED = torch.strided
_SPARSE_COO = torch.sparse_coo


def _bytes(t):
    """t, or for a dtype the library cannot reduce but any call that only
    moves data can carry (int8, int16, complex, float8, ...), t's bytes: a
    uint8 view of the same memory, rows kept (the last dimension scaled)."""
    if isinstance(t, torch.Tensor) and t.dtype not in _DTYPES and t.is_cpu and t.layout is _STRIDED \
            and t.is_contiguous():
        try:
            return (t if t.dim() else t.reshape(1)).view(torch.uint8)
        except RuntimeError:
            return t
    return t


def _one(tensors, what, name="tensors"):
    if len(tensors) != 1:
        raise ValueError("gorun %s: %s has %d tensors; the gorun backend takes exactly one "
                         "(one CPU tensor per process)" % (what, name, len(tensors)))
    return tensors[0]


def _same(a, b, what, na, nb):
    if a.dtype != b.dtype:
        raise TypeError("gorun %s: %s is %s but %s is %s" % (what, na, a.dtype, nb, b.dtype))


def _op(opts, what, dt):
    if opts is None:
        return _lib.SUM
    op = opts.reduceOp
    op = getattr(op, "op", op)  # a ReduceOp wraps its RedOpType
    # By the enum's integer: hashing a pybind11 enum costs more than the
    # rest of the lookup.
    code = _OPS_BY_VALUE.get(int(op))
    if code is None:
        raise ValueError("gorun %s: reduce op %s is not supported (supported: SUM, PRODUCT, MIN, MAX, AVG)"
                         % (what, str(op).split(".")[-1]))
    if code == _lib.AVG and dt == _lib.BOOL:
        raise ValueError("gorun %s: AVG is not defined for bool tensors" % what)
    return code


# A C array of pointers or size_t, built from a Python iterable in one C
# loop (array.array): 64 entries cost about 1 us this way against 8 us for
# a ctypes array made from a list (notes/torch-backend.md).
_WORD = next(c for c in "LQ" if array.array(c).itemsize == ctypes.sizeof(ctypes.c_void_p))
assert ctypes.sizeof(ctypes.c_size_t) == array.array(_WORD).itemsize
_DATA_PTR = torch.Tensor.data_ptr
_NUMEL = torch.Tensor.numel


def _vectors(tensors, what, name="tensors"):
    """(dtype code, pointers, counts) of a non-empty list of tensors that
    one library call reads as vectors: each a dense contiguous CPU tensor
    of tensors[0]'s dtype whose memory is there (a tensor with elements but
    data_ptr 0 has had its storage freed, e.g. resized to 0 as FSDP does).
    pointers and counts are C arrays of len(tensors) words, read by the
    library during the call.

    Every tensor is checked; the common case costs four attribute reads a
    tensor and two C loops. Any tensor that fails (or an attribute that
    raises) sends the whole list through the full checks, which raise
    ValueError or TypeError naming the call and the index."""
    t0 = tensors[0]
    dt = _check(t0, what, "%s[0]" % name)
    dtype = t0.dtype
    try:
        for t in tensors:
            if not (t.is_cpu and t.layout is _STRIDED and t.dtype is dtype and t.is_contiguous()):
                break
        else:
            ptrs = array.array(_WORD, map(_DATA_PTR, tensors))
            counts = array.array(_WORD, map(_NUMEL, tensors))
            # An empty tensor may have data_ptr 0; one with elements may not.
            if 0 not in ptrs or not any(c for p, c in zip(ptrs, counts) if not p):
                return dt, ptrs, counts
    except (AttributeError, TypeError, RuntimeError):
        pass
    for i, t in enumerate(tensors):
        who = "%s[%d]" % (name, i)
        _check(t, what, who)
        _same(t0, t, what, "%s[0]" % name, who)
        try:
            p = t.data_ptr()
        except RuntimeError as e:  # a tensor without memory of its own (e.g. a FakeTensor)
            raise ValueError("gorun %s: %s has no memory to read: %s" % (what, who, str(e).split("\n")[0])) from e
        k = t.numel()
        if k and not p:
            raise ValueError("gorun %s: %s has %d elements but no memory (data_ptr 0: its storage was freed or "
                             "resized to 0)" % (what, who, k))
    raise GorunError("gorun %s: unreachable: the checks passed a list the one-pass check refused" % what,
                     "GORUN_ERR_INTERNAL")


# Flight record labels: each collective carries the torch call's name (the
# torch.distributed API that reached this backend: "all_reduce_coalesced",
# "reduce_scatter_tensor") into the library's flight records, so that a desync
# or stall dump names it next to the library's own call. The label rides in
# the dtype argument (gorun.h: GORUN_LABELED): no extra library call, and a
# call from one thread cannot take another thread's label.
_LABELS = {}


def _label(name):
    """GORUN_LABELED's bits for name, registered with the library once."""
    b = _LABELS.get(name)
    if b is None:
        v = ctypes.c_int()
        _lib.check(_lib.lib().gorun_label(name.encode(), ctypes.byref(v)), "gorun_label(%r)" % name)
        b = _LABELS[name] = v.value << 8
    return b


def _ptr(t):
    # ctypes converts an int for a c_void_p argument itself; None is NULL.
    return t.data_ptr() if t.numel() else None


# ---- the process group ---------------------------------------------------------

_live_groups = weakref.WeakSet()


def _after_fork_in_child():
    # Go's runtime does not survive fork: a child that calls a group's
    # cached library gets lib()'s error instead (see _lib.Forked).
    for pg in list(_live_groups):
        pg._l = _lib.Forked()
        pg._ar = pg._l.gorun_allreduce


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Channel:
    """The two-rank communicator of one direction of point-to-point
    traffic (src → dst). It connects on a thread of its own, since both ends
    must take part and each may first be busy with other sends; calls made
    meanwhile are queued and issued, in order, once it is up."""

    def __init__(self, pg, src, dst):
        self._mu = threading.Lock()
        self._h = None
        self._err = None
        self._queue = []  # (work, issue) waiting for the connection
        self._ready = []  # fn(handle) to call once connected, after the queue is issued
        self._closed = False  # freed: a connection awaited again (see _connect) is given up
        ranks = [pg._ranks[src], pg._ranks[dst]]
        tag = "torch-p2p-%d-%d-of-%d" % (src, dst, pg._h)
        threading.Thread(target=self._connect, args=(ranks, tag), name="gorun-p2p-%d-%d" % (src, dst),
                         daemon=True).start()

    def _connect(self, ranks, tag):
        l = _lib.lib()
        arr = (ctypes.c_int * 2)(*ranks)
        while True:
            h = ctypes.c_int64()
            world = _world
            if world is None:  # finalized before or between attempts
                rc, err = _lib.ERR_CLOSED, GorunError("gorun point-to-point channel %d→%d: gorun's world was "
                                                      "finalized" % tuple(ranks), "GORUN_ERR_CLOSED")
            else:
                rc = l.gorun_comm_group(world, arr, 2, tag.encode(), ctypes.byref(h))
                err = None if rc == _lib.OK else _lib.error(rc, "gorun point-to-point channel %d→%d" % tuple(ranks))
            with self._mu:
                if rc == _lib.ERR_TIMEOUT and self._ready and not self._closed:
                    # A receive from any source waits for this sender
                    # (when_ready), and a sender that has not sent yet is no
                    # failure: the calls queued for this sender alone fail
                    # with the timeout (what it is for), and the connection
                    # is awaited again. Given up, the source would drop out
                    # of the matcher for good, and a sender connecting
                    # later would complete its sends into a connection
                    # that no receive reads (the library keeps a connection
                    # that arrives before its group is awaited).
                    for w, issue in self._queue:
                        w._issued.set()
                        w._finish(err)
                    self._queue = []
                    continue
                self._h, self._err = (h.value if err is None else None), err
                for w, issue in self._queue:
                    self._issue_locked(w, issue)
                self._queue = None
                if err is None:
                    for fn in self._ready:
                        fn(self._h)
                self._ready = None
                return

    def when_ready(self, fn):
        """Calls fn(handle) once the channel is up (now, if it is), after
        the calls issued before: the matcher's first probe comes after
        them on the channel. Never, if the channel failed."""
        with self._mu:
            if self._queue is not None:
                self._ready.append(fn)
            elif self._h is not None:
                fn(self._h)

    def _issue_locked(self, w, issue):
        if self._err is not None:
            w._issued.set()
            w._finish(self._err)
            return
        r = ctypes.c_int64()
        rc = issue(_lib.lib(), ctypes.byref(r), self._h)
        if rc != _lib.OK:
            w._issued.set()
            w._finish(_lib.error(rc, "gorun %s" % w._what))
            return
        w._reqs.append(r.value)
        w._issued.set()

    def free(self):
        with self._mu:
            self._closed = True
            h, self._h = self._h, None
        if h:
            _lib.lib().gorun_comm_free(h)

    def submit(self, pg, what, issue, t):
        w = GorunWork(pg, what, [], [t], [t])
        w._issued = threading.Event()
        with self._mu:
            if self._queue is not None:
                self._queue.append((w, issue))
            else:
                self._issue_locked(w, issue)
        return w


class _Gorun:
    """The collectives of a gorun group on one communicator (CPU tensors),
    shared by the two shapes torch takes a backend in (below).

    wait_ms: the group's own timeout when it differs from the world's (the
    library's watchdog enforces the world's): its calls are then issued
    asynchronously and waited for that long, after which the group is
    aborted on every rank and the call raises GorunTimeout naming it."""

    def _setup(self, handle, ranks, timeout, store, wait_ms, world, owner=None):
        self._h = handle
        self._ranks = ranks
        self._timeout = timeout
        self._store = store
        self._wait_ms = wait_ms
        self._is_world = world
        self._owner = owner  # the ProcessGroupGorun this backend serves, if any
        self._coalescing = None  # the Works issued between start_coalescing and end_coalescing
        self._pending = {}
        self._recent = collections.deque(maxlen=self._RETAIN)
        self._channels = {}
        self._matcher = None  # receives from any source, and every receive after the first such (_recv_matched)
        self._matcher_mu = threading.Lock()
        self._l = _lib.lib()
        self._ar = self._l.gorun_allreduce  # one attribute read less per call
        self._lar = _label("all_reduce")
        self._completer = None
        self._shut = False
        _live_groups.add(self)

    def _complete_in_order(self, w):
        if self._completer is None:
            self._completer = _Completer("gorun-completer-%d" % self._h)
            self._completer.start()
        self._completer.q.put(w)

    # torch reads these through attribute lookup on the Python object; a
    # subclass that does not define them sends torch's lookup back into
    # itself (RecursionError in batch_isend_irecv). Coalescing: calls issued
    # between start_coalescing and end_coalescing are ordinary asynchronous
    # calls on the group, so torch's NCCL-style coalescing of
    # point-to-point calls (which would then wait on end_coalescing's Work
    # alone) is not offered.
    supports_coalescing = property(lambda self: False)
    supports_splitting = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    _supports_time_estimate = property(lambda self: False)

    def shutdown(self):
        """destroy_process_group: the group's communicator is freed and, for
        the group that founded gorun's world, the world is finalized, so that
        init_process_group can start another in this process."""
        if self._owner is not None:
            return self._owner.shutdown()
        if self._shut:
            return
        self._shut = True
        self._stop()
        self._store = None
        m, self._matcher = self._matcher, None
        if m is not None and _lib.loaded():
            self._l.gorun_matcher_free(m)  # before the channels it reads from
        if self._is_world:
            finalize()
        elif _world is not None and _lib.loaded():
            for ch in list(self._channels.values()):
                ch.free()
            self._l.gorun_comm_free(self._h)

    def _stop(self):
        if self._completer is not None:
            self._completer.q.put(None)

    # A Work that C++ holds (DDP, verify_params_across_processes) is reached
    # through torch's trampoline only while its Python object lives: once the
    # Python object is collected, C++ calls land in c10d::Work's own wait,
    # which nothing here can complete, and hang. So the group holds every
    # Work until it has completed, and the last _RETAIN completed ones after
    # that (for a second wait from C++).
    _RETAIN = 1024

    # dict and deque operations are atomic under the GIL: no lock needed.
    def _adopt(self, w):
        self._pending[id(w)] = w

    def _retire(self, w):
        if self._pending.pop(id(w), None) is not None:
            self._recent.append(w)

    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND

    def abort(self, reason="aborted by the user"):
        """Fails every pending and future call of this group on every rank."""
        _lib.check(_lib.lib().gorun_comm_abort(self._h, reason.encode()), "gorun abort")

    # -- issuing --
    def _issue(self, what, fn, keep, outputs, post=None, calls=None):
        """Issues one library call per entry of calls (or fn once) and returns
        the Work. fn(lib, req_ptr) issues and returns the status; with a
        NULL req_ptr the library runs the call to completion before it
        returns (synchronous callers, see _caller_waits). Several calls
        (a coalesced call) are issued back to back on this group's
        communicator, where the library may fuse them."""
        l = self._l
        sync = _caller_waits()
        if sync and not self._wait_ms and self._coalescing is None:
            for f in (calls if calls is not None else (fn,)):
                rc = f(l, None)
                if rc != _lib.OK:
                    raise _lib.error(rc, "gorun %s" % what)
            if post is not None:
                post()
            return _SYNC_DONE
        reqs = []
        for f in (calls if calls is not None else [fn]):
            r = ctypes.c_int64()
            rc = f(l, ctypes.byref(r))
            if rc != _lib.OK:
                exc = _lib.error(rc, "gorun %s" % what)
                for q in reqs:
                    l.gorun_request_free(q)
                raise exc
            reqs.append(r.value)
        w = GorunWork(self, what, reqs, keep, outputs, post)
        if self._coalescing is not None:
            self._coalescing.append(w)
        elif sync:
            w.wait()  # bounded by the group's own timeout
            return _SYNC_DONE
        return w

    # -- coalescing (torch's _coalescing_manager with a device) --
    def start_coalescing(self, device=None):
        if self._coalescing is not None:
            raise RuntimeError("gorun start_coalescing: already coalescing on this group")
        self._coalescing = []

    def end_coalescing(self, device=None):
        """One Work for every call issued since start_coalescing: they went
        to the library back to back as they came, asynchronously."""
        if self._coalescing is None:
            raise RuntimeError("gorun end_coalescing: start_coalescing was not called on this group")
        ws, self._coalescing = self._coalescing, None
        return _WorkList(self, "coalesced calls", ws)

    # -- collectives --
    def allreduce(self, tensors, opts=None):
        what = "allreduce"
        # dist.all_reduce(t), the hottest call there is: with async_op=False
        # it runs in one library call, reading the op from torch's frame
        # (the ReduceOp object it put into opts): reading opts.reduceOp back
        # through pybind11 costs 0.6 us, its .op as much again, and the
        # default op is one object, compared by identity. Anything unusual
        # takes the general path below, which checks and raises.
        f = sys._getframe(1)
        if f.f_code is _ALL_REDUCE_CODE and len(tensors) == 1 and not self._wait_ms:
            loc = f.f_locals
            t = tensors[0]
            if loc.get("async_op") is False and t.layout is _STRIDED:
                dt = _check(t, what)
                op = loc.get("op")
                op = _lib.SUM if op is _SUM else _OPS_BY_VALUE.get(int(getattr(op, "op", op)))
                if op is not None and not (op == _lib.AVG and dt == _lib.BOOL):
                    n = t.numel()
                    p = t.data_ptr() if n else None
                    rc = self._ar(self._h, p, p, n, dt | self._lar, op, None)
                    if rc:
                        raise _lib.error(rc, "gorun %s" % what)
                    return _SYNC_DONE
        t = _one(tensors, what)
        if t.layout is _SPARSE_COO:
            return self._sparse_allreduce(t, opts)
        dt = _check(t, what)
        op = _op(opts, what, dt)
        n = t.numel()
        p = t.data_ptr() if n else None  # each tensor method call costs: read once
        dt |= self._lar
        return self._issue(what, lambda l, r: l.gorun_allreduce(self._h, p, p, n, dt, op, r), [t], [t])

    def _sparse_allreduce(self, t, opts):
        """dist.all_reduce of a sparse COO tensor (SUM, as gloo offers it):
        every rank's coalesced indices and values are all-gathered (padded
        to the largest count) and summed into one coalesced tensor, in rank
        order, so every rank gets the same result; t is overwritten with it.
        The ranks' tensors must agree in size, sparse dimensions and dtype;
        that is checked on every rank first, naming what differs."""
        what = "allreduce (sparse)"
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        op = getattr(op, "op", op)
        if int(op) != int(ReduceOp.RedOpType.SUM):
            raise ValueError("gorun %s: reduce op %s is not supported for sparse tensors (only SUM)"
                             % (what, str(op).split(".")[-1]))
        if not t.is_cpu:
            _check(t, what)  # raises, naming the device
        n = self.size()
        local = t.coalesce()
        idx, val = local._indices().contiguous(), local._values().contiguous()
        shape = [local.sparse_dim(), local.dim(), zlib.crc32(str(t.dtype).encode())] + list(t.shape)
        # What every rank has: nnz, then its layout (the layout's length first,
        # so that ranks of different dimensions compare rather than desync).
        head = self._gather_sync(torch.tensor([local._nnz(), len(shape)], dtype=torch.int64), what)
        if len(set(head[:, 1].tolist())) != 1:
            raise ValueError("gorun %s: the ranks' tensors differ in their number of dimensions" % what)
        layouts = self._gather_sync(torch.tensor(shape, dtype=torch.int64), what)
        for r in range(n):
            sd, nd, code, *size = layouts[r].tolist()
            if code != shape[2]:
                raise ValueError("gorun %s: rank %d's tensor has another dtype than this rank's %s" % (what, r, t.dtype))
            if [sd, nd] + size != shape[:2] + shape[3:]:
                raise ValueError("gorun %s: rank %d's tensor (size %s, %d sparse dimensions) differs from this "
                                 "rank's (size %s, %d)" % (what, r, size, sd, list(t.shape), shape[0]))
        counts = head[:, 0].tolist()
        most = max(counts)
        pad_idx = torch.zeros((idx.shape[0], most), dtype=idx.dtype)
        pad_idx[:, :idx.shape[1]] = idx
        pad_val = torch.zeros((most,) + tuple(val.shape[1:]), dtype=val.dtype)
        pad_val[:val.shape[0]] = val
        all_idx = self._gather_sync(pad_idx, what)
        all_val = self._gather_sync(pad_val, what)
        out = torch.sparse_coo_tensor(torch.cat([all_idx[r][:, :counts[r]] for r in range(n)], dim=1),
                                      torch.cat([all_val[r][:counts[r]] for r in range(n)]),
                                      t.shape).coalesce()
        t.copy_(out)
        return _DoneWork(self, what, [t])

    def _gather_sync(self, t, what):
        """All-gathers t (contiguous, any dtype) into a tensor of the group's
        size stacked on a new first dimension, waiting for it here."""
        t = t.contiguous()
        out = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype)
        src, dst = _bytes(t), _bytes(out)
        dt = _check(src, what) | _label("all_reduce")  # the torch call it serves
        k = src.numel()
        w = self._issue(what, lambda l, r: l.gorun_allgather(self._h, _ptr(src), _ptr(dst), k, dt, r),
                        [src, dst], [out])
        w.wait()
        return out

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """dist.monitored_barrier: a barrier that names the ranks that did
        not reach it within timeout, as gloo's does. It runs over the
        group's store (the control plane), not the data plane, so a rank
        that never comes leaves no call pending on the group: every rank
        checks in; group rank 0 waits for each in rank order until the
        timeout and raises naming the first that did not come (every one
        with wait_all_ranks), then tells the others whether all came; they
        raise if not, or if rank 0 does not answer within their timeout.
        The group goes on working after a failed one (the data plane was
        never involved), but a rank that missed one call is a call behind
        for the later ones, which then fail on it: as with gloo, a failed
        monitored barrier is for reporting, not for carrying on."""
        what = "monitored_barrier"
        if self._store is None:
            raise RuntimeError("gorun %s: this group has no store to run it over" % what)
        if isinstance(timeout, BarrierOptions):  # how torch calls a Backend ("cpu:gorun,cuda:nccl")
            timeout = timeout.timeout
        if timeout is None:
            timeout = self._timeout
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        self._mb_seq = getattr(self, "_mb_seq", 0) + 1
        key = "gorun/monitored_barrier/%d/" % self._mb_seq
        me, n = self.rank(), self.size()
        start = time.monotonic()
        if me != 0:
            self._store.set(key + str(me), "1")
            try:
                self._store.wait([key + "done"], datetime.timedelta(seconds=max(secs, 0.001)))
                ok = self._store.get(key + "done") == b"ok"
            except RuntimeError:
                ok = False
            if not ok:
                raise RuntimeError("gorun %s: Rank %d successfully reached monitoredBarrier, but received errors "
                                   "while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                   "rank." % (what, me))
            return None
        missing = []
        for r in range(1, n):
            left = secs - (time.monotonic() - start)
            if left <= 0 and not missing and not wait_all_ranks:
                self._store.set(key + "done", "fail")
                raise RuntimeError("gorun %s: Rank 0 timed out in monitoredBarrier after %d ms."
                                   % (what, int((time.monotonic() - start) * 1000)))
            try:
                if left > 0:
                    self._store.wait([key + str(r)], datetime.timedelta(seconds=left))
                elif not self._store.check([key + str(r)]):
                    raise RuntimeError("not there")
            except RuntimeError:
                missing.append(r)
                if not wait_all_ranks:
                    break
        self._store.set(key + "done", "fail" if missing else "ok")
        for r in range(1, n):  # the check-ins are read; "done" stays for the ranks still to read it
            if r not in missing:
                try:
                    self._store.delete_key(key + str(r))
                except RuntimeError:
                    pass  # a store that cannot delete keeps them: a few bytes per call
        ms = int(secs * 1000)
        if missing and not wait_all_ranks:
            raise RuntimeError("gorun %s: Rank %d failed to pass monitoredBarrier in %d ms" % (what, missing[0], ms))
        if missing:
            raise RuntimeError("gorun %s: Ranks %s failed to pass monitoredBarrier in %d ms"
                               % (what, ", ".join(str(r) for r in missing), ms))
        return None

    def allreduce_coalesced(self, tensors, opts=None):
        what = "allreduce_coalesced"
        if not tensors:
            raise ValueError("gorun %s: no tensors" % what)
        dt, ptrs, counts = _vectors(tensors, what)
        op = _op(opts, what, dt)
        # One library call for all of them (gorun_allreduce_coalesced): one
        # request and one Work; the library fuses the small ones into one
        # message and reduces each tensor in place, so no flattening copy
        # is made here. The library reads the arrays during the call only,
        # and they live in this frame until _issue has returned.
        n, dt = len(tensors), dt | _label("all_reduce_coalesced")
        p, c = ptrs.buffer_info()[0], counts.buffer_info()[0]
        return self._issue(what, lambda l, r: l.gorun_allreduce_coalesced(self._h, p, p, c, n, dt, op, r),
                           list(tensors), list(tensors))

    def broadcast(self, tensors, opts=None):
        what = "broadcast"
        orig = _one(tensors, what)
        t = _bytes(orig)
        dt = _check(t, what)
        root = opts.rootRank if opts is not None else 0
        if opts is not None and opts.rootTensor != 0:
            raise ValueError("gorun %s: rootTensor %d; one tensor per process" % (what, opts.rootTensor))
        self._root(root, what)
        dt |= _label(what)
        return self._issue(what, lambda l, r: l.gorun_broadcast(self._h, _ptr(t), _ptr(t), t.numel(), dt, root, r),
                           [t], [orig])

    def reduce(self, tensors, opts=None):
        what = "reduce"
        t = _one(tensors, what)
        dt = _check(t, what)
        op = _op(opts, what, dt)
        root = opts.rootRank if opts is not None else 0
        self._root(root, what)
        dt |= _label(what)
        return self._issue(what, lambda l, r: l.gorun_reduce(self._h, _ptr(t), _ptr(t), t.numel(), dt, op, root, r),
                           [t], [t])

    def _root(self, root, what):
        if not 0 <= root < self.size():
            raise ValueError("gorun %s: root %d is outside the group of %d" % (what, root, self.size()))

    def _gather_out(self, outs, inp, what):
        """The contiguous buffer an all-gather writes (outs itself when the
        output tensors are consecutive pieces of one buffer), and the copy
        that moves it into outs afterwards (None when no copy is needed)."""
        n = self.size()
        if len(outs) != n:
            raise ValueError("gorun %s: output list has %d tensors for a group of %d" % (what, len(outs), n))
        for i, o in enumerate(outs):
            _check(o, what, "output[%d]" % i)
            _same(inp, o, what, "input", "output[%d]" % i)
            if o.numel() != inp.numel():
                raise ValueError("gorun %s: output[%d] has %d elements but input has %d"
                                 % (what, i, o.numel(), inp.numel()))
        k, es = inp.numel(), inp.element_size()
        base = outs[0].data_ptr()
        if all(o.data_ptr() == base + i * k * es for i, o in enumerate(outs)):
            return outs[0], None, base  # already one buffer
        flat = torch.empty(n * k, dtype=inp.dtype)

        def post():
            for i, o in enumerate(outs):
                o.view(-1).copy_(flat[i * k:(i + 1) * k])
        return flat, post, flat.data_ptr()

    def allgather(self, output_tensors, input_tensors, opts=None):
        what = "allgather"
        inp = _bytes(_one(input_tensors, what, "input_tensors"))
        orig = _one(output_tensors, what, "output_tensors")
        outs = [_bytes(o) for o in orig]
        dt = _check(inp, what, "input") | _label("all_gather")
        flat, post, ptr = self._gather_out(outs, inp, what)
        k = inp.numel()
        return self._issue(what, lambda l, r: l.gorun_allgather(self._h, _ptr(inp), ctypes.c_void_p(ptr) if k else None,
                                                                k, dt, r),
                           [inp, flat] + list(outs), [orig], post)

    def all_gather_single(self, output, input, opts=None):
        what = "all_gather_into_tensor"
        orig, input, output = output, _bytes(input), _bytes(output)
        dt = _check(input, what, "input") | _label(what)
        _check(output, what, "output")
        _same(input, output, what, "input", "output")
        if output.numel() != input.numel() * self.size():
            raise ValueError("gorun %s: output has %d elements, want %d (input %d × group of %d)"
                             % (what, output.numel(), input.numel() * self.size(), input.numel(), self.size()))
        return self._issue(what, lambda l, r: l.gorun_allgather(self._h, _ptr(input), _ptr(output), input.numel(),
                                                                dt, r),
                           [input, output], [orig])

    _allgather_base = all_gather_single  # older torch's name

    def _coalesced_calls(self, what, pairs, issue):
        """calls for _issue: issue(inp, out, dt) per (input, output) pair,
        each checked first (same dtype, sizes as one call of its kind)."""
        calls, keep = [], []
        for i, (inp, out) in enumerate(pairs):
            dt = _check(inp, what, "inputs[%d]" % i)
            _check(out, what, "outputs[%d]" % i)
            _same(inp, out, what, "inputs[%d]" % i, "outputs[%d]" % i)
            calls.append(issue(inp, out, dt | _label(what), i))
            keep += [inp, out]
        return calls, keep

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """all_gather_into_tensor for each (output, input) pair, issued back
        to back (functional collectives' all_gather_into_tensor_coalesced,
        _coalescing_manager)."""
        what = "all_gather_into_tensor_coalesced"
        if len(outputs) != len(inputs):
            raise ValueError("gorun %s: %d outputs for %d inputs" % (what, len(outputs), len(inputs)))
        n = self.size()

        def issue(inp, out, dt, i):
            if out.numel() != inp.numel() * n:
                raise ValueError("gorun %s: outputs[%d] has %d elements, want %d (input %d × group of %d)"
                                 % (what, i, out.numel(), inp.numel() * n, inp.numel(), n))
            return lambda l, r: l.gorun_allgather(self._h, _ptr(inp), _ptr(out), inp.numel(), dt, r)
        calls, keep = self._coalesced_calls(what, list(zip(inputs, outputs)), issue)
        return self._issue(what, None, keep, list(outputs), calls=calls)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """reduce_scatter_tensor for each (output, input) pair, issued back
        to back (functional collectives' reduce_scatter_tensor_coalesced,
        _coalescing_manager)."""
        what = "reduce_scatter_tensor_coalesced"
        if len(outputs) != len(inputs):
            raise ValueError("gorun %s: %d outputs for %d inputs" % (what, len(outputs), len(inputs)))
        n = self.size()

        def issue(inp, out, dt, i):
            op = _op(opts, what, dt & 0xff)
            if inp.numel() != out.numel() * n:
                raise ValueError("gorun %s: inputs[%d] has %d elements, want %d (output %d × group of %d)"
                                 % (what, i, inp.numel(), out.numel() * n, out.numel(), n))
            return lambda l, r: l.gorun_reduce_scatter(self._h, _ptr(inp), _ptr(out), out.numel(), dt, op, r)
        calls, keep = self._coalesced_calls(what, list(zip(inputs, outputs)), issue)
        return self._issue(what, None, keep, list(outputs), calls=calls)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """dist.all_gather_coalesced: output_lists[r][j] receives input j of
        group rank r (torch's layout: one list per rank, as gloo fills it)."""
        what = "all_gather_coalesced"
        n = self.size()
        if len(output_lists) != n:
            raise ValueError("gorun %s: %d output lists for a group of %d (one list per rank)"
                             % (what, len(output_lists), n))
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError("gorun %s: output list %d has %d tensors for %d inputs"
                                 % (what, r, len(outs), len(input_list)))
        calls, keep, posts = [], [], []
        for j, inp in enumerate(input_list):
            dt = _check(inp, what, "input[%d]" % j) | _label(what)
            outs = [output_lists[r][j] for r in range(n)]
            flat, post, ptr = self._gather_out(outs, inp, what)
            k = inp.numel()
            calls.append((lambda inp, ptr, k, dt: lambda l, r: l.gorun_allgather(
                self._h, _ptr(inp), ctypes.c_void_p(ptr) if k else None, k, dt, r))(inp, ptr, k, dt))
            keep += [inp, flat] + list(outs)
            if post:
                posts.append(post)
        return self._issue(what, None, keep, output_lists, (lambda: [p() for p in posts]) if posts else None,
                           calls=calls)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        what = "reduce_scatter"
        out = _one(output_tensors, what, "output_tensors")
        ins = _one(input_tensors, what, "input_tensors")
        dt = _check(out, what, "output")
        op = _op(opts, what, dt)
        n, k = self.size(), out.numel()
        if len(ins) != n:
            raise ValueError("gorun %s: input list has %d tensors for a group of %d" % (what, len(ins), n))
        for i, t in enumerate(ins):
            _check(t, what, "input[%d]" % i)
            _same(out, t, what, "output", "input[%d]" % i)
            if t.numel() != k:
                raise ValueError("gorun %s: input[%d] has %d elements but output has %d" % (what, i, t.numel(), k))
        flat = torch.cat([t.view(-1) for t in ins]) if n > 1 else ins[0].reshape(-1)
        dt |= _label(what)
        return self._issue(what, lambda l, r: l.gorun_reduce_scatter(self._h, _ptr(flat), _ptr(out), k, dt, op, r),
                           [flat, out], [out])

    def reduce_scatter_single(self, output, input, opts=None):
        what = "reduce_scatter_tensor"
        dt = _check(output, what, "output")
        _check(input, what, "input")
        _same(output, input, what, "output", "input")
        op = _op(opts, what, dt)
        if input.numel() != output.numel() * self.size():
            raise ValueError("gorun %s: input has %d elements, want %d (output %d × group of %d)"
                             % (what, input.numel(), output.numel() * self.size(), output.numel(), self.size()))
        dt |= _label(what)
        return self._issue(what, lambda l, r: l.gorun_reduce_scatter(self._h, _ptr(input), _ptr(output),
                                                                     output.numel(), dt, op, r),
                           [input, output], [output])

    _reduce_scatter_base = reduce_scatter_single  # older torch's name

    def gather(self, output_tensors, input_tensors, opts=None):
        what = "gather"
        inp = _one(input_tensors, what, "input_tensors")
        dt = _check(inp, what, "input")
        root = opts.rootRank if opts is not None else 0
        self._root(root, what)
        k = inp.numel()
        if self.rank() == root:
            outs = _one(output_tensors, what, "output_tensors")
            flat, post, ptr = self._gather_out(outs, inp, what)
            keep = [inp, flat] + list(outs)
            recv = ctypes.c_void_p(ptr) if k else None
        else:
            if output_tensors and any(len(o) for o in output_tensors):
                raise ValueError("gorun %s: output tensors given on rank %d, which is not the root %d"
                                 % (what, self.rank(), root))
            post, keep, recv, outs = None, [inp], None, []
        dt |= _label(what)
        return self._issue(what, lambda l, r: l.gorun_gather(self._h, _ptr(inp), recv, k, dt, root, r),
                           keep, [outs] if outs else [], post)

    def scatter(self, output_tensors, input_tensors, opts=None):
        what = "scatter"
        out = _one(output_tensors, what, "output_tensors")
        dt = _check(out, what, "output")
        root = opts.rootRank if opts is not None else 0
        self._root(root, what)
        k = out.numel()
        if self.rank() == root:
            ins = _one(input_tensors, what, "input_tensors")
            if len(ins) != self.size():
                raise ValueError("gorun %s: input list has %d tensors for a group of %d" % (what, len(ins), self.size()))
            for i, t in enumerate(ins):
                _check(t, what, "input[%d]" % i)
                _same(out, t, what, "output", "input[%d]" % i)
                if t.numel() != k:
                    raise ValueError("gorun %s: input[%d] has %d elements but output has %d" % (what, i, t.numel(), k))
            flat = torch.cat([t.view(-1) for t in ins])
            send, keep = _ptr(flat), [flat, out]
        else:
            if input_tensors and any(len(i) for i in input_tensors):
                raise ValueError("gorun %s: input tensors given on rank %d, which is not the root %d"
                                 % (what, self.rank(), root))
            send, keep = None, [out]
        dt |= _label(what)
        return self._issue(what, lambda l, r: l.gorun_scatter(self._h, send, _ptr(out), k, dt, root, r),
                           keep, [out])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        what = "all_to_all_single"
        orig, input, output = output, _bytes(input), _bytes(output)
        dt = _check(input, what, "input")
        _check(output, what, "output")
        _same(input, output, what, "input", "output")
        n = self.size()

        def counts(t, splits, name):
            rows = t.shape[0] if t.dim() else 1
            per_row = t.numel() // rows if rows else 0
            if not splits:
                if rows % n:
                    raise ValueError("gorun %s: %s has %d rows, not divisible by the group of %d (give split sizes)"
                                     % (what, name, rows, n))
                return [rows // n * per_row] * n
            if len(splits) != n:
                raise ValueError("gorun %s: %d %s split sizes for a group of %d" % (what, len(splits), name, n))
            if sum(splits) != rows or any(s < 0 for s in splits):
                raise ValueError("gorun %s: %s split sizes %s do not add up to its %d rows"
                                 % (what, name, list(splits), rows))
            return [s * per_row for s in splits]
        sc = counts(input, input_split_sizes, "input")
        rcs = counts(output, output_split_sizes, "output")
        dt |= _label(what)
        if not input_split_sizes and not output_split_sizes:
            if input.numel() != output.numel():
                raise ValueError("gorun %s: input has %d elements but output %d" % (what, input.numel(), output.numel()))
            return self._issue(what, lambda l, r: l.gorun_alltoall(self._h, _ptr(input), _ptr(output), input.numel(),
                                                                   dt, r),
                               [input, output], [orig])
        sca, rca = (ctypes.c_size_t * n)(*sc), (ctypes.c_size_t * n)(*rcs)
        return self._issue(what, lambda l, r: l.gorun_alltoallv(self._h, _ptr(input), sca, _ptr(output), rca, dt, r),
                           [input, output, sca, rca], [orig])

    alltoall_base = all_to_all_single  # older torch's name

    def alltoall(self, output_tensors, input_tensors, opts=None):
        what = "all_to_all"
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError("gorun %s: %d outputs and %d inputs for a group of %d"
                             % (what, len(output_tensors), len(input_tensors), n))
        dt = None
        for i, t in enumerate(list(input_tensors) + list(output_tensors)):
            d = _check(t, what, "tensor %d" % i)
            if dt is not None and d != dt:
                raise TypeError("gorun %s: tensors of different dtypes (%s)" % (what, t.dtype))
            dt = d
        sc = [t.numel() for t in input_tensors]
        rcs = [t.numel() for t in output_tensors]
        flat_in = torch.cat([t.view(-1) for t in input_tensors])
        flat_out = torch.empty(sum(rcs), dtype=output_tensors[0].dtype)
        sca, rca = (ctypes.c_size_t * n)(*sc), (ctypes.c_size_t * n)(*rcs)
        dt |= _label(what)

        def post():
            off = 0
            for t, c in zip(output_tensors, rcs):
                t.view(-1).copy_(flat_out[off:off + c])
                off += c
        return self._issue(what, lambda l, r: l.gorun_alltoallv(self._h, _ptr(flat_in), sca, _ptr(flat_out), rca,
                                                                dt, r),
                           [flat_in, flat_out, sca, rca] + list(output_tensors), list(output_tensors), post)

    def barrier(self, opts=None):
        return self._issue("barrier", lambda l, r: l.gorun_barrier(self._h, r), [], [])

    def _p2p(self, tensors, peer, what, fn, src, dst):
        """A send or receive runs on the channel of its direction (src → dst,
        group ranks): a two-rank communicator of its own, so that sends and
        receives between different pairs, or in opposite directions, never
        wait for each other (a ring of isend + irecv on every rank would
        deadlock in one queue once messages outgrow the transport's
        buffers). Sends from one rank to another stay in order."""
        t = _bytes(_one(tensors, what))
        dt = _check(t, what)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError("gorun %s: peer %d (this is rank %d of %d)" % (what, peer, self.rank(), self.size()))
        ch = self._channel(src, dst)
        other = 1 if src == self.rank() else 0  # the peer's rank in the two-rank channel
        n = t.numel()

        def issue(l, r, h):
            return fn(l)(h, _ptr(t), n, dt, other, r)
        return ch.submit(self, what, issue, t)

    def _channel(self, src, dst):
        key = (src, dst)
        ch = self._channels.get(key)
        if ch is None:
            ch = self._channels.setdefault(key, _Channel(self, src, dst))
        return ch

    def send(self, tensors, dstRank, tag=0):
        return self._p2p(tensors, dstRank, "send", lambda l: l.gorun_send, self.rank(), dstRank)

    def recv(self, tensors, srcRank, tag=0):
        if self._matcher is not None:
            if not 0 <= srcRank < self.size() or srcRank == self.rank():
                raise ValueError("gorun recv: peer %d (this is rank %d of %d)" % (srcRank, self.rank(), self.size()))
            return self._recv_matched(tensors, srcRank, "recv")
        return self._p2p(tensors, srcRank, "recv", lambda l: l.gorun_recv, srcRank, self.rank())

    def recv_anysource(self, tensors, tag=0):
        what = "recv from any source"
        if self._owner is None and isinstance(self, _C10dBackend) and _called_by_dist_recv():
            # A group with a backend per device ("cpu:gorun,cuda:nccl"):
            # torch hands this Backend's Work to dist.recv in a holder
            # without its source rank, so dist.recv would receive the
            # message and then fail on asking for the sender (torch 2.15:
            # "sourceRank() may only be called on work objects that
            # correspond to a recv or recv-from-any call"). Refused before
            # any message is taken. dist.irecv without src works: its data
            # arrives; only its Work's _source_rank() fails so.
            raise ValueError("gorun %s: dist.recv without src on a group with a backend per device (\"cpu:gorun,"
                             "...\"): torch returns a Python backend's Work to dist.recv without the sender's rank, "
                             "so the sender cannot be reported; give src=, or use a group whose backend is "
                             "\"gorun\" alone" % what)
        return self._recv_matched(tensors, -1, what)

    def _recv_matched(self, tensors, src, what):
        """A receive through the group's matcher (libgorun's, over the
        channels into this rank): from any source (src -1) or, once one
        such receive was made, every receive, so that a message goes to the
        first receive posted that accepts its sender, as MPI and gloo match
        them. The matcher is made at the first receive from any source and
        takes each channel into this rank as it connects (one per other
        rank, connected now: a sender's channel is made at its first send)."""
        t = _bytes(_one(tensors, what))
        dt = _check(t, what)
        m = self._ensure_matcher()
        w = GorunWork(self, what, [], [t], [t])
        w._anysource = True
        r = ctypes.c_int64()
        rc = self._l.gorun_matcher_recv(m, _ptr(t), t.numel(), dt, src, ctypes.byref(r))
        if rc != _lib.OK:
            w._finish(_lib.error(rc, "gorun %s" % what))
            return w
        w._reqs.append(r.value)
        return w

    def _ensure_matcher(self):
        with self._matcher_mu:
            if self._matcher is not None:
                return self._matcher
            m = ctypes.c_int64()
            _lib.check(self._l.gorun_matcher_new(ctypes.byref(m)), "gorun recv from any source")
            me = self.rank()
            for src in range(self.size()):
                if src != me:
                    # The sender is rank 0 of the two-rank channel.
                    self._channel(src, me).when_ready(
                        lambda h, src=src: self._l.gorun_matcher_add(m.value, src, h, 0))
            self._matcher = m.value
            return m.value


class GorunBackend(_Gorun, _C10dBackend):
    """gorun as a c10d Backend: torch puts it into a ProcessGroup of its own
    for the CPU device, which is what "cpu:gorun,cuda:nccl" needs (CUDA
    tensors go to NCCL's backend in the same group). torch 2.15 hands
    the Works of a Python Backend to the caller wrapped in a holder that
    forwards wait() and get_future() only, so is_completed() stays False:
    wait() or the future is how to learn that a call is done."""

    def __init__(self, handle, rank, size, ranks, timeout, store=None, wait_ms=0, world=False, owner=None):
        _C10dBackend.__init__(self, rank, size)
        self._setup(handle, ranks, timeout, store, wait_ms, world, owner)


class ProcessGroupGorun(_Gorun, ProcessGroup):
    """gorun as the whole ProcessGroup ("gorun" alone): torch calls its
    methods directly, so every Work is gorun's own (wait, is_completed,
    is_success, exception, get_future). A GorunBackend on the same
    communicator is registered for the CPU device, for torch code that asks
    the group for its backend."""

    def __init__(self, handle, rank, size, ranks, timeout, store=None, wait_ms=0, world=False):
        ProcessGroup.__init__(self, rank, size)
        self._setup(handle, ranks, timeout, store, wait_ms, world)
        self._backend = GorunBackend(handle, rank, size, ranks, timeout, None, wait_ms, world, owner=self)
        self._register_backend(torch.device("cpu"), ProcessGroup.BackendType.CUSTOM, self._backend)
        self._set_default_backend(ProcessGroup.BackendType.CUSTOM)

    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND


def _create(opts, pg_options):
    """The backend's creator (torch's extended API), called on a new
    group's members only: the world for the default group, a subgroup of
    the given world ranks otherwise.

    With gorun as the default group, gorun's world spans every rank (rank
    and size as torch passed them) and subgroups are carved out of it. With
    another default backend (gloo), the first gorun group becomes gorun's
    world: all of torch's ranks if it has them all, otherwise its members
    alone; later gorun groups must then lie within it (gorun's world cannot
    grow, and the ranks outside it never ran this code to join).

    deterministic and tcp are the world's settings; a subgroup may have a
    timeout of its own (ProcessGroupGorun's wait_ms)."""
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError("gorun: pg_options must be a gorun.Options, not %s" % type(pg_options).__name__)
    options = pg_options if pg_options is not None else Options()
    cls = _shape(sys._getframe(1))
    ranks = list(opts.global_ranks_in_group)
    l = _lib.lib()
    if not ranks:
        world = _init_world(opts.store, opts.group_rank, opts.group_size, options, opts.timeout)
        return _world_backend(cls, world, opts)
    if _world is None:
        # The default group has another backend: this group founds gorun's world.
        everyone = ranks == list(range(dist.get_world_size()))
        world = _init_world(opts.store, opts.group_rank, opts.group_size, options, opts.timeout,
                            members=None if everyone else ranks)
        return _world_backend(cls, world, opts)
    want, have = _world_settings(options.config(None)), _world_settings(_world_config)
    if options.connect_timeout is None:
        want.pop("connect_timeout_ms", None)
        have.pop("connect_timeout_ms", None)
    if want != have:
        show = lambda d: " ".join("%s=%s" % kv for kv in sorted(d.items()))
        raise GorunError("gorun new_group %s: options %r differ from gorun's world's (%s); deterministic, tcp and "
                         "connect_timeout are set once for the world (the first gorun group), only the timeout may "
                         "differ" % (ranks, show(want), show(have)), "GORUN_ERR_INVALID")
    members = _world_members
    if members is not None:
        outside = [r for r in ranks if r not in members]
        if outside:
            raise GorunError("gorun new_group %s: ranks %s are outside gorun's world %s. The default group "
                             "is not gorun, so the first gorun group (%s) became gorun's world; make the "
                             "first gorun group span every rank (dist.new_group(backend=\"gorun\")) or "
                             "init_process_group(\"gorun\")" % (ranks, outside, members, members),
                             "GORUN_ERR_INVALID")
        ranks = [members.index(r) for r in ranks]
    arr = (ctypes.c_int * len(ranks))(*ranks)
    h = ctypes.c_int64()
    _lib.check(l.gorun_comm_group(_world, arr, len(ranks), ("torch-group-" + str(opts.group_id)).encode(),
                                  ctypes.byref(h)), "gorun new_group %s" % ranks)
    ms = _timeout_ms(opts.timeout)
    return cls(h.value, opts.group_rank, opts.group_size, ranks, opts.timeout, opts.store,
               wait_ms=ms if ms and ms != _world_timeout_ms else 0)


def _world_settings(cfg):
    """A config string's world-wide settings (all but the timeout) as a dict."""
    d = dict(kv.split("=", 1) for kv in cfg.split())
    d.pop("timeout_ms", None)
    return d


def _shape(frame):
    """ProcessGroupGorun when the group being made has gorun for every
    device ("gorun"), GorunBackend when it has other backends for other
    devices ("cpu:gorun,cuda:nccl"): a Python ProcessGroup would replace
    the whole group. The device map is torch's _new_process_group_helper's
    backend_config (the frame that calls the creator)."""
    cfg = frame.f_locals.get("backend_config") if frame is not None else None
    try:
        backends = set(cfg.get_device_backend_map().values())
    except AttributeError:
        return ProcessGroupGorun
    return ProcessGroupGorun if backends == {BACKEND} else GorunBackend


def _world_backend(cls, world, opts):
    """The backend of the group that founded gorun's world."""
    l = _lib.lib()
    wr, ws = ctypes.c_int(), ctypes.c_int()
    _lib.check(l.gorun_comm_rank(world, ctypes.byref(wr)))
    _lib.check(l.gorun_comm_size(world, ctypes.byref(ws)))
    if (wr.value, ws.value) != (opts.group_rank, opts.group_size):
        raise GorunError("gorun: torch says rank %d of %d but gorun's world has this process as rank %d of %d"
                         % (opts.group_rank, opts.group_size, wr.value, ws.value), "GORUN_ERR_INIT")
    return cls(world, wr.value, ws.value, list(range(ws.value)), opts.timeout, opts.store, world=True)


def register():
    """Registers the "gorun" backend with torch.distributed (idempotent)
    for CPU tensors: "gorun" alone, or "cpu:gorun,cuda:nccl"."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
