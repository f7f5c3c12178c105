"""ctypes bindings of libgorun (libgorun/gorun.h), with errors as exceptions.

The library is loaded on first use, not at import, so that importing gorun
starts no Go runtime in processes that never use the backend. Go's runtime
sees only the environment the process started with; what the package learns
later (a rendezvous bootstrapped through a torch store) reaches the library
as gorun_init's env.NAME=VALUE settings.

ctypes releases the GIL for the duration of every call, so a blocking
collective does not stall the interpreter's other threads.
"""

import ctypes
import os
import threading

# gorun_status
OK = 0
ERR_INVALID = 1
ERR_PEER_LOST = 2
ERR_DESYNC = 3
ERR_TIMEOUT = 4
ERR_ABORTED = 5
ERR_CLOSED = 6
ERR_INIT = 7
ERR_INTERNAL = 8

# gorun_dtype
FLOAT32, FLOAT64, BFLOAT16, FLOAT16, INT32, INT64, UINT8, BOOL = range(1, 9)
# gorun_op
SUM, PROD, MIN, MAX, AVG = range(1, 6)

ABI_VERSION = 1

ENV_LIB = "GORUN_LIB"


class GorunError(RuntimeError):
    """A failed gorun call. ``status`` is the gorun_status name (e.g.
    "GORUN_ERR_PEER_LOST"); ``rank`` is the world rank the failure is about
    (a lost, aborting or mismatched peer), or -1. It is a RuntimeError, like
    the errors of torch's own backends."""

    def __init__(self, message, status="GORUN_ERR_INTERNAL", rank=-1):
        super().__init__(message)
        self.status = status
        self.rank = rank


class GorunTimeout(GorunError):
    """A wait that gave up; the call itself may still be running."""


_lock = threading.Lock()
_lib = None
_pid = None


def library_path():
    """Where the library is loaded from: $GORUN_LIB, else libgorun.so next to
    this package, else next to the gorun binary of a checkout (bin/)."""
    p = os.environ.get(ENV_LIB)
    if p:
        if not os.path.isfile(p):
            raise GorunError(f"gorun: {ENV_LIB}={p}: no such file", "GORUN_ERR_INIT")
        return p
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "libgorun.so"),
                 os.path.join(here, "..", "..", "bin", "libgorun.so")):
        if os.path.isfile(cand):
            return os.path.normpath(cand)
    raise GorunError(
        "gorun: libgorun.so not found next to the gorun package (%s) or in the checkout's bin/; "
        "run `make python`, or set %s to its path" % (here, ENV_LIB), "GORUN_ERR_INIT")


def _after_fork_in_child():
    # Go's runtime does not survive fork: its threads are gone in the child.
    # Calls would hang, so refuse them (see lib()).
    global _lib
    _lib = None


os.register_at_fork(after_in_child=_after_fork_in_child)


class Forked:
    """Stands in for the library in a forked child: any call raises the
    error lib() raises there. Holders of a cached library (process groups
    keep one to skip lib() on every call) swap it in after fork."""

    def __getattr__(self, name):
        return self._refuse

    @staticmethod
    def _refuse(*args):
        lib()  # raises: this process was forked from one that loaded libgorun
        raise GorunError("gorun: unreachable: lib() accepted a forked child", "GORUN_ERR_INTERNAL")

_i64 = ctypes.c_int64
_p = ctypes.c_void_p
_int = ctypes.c_int
_sz = ctypes.c_size_t
_PI64 = ctypes.POINTER(ctypes.c_int64)

_SIGNATURES = {
    "gorun_abi_version": [],
    "gorun_init": [ctypes.c_char_p, _PI64],
    "gorun_finalize": [],
    "gorun_comm_rank": [_i64, ctypes.POINTER(_int)],
    "gorun_comm_size": [_i64, ctypes.POINTER(_int)],
    "gorun_comm_world_rank": [_i64, _int, ctypes.POINTER(_int)],
    "gorun_comm_group": [_i64, ctypes.POINTER(_int), _int, ctypes.c_char_p, _PI64],
    "gorun_comm_abort": [_i64, ctypes.c_char_p],
    "gorun_comm_free": [_i64],
    "gorun_allreduce": [_i64, _p, _p, _sz, _int, _int, _PI64],
    # sends, recvs, counts: the addresses of C arrays (backend._vectors).
    "gorun_allreduce_coalesced": [_i64, _p, _p, _p, _int, _int, _int, _PI64],
    "gorun_allgather": [_i64, _p, _p, _sz, _int, _PI64],
    "gorun_reduce_scatter": [_i64, _p, _p, _sz, _int, _int, _PI64],
    "gorun_broadcast": [_i64, _p, _p, _sz, _int, _int, _PI64],
    "gorun_reduce": [_i64, _p, _p, _sz, _int, _int, _int, _PI64],
    "gorun_gather": [_i64, _p, _p, _sz, _int, _int, _PI64],
    "gorun_scatter": [_i64, _p, _p, _sz, _int, _int, _PI64],
    "gorun_alltoall": [_i64, _p, _p, _sz, _int, _PI64],
    "gorun_alltoallv": [_i64, _p, ctypes.POINTER(_sz), _p, ctypes.POINTER(_sz), _int, _PI64],
    "gorun_barrier": [_i64, _PI64],
    "gorun_label": [ctypes.c_char_p, ctypes.POINTER(_int)],
    "gorun_send": [_i64, _p, _sz, _int, _int, _PI64],
    "gorun_recv": [_i64, _p, _sz, _int, _int, _PI64],
    "gorun_matcher_new": [_PI64],
    "gorun_matcher_add": [_i64, _int, _i64, _int],
    "gorun_matcher_recv": [_i64, _p, _sz, _int, _int, _PI64],
    "gorun_matcher_free": [_i64],
    "gorun_request_source": [_i64, ctypes.POINTER(_int)],
    "gorun_test": [_i64, ctypes.POINTER(_int)],
    "gorun_wait": [_i64, _i64],
    "gorun_request_free": [_i64],
    "gorun_last_error": [],
    "gorun_last_error_rank": [],
    "gorun_status_name": [_int],
}


def lib():
    """The loaded library (loading it on first use)."""
    global _lib, _pid
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        if _pid is not None and _pid != os.getpid():
            raise GorunError(
                "gorun: this process was forked from one that loaded libgorun; Go's runtime does not "
                "survive fork, so the child cannot use gorun (use the 'spawn' start method for "
                "processes that need it)", "GORUN_ERR_INIT")
        path = library_path()
        l = ctypes.CDLL(path)
        for name, args in _SIGNATURES.items():
            try:
                f = getattr(l, name)
            except AttributeError:
                raise GorunError(f"gorun: {path} has no {name}: the library is older than this package "
                                 "(rebuild it: make lib)", "GORUN_ERR_INIT") from None
            f.argtypes = args
            f.restype = _int
        l.gorun_last_error.restype = ctypes.c_char_p
        l.gorun_status_name.restype = ctypes.c_char_p
        v = l.gorun_abi_version()
        if v != ABI_VERSION:
            raise GorunError(f"gorun: {path} has ABI version {v}, this package needs {ABI_VERSION}",
                             "GORUN_ERR_INIT")
        _pid = os.getpid()
        _lib = l
        return l


def loaded():
    return _lib is not None


def status_name(rc):
    return lib().gorun_status_name(rc).decode()


def error(rc, what=""):
    """The exception for status rc, with the calling thread's error text (the
    text is thread-local in the library, so call this on the failing thread,
    right after the failing call)."""
    l = lib()
    text = (l.gorun_last_error() or b"").decode(errors="replace")
    rank = l.gorun_last_error_rank()
    name = status_name(rc)
    msg = text or name
    if what:
        msg = f"{what}: {msg}"
    if rc == ERR_TIMEOUT:
        return GorunTimeout(msg, name, rank)
    return GorunError(msg, name, rank)


def check(rc, what=""):
    if rc != OK:
        raise error(rc, what)
