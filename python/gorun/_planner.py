"""The planner of ``gorun plan`` through libgorun's gorun_plan (gorun.h).

One function: a step graph (a dict or JSON text of schema
gorun.stepgraph/v1) and options in, the plan out as a dict with "plan",
"graph" (when the passes rewrote it), "text", "buckets_hash" and "hash".
Planning needs no gorun_init and no other rank: it is pure, so every rank
that plans the same graph with the same options gets the same "hash".
"""

import ctypes
import json

from . import _lib

_configured = set()


def _fn(l):
    # Signatures are set once per loaded library (a fork-safe reload gets a
    # new CDLL object).
    if id(l) not in _configured:
        l.gorun_plan.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                 ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        l.gorun_plan.restype = ctypes.c_int
        l.gorun_plan_free.argtypes = [ctypes.c_void_p]
        l.gorun_plan_free.restype = None
        _configured.add(id(l))
    return l


def plan(graph, passes=None, **options):
    """Plans ``graph`` (a dict, or str/bytes of JSON) and returns the result
    dict. ``passes`` is "reshard,chunk,blocks,overlap"-style text or a list
    (None: gorun plan's defaults); further keyword options are gorun_plan's
    keys (cap_bytes, min_bytes, peak_budget_bytes, chunk_regions, ...).
    Raises GorunError (status GORUN_ERR_INVALID) naming what was wrong."""
    if isinstance(graph, dict):
        data = json.dumps(graph).encode()
    elif isinstance(graph, str):
        data = graph.encode()
    else:
        data = bytes(graph)
    if passes is not None:
        options["passes"] = passes
    opts = json.dumps(options).encode()
    l = _fn(_lib.lib())
    out = ctypes.c_void_p()
    n = ctypes.c_size_t()
    rc = l.gorun_plan(data, len(data), opts, ctypes.byref(out), ctypes.byref(n))
    _lib.check(rc, "gorun_plan")
    try:
        text = ctypes.string_at(out.value, n.value)
    finally:
        l.gorun_plan_free(out)
    return json.loads(text)
