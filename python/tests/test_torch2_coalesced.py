"""All-reduce of several tensors as one library call: dist.all_reduce_coalesced,
the _coalescing_manager's all-reduces (with and without a device, sync and
async) and the functional collectives' all_reduce_coalesced reach
gorun_allreduce_coalesced once, as one request and one Work, and give
gloo's results.

The rank program (this file run under gorun) counts the group's library
calls by name through a proxy around its ctypes library, and compares every
result with the same call on a gloo group of the same ranks. Results are
compared bitwise, except float sums and products on more than two ranks:
of two operands the result is the same whatever the order, but gloo and
gorun combine three or more in different orders (float arithmetic is not
associative), so those get a tolerance of 1e-5 (float32) / 1e-12
(float64) absolute and relative, well above the few ulps by which the
orders differ for N(0, 1) values over 4 ranks.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.abspath(__file__)


@pytest.mark.parametrize("np", [2, 4])
def test_allreduce_coalesced_is_one_library_call_with_gloos_results(launcher, np):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(HERE), "..") + os.pathsep + os.path.dirname(HERE),
               GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run([launcher.gorun, "-np", str(np), "--timeout", "150s", sys.executable, HERE], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-6000:]
    missing = [r for r in range(np) if "RANK %d: coalesced ok" % r not in out]
    assert not missing, "ranks %s did not finish:\n%s" % (missing, out[-6000:])


# ---- the rank program ----------------------------------------------------------

class Counting:
    """Stands in for a group's ctypes library: counts each gorun_* call by
    name (and the n of each gorun_allreduce_coalesced) and forwards it."""

    def __init__(self, lib):
        self._lib = lib
        self.calls = {}
        self.ns = []

    def __getattr__(self, name):
        f = getattr(self._lib, name)

        def call(*args):
            if name.startswith("gorun_") and name not in ("gorun_wait", "gorun_test", "gorun_request_free",
                                                           "gorun_last_error", "gorun_last_error_rank",
                                                           "gorun_status_name"):
                self.calls[name] = self.calls.get(name, 0) + 1
                if name == "gorun_allreduce_coalesced":
                    self.ns.append(args[4])
            return f(*args)
        return call

    def take(self):
        c, n = self.calls, self.ns
        self.calls, self.ns = {}, []
        return c, n


def main():
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.distributed_c10d import _coalescing_manager

    import gorun  # noqa: F401 (registers the backend)
    from gorun.backend import GorunWork

    dist.init_process_group("gorun")
    rank, n = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    counters = []
    for obj in (pg, pg._backend):  # ProcessGroupGorun, and the Backend the C++ callers reach
        c = Counting(obj._l)
        obj._l = c
        counters.append(c)

    def say(*a):
        print("RANK %d:" % rank, *a, flush=True)

    def taken():
        calls, ns = {}, []
        for c in counters:
            cc, nn = c.take()
            for k, v in cc.items():
                calls[k] = calls.get(k, 0) + v
            ns += nn
        return calls, ns

    def one_call(what, k):
        calls, ns = taken()
        if calls != {"gorun_allreduce_coalesced": 1} or ns != [k]:
            raise AssertionError("%s: library calls %s (n %s), want one gorun_allreduce_coalesced of %d"
                                 % (what, calls, ns, k))

    def same(got, want, what):
        for i, (g, w) in enumerate(zip(got, want)):
            if g.dtype.is_floating_point and n > 2 and what.endswith(("SUM", "PRODUCT")):
                torch.testing.assert_close(g, w, rtol=1e-5 if g.dtype == torch.float32 else 1e-12,
                                           atol=1e-5 if g.dtype == torch.float32 else 1e-12,
                                           msg=lambda m: "%s tensors[%d]: %s" % (what, i, m))
            elif not (g.shape == w.shape and torch.equal(g.view(torch.uint8) if g.numel() else g,
                                                         w.view(torch.uint8) if w.numel() else w)):
                raise AssertionError("%s tensors[%d]: got %s, want %s (gloo)" % (what, i, g[:8].tolist(),
                                                                                  w[:8].tolist()))

    # Sizes: empty, tiny, 1 KiB of float32, and one past the library's
    # fusion limit, so that fused and unfused vectors share one call.
    sizes = [0, 1, 3, 256, 1000, 70000]
    gen = torch.Generator().manual_seed(1234 + rank)

    def inputs(dtype):
        if dtype.is_floating_point:
            return [torch.randn(k, generator=gen, dtype=torch.float64).to(dtype) for k in sizes]
        return [torch.randint(-50, 50, (k,), generator=gen, dtype=dtype) for k in sizes]

    ops = {"SUM": dist.ReduceOp.SUM, "MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN,
           "PRODUCT": dist.ReduceOp.PRODUCT}
    k = len(sizes)
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for opname, op in ops.items():
            what = "%s %s" % (str(dtype).split(".")[-1], opname)
            x = inputs(dtype)
            ref = [t.clone() for t in x]
            dist.all_reduce_coalesced(ref, op, group=gloo)
            taken()  # gloo's calls do not touch gorun's library; drop nothing of ours
            got = [t.clone() for t in x]
            dist.all_reduce_coalesced(got, op)
            one_call("all_reduce_coalesced " + what, k)
            same(got, ref, "all_reduce_coalesced " + what)
            # async: a future of one Work of one request (dist's function
            # hands out the future; the group's call gives the Work)
            got = [t.clone() for t in x]
            dist.all_reduce_coalesced(got, op, async_op=True).wait()
            one_call("all_reduce_coalesced async_op " + what, k)
            same(got, ref, "all_reduce_coalesced async_op " + what)
            got = [t.clone() for t in x]
            opts = dist.AllreduceCoalescedOptions()
            opts.reduceOp = op
            w = pg.allreduce_coalesced(got, opts)
            if not isinstance(w, GorunWork) or len(w._reqs) != 1:
                raise AssertionError("all_reduce_coalesced async %s: Work %r with requests %s, want one GorunWork "
                                     "of one request" % (what, w, getattr(w, "_reqs", None)))
            w.wait()
            one_call("allreduce_coalesced Work " + what, k)
            same(got, ref, "allreduce_coalesced Work " + what)
            # the coalescing manager: all-reduces one by one become one call
            for device in (None, torch.device("cpu")):
                for async_ops in (False, True):
                    how = "_coalescing_manager(device=%s, async_ops=%s) %s" % (device, async_ops, what)
                    got = [t.clone() for t in x]
                    with _coalescing_manager(group=pg, device=device, async_ops=async_ops) as cm:
                        for t in got:
                            dist.all_reduce(t, op)
                    if async_ops:
                        cm.wait()
                    one_call(how, k)
                    same(got, ref, how)
        # the functional collectives (what compiled code and DTensor call)
        if dtype.is_floating_point:
            x = inputs(dtype)
            ref = [t.clone() for t in x]
            dist.all_reduce_coalesced(ref, group=gloo)
            taken()
            outs = funcol.all_reduce_coalesced(x, "sum", pg)
            outs = [funcol.wait_tensor(o) for o in outs]
            one_call("funcol all_reduce_coalesced %s SUM" % dtype, k)
            same(outs, ref, "funcol %s SUM" % str(dtype).split(".")[-1])

    # The bench's shape (64 x 1 KiB) and mixed sizes: bitwise the results
    # of the same tensors all-reduced one call at a time through gorun
    # (fusion and the one-pass argument check change no bit, at any rank
    # count), and the tensors are reduced in place.
    for shape in ([256] * 64, [1, 0, 300, 256, 5000, 7] * 8):
        for dtype in (torch.float32, torch.bfloat16):
            x = [torch.randn(k, generator=gen).to(dtype) for k in shape]
            ref = [t.clone() for t in x]
            for t in ref:
                dist.all_reduce(t)
            taken()
            got = [t.clone() for t in x]
            ids = [t.data_ptr() for t in got]
            dist.all_reduce_coalesced(got)
            one_call("all_reduce_coalesced of %d (%s)" % (len(shape), dtype), len(shape))
            for i, (g, w) in enumerate(zip(got, ref)):
                if not torch.equal(g.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                   w.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)):
                    raise AssertionError("all_reduce_coalesced of %d %s: tensors[%d] differs from one call at a "
                                         "time: %s vs %s" % (len(shape), dtype, i, g[:4].tolist(), w[:4].tolist()))
            if [t.data_ptr() for t in got] != ids:
                raise AssertionError("all_reduce_coalesced replaced tensors instead of reducing them in place")

    # Bad arguments reaching the group (torch's function checks dtypes
    # itself; C++ callers and the coalescing manager do not): errors naming
    # the call and the tensor, before anything is sent. Each bad tensor sits
    # among 64 good ones at the first, a middle and the last place, so that
    # no position is skipped by the one-pass check.
    def freed():
        t = torch.ones(4)
        t.untyped_storage().resize_(0)  # as FSDP frees a parameter's storage
        return t

    bad = (("float64", lambda: torch.ones(2, dtype=torch.float64), TypeError, "float64"),
           ("meta", lambda: torch.ones(2, device="meta"), ValueError, "meta"),
           ("strided view", lambda: torch.ones(4)[::2], ValueError, "not contiguous"),
           ("transposed", lambda: torch.ones(3, 2).t(), ValueError, "not contiguous"),
           ("sparse", lambda: torch.ones(2).to_sparse(), ValueError, "layout"),
           ("complex", lambda: torch.ones(2, dtype=torch.complex64), TypeError, "complex64"),
           ("not a tensor", lambda: [1.0, 2.0], TypeError, "not a tensor"),
           ("freed storage", freed, ValueError, "no memory"))
    for label, make, err, words in bad:
        for at in (0, 31, 63):
            args = [torch.ones(2) for _ in range(64)]
            args[at] = make()
            try:
                pg.allreduce_coalesced(args)
            except err as e:
                if "allreduce_coalesced" not in str(e) or words not in str(e) or "tensors[%d]" % at not in str(e):
                    raise AssertionError("bad all_reduce_coalesced (%s at %d): %r does not name the call, the "
                                         "tensor and the fault" % (label, at, e))
            else:
                raise AssertionError("all_reduce_coalesced with %s at %d returned" % (label, at))
            calls, _ = taken()
            if calls:
                raise AssertionError("a refused all_reduce_coalesced reached the library: %s" % calls)
    try:
        pg.allreduce_coalesced([])
    except ValueError as e:
        assert "allreduce_coalesced" in str(e), e
    else:
        raise AssertionError("allreduce_coalesced of no tensors returned")
    dist.barrier()
    say("coalesced ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
