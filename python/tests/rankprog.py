"""The rank program of the pytest suite: run under gorun as
``python3 rankprog.py CASE [ARGS]``. Each case checks on every rank and
prints "RANK r: CASE ok" at the end; a failed check raises (non-zero exit).

Inputs are small integers, so that every reduction has one exact answer that
each rank computes alone (the reference) in every dtype, float16 and
bfloat16 included.
"""

import datetime
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gorun

# The suite tests this checkout's package, never one `make python` (a .pth
# file) or anything else put on the path: conftest.py sets PYTHONPATH.
_HERE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gorun"))
if os.path.dirname(os.path.abspath(gorun.__file__)) != _HERE:
    raise SystemExit("rankprog: imported gorun from %s, not this checkout's %s" % (gorun.__file__, _HERE))

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64,
          torch.uint8, torch.bool]
OPS = [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]
COUNTS = [1, 7, 1000]


def say(*a):
    print("RANK %d:" % dist.get_rank(), *a, flush=True)


def value(rank, n, dtype, salt=0):
    """Rank's input: small integers (0/1 for bool), different per rank."""
    base = (torch.arange(n) + salt) % 5 + rank + 1
    if dtype == torch.bool:
        return ((torch.arange(n) + rank + salt) % 3 == 0)
    return base.to(dtype)


def reference(op, dtype, inputs):
    n = len(inputs)
    if dtype == torch.bool:
        s = torch.stack(inputs)
        if op in (R.SUM, R.MAX):
            return s.any(0)
        return s.all(0)
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    s = torch.stack([t.to(wide) for t in inputs])
    if op == R.SUM:
        out = s.sum(0)
    elif op == R.PRODUCT:
        out = s.prod(0)
    elif op == R.MIN:
        out = s.min(0).values
    elif op == R.MAX:
        out = s.max(0).values
    elif op == R.AVG:
        out = s.sum(0) / n if dtype.is_floating_point else torch.div(s.sum(0), n, rounding_mode="trunc")
    if dtype == torch.uint8:
        out = out % 256  # uint8 products wrap, like the tensor's own arithmetic
    return out.to(dtype)


def same(got, want, what):
    if got.dtype.is_floating_point:
        ok = torch.allclose(got.double(), want.double(), rtol=1e-3 if got.element_size() == 2 else 1e-6)
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError("%s: got %s, want %s" % (what, got[:8], want[:8]))


def check_allreduce(rank, n):
    for dtype in DTYPES:
        for op in OPS:
            for count in COUNTS:
                what = "all_reduce %s %s count=%d" % (dtype, op, count)
                t = value(rank, count, dtype)
                if dtype == torch.bool and op == R.AVG:
                    try:
                        dist.all_reduce(t, op=op)
                    except ValueError as e:
                        assert "AVG" in str(e) and "bool" in str(e), e
                        continue
                    raise AssertionError("AVG of bool did not raise")
                dist.all_reduce(t, op=op)
                same(t, reference(op, dtype, [value(r, count, dtype) for r in range(n)]), what)
    # a large message takes the bandwidth path (segments, ring)
    t = value(rank, 300_001, torch.float32)
    dist.all_reduce(t)
    same(t, reference(R.SUM, torch.float32, [value(r, 300_001, torch.float32) for r in range(n)]), "big all_reduce")
    if n > 2:
        # a share of at least half a shared-memory ring per rank: gorun's
        # worker runs it, not this thread (comm's handsOff)
        c = n * (1 << 19) + 3
        t = value(rank, c, torch.float32)
        dist.all_reduce(t)
        same(t, reference(R.SUM, torch.float32, [value(r, c, torch.float32) for r in range(n)]), "handed-over all_reduce")
    # coalesced
    ts = [value(rank, c, torch.float64, salt=c) for c in (3, 50, 1)]
    dist.all_reduce_coalesced(ts, op=R.MAX)
    for t, c in zip(ts, (3, 50, 1)):
        same(t, reference(R.MAX, torch.float64, [value(r, c, torch.float64, salt=c) for r in range(n)]), "coalesced")


def check_others(rank, n):
    for dtype in DTYPES:
        k = 5
        # broadcast from every root
        for root in range(n):
            t = value(rank, k, dtype)
            dist.broadcast(t, root)
            same(t, value(root, k, dtype), "broadcast %s root %d" % (dtype, root))
        # all_gather (list) and all_gather_into_tensor
        outs = [torch.empty(k, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, value(rank, k, dtype))
        for r in range(n):
            same(outs[r], value(r, k, dtype), "all_gather %s block %d" % (dtype, r))
        out = torch.empty(n * k, dtype=dtype)
        dist.all_gather_into_tensor(out, value(rank, k, dtype))
        same(out, torch.cat([value(r, k, dtype) for r in range(n)]), "all_gather_into_tensor %s" % dtype)
        # gather and scatter to/from the last rank
        root = n - 1
        gl = [torch.empty(k, dtype=dtype) for _ in range(n)] if rank == root else None
        dist.gather(value(rank, k, dtype), gl, dst=root)
        if rank == root:
            for r in range(n):
                same(gl[r], value(r, k, dtype), "gather %s block %d" % (dtype, r))
        o = torch.empty(k, dtype=dtype)
        dist.scatter(o, [value(r, k, dtype, salt=7) for r in range(n)] if rank == root else None, src=root)
        same(o, value(rank, k, dtype, salt=7), "scatter %s" % dtype)
        # all_to_all_single, equal blocks: block p goes to rank p
        inp = torch.cat([value(rank * n + p, 2, dtype) for p in range(n)])
        out = torch.empty(2 * n, dtype=dtype)
        dist.all_to_all_single(out, inp)
        same(out, torch.cat([value(p * n + rank, 2, dtype) for p in range(n)]), "all_to_all_single %s" % dtype)
        if dtype == torch.bool:
            continue
        for op in OPS:
            # reduce_scatter (list) and reduce_scatter_tensor
            ins = [value(rank, k, dtype, salt=p) for p in range(n)]
            o = torch.empty(k, dtype=dtype)
            dist.reduce_scatter(o, ins, op=op)
            same(o, reference(op, dtype, [value(r, k, dtype, salt=rank) for r in range(n)]), "reduce_scatter %s" % dtype)
            o = torch.empty(k, dtype=dtype)
            dist.reduce_scatter_tensor(o, torch.cat(ins), op=op)
            same(o, reference(op, dtype, [value(r, k, dtype, salt=rank) for r in range(n)]),
                 "reduce_scatter_tensor %s" % dtype)
            # reduce to rank 0
            t = value(rank, k, dtype)
            dist.reduce(t, 0, op=op)
            if rank == 0:
                same(t, reference(op, dtype, [value(r, k, dtype) for r in range(n)]), "reduce %s" % dtype)
    # all_to_all_single with splits: rank r sends p+1 rows to p (2 columns)
    inp = torch.cat([torch.full((p + 1, 2), float(rank * 10 + p)) for p in range(n)])
    out = torch.empty(sum(rank + 1 for _ in range(n)), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[rank + 1] * n, input_split_sizes=[p + 1 for p in range(n)])
    same(out, torch.cat([torch.full((rank + 1, 2), float(p * 10 + rank)) for p in range(n)]), "all_to_all splits")
    # all_to_all with lists of uneven tensors
    ins = [torch.full((p + 1,), rank * 100 + p, dtype=torch.int64) for p in range(n)]
    outs = [torch.empty(rank + 1, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for p in range(n):
        same(outs[p], torch.full((rank + 1,), p * 100 + rank, dtype=torch.int64), "all_to_all from %d" % p)
    # send/recv and isend/irecv between pairs (2r, 2r+1)
    if n >= 2 and not (n % 2 and rank == n - 1):
        peer = rank ^ 1
        t = torch.full((4,), float(rank))
        r = torch.empty(4)
        if rank % 2 == 0:
            dist.send(t, peer)
            dist.recv(r, peer)
        else:
            dist.recv(r, peer)
            dist.send(t, peer)
        same(r, torch.full((4,), float(peer)), "send/recv")
        reqs = [dist.isend(t, peer), dist.irecv(r, peer)] if rank % 2 == 0 else [dist.irecv(r, peer), dist.isend(t, peer)]
        for q in reqs:
            q.wait()
        same(r, torch.full((4,), float(peer)), "isend/irecv")
    # a ring: every rank sends to the next and receives from the previous,
    # sends first, with messages larger than any transport buffer
    if n >= 2:
        big = torch.full((1 << 21,), float(rank))
        got = torch.empty(1 << 21)
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, big, (rank + 1) % n),
                                     dist.P2POp(dist.irecv, got, (rank - 1) % n)])
        for q in ws:
            q.wait()
        same(got, torch.full((1 << 21,), float((rank - 1) % n)), "ring isend/irecv")
    dist.barrier()


def check_groups(rank, n):
    evens = list(range(0, n, 2))
    odds = list(range(1, n, 2))
    ge = dist.new_group(evens, backend="gorun")
    go = dist.new_group(odds, backend="gorun") if odds else None
    mine = ge if rank % 2 == 0 else go
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    same(t, torch.tensor([float(sum(evens if rank % 2 == 0 else odds))]), "subgroup all_reduce")
    # torch numbers a group's ranks in ascending world order, whatever order
    # they were listed in; the backend receives them that way
    if n >= 2:
        pair = dist.new_group([n - 1, 0], backend="gorun")
        if rank in (0, n - 1):
            assert dist.get_backend(pair) == "gorun"
            t = torch.tensor([float(rank)])
            dist.broadcast(t, src=n - 1, group=pair)
            same(t, torch.tensor([float(n - 1)]), "pair broadcast")
            outs = [torch.empty(1) for _ in range(2)]
            dist.all_gather(outs, torch.tensor([float(rank)]), group=pair)
            same(torch.cat(outs), torch.tensor([0.0, float(n - 1)]), "pair all_gather")
    dist.barrier()


def check_async(rank, n):
    # async work: wait, is_completed, get_future chained with then
    t = torch.ones(100_000)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future().then(lambda f: f.value()[0] * 2)
    w.wait()
    assert w.is_completed() and w.is_success()
    same(fut.wait(), torch.full((100_000,), 2.0 * n), "future chain")
    # futures complete without anyone calling wait
    t2 = torch.ones(10)
    f2 = dist.all_reduce(t2, async_op=True).get_future()
    same(f2.wait()[0], torch.full((10,), float(n)), "future alone")
    # several in flight, completed in issue order
    ts = [torch.full((1000,), float(i)) for i in range(8)]
    ws = [dist.all_reduce(x, async_op=True) for x in ts]
    ws[-1].wait()
    assert all(x.is_completed() for x in ws), "an earlier call not complete after a later one"
    for i, x in enumerate(ts):
        same(x, torch.full((1000,), float(i * n)), "in-flight %d" % i)
    # wait with a timeout on a call that a peer issues late
    if n >= 2:
        if rank == 1:
            time.sleep(0.5)
        x = torch.ones(1)
        w = dist.all_reduce(x, async_op=True)
        if rank == 0:
            try:
                w.wait(timeout=datetime.timedelta(milliseconds=50))
                raise AssertionError("wait(50ms) returned before rank 1 issued the call")
            except gorun.GorunTimeout as e:
                assert "not complete" in str(e), e
        w.wait()
        same(x, torch.full((1,), float(n)), "late all_reduce")
    # futures of other collectives, as FSDP-style code chains on them
    b = torch.full((6,), float(rank))
    fb = dist.broadcast(b, src=n - 1, async_op=True).get_future()
    g = torch.empty(3 * n)
    fg = dist.all_gather_into_tensor(g, torch.full((3,), float(rank)), async_op=True).get_future()
    o = torch.empty(2)
    fr = dist.reduce_scatter_tensor(o, torch.arange(2.0 * n) + rank, async_op=True).get_future()
    fb.wait(), fg.wait(), fr.wait()
    same(b, torch.full((6,), float(n - 1)), "broadcast future")
    same(g, torch.arange(float(n)).repeat_interleave(3), "all_gather_into_tensor future")
    same(o, n * (torch.arange(2.0) + 2 * rank) + n * (n - 1) / 2, "reduce_scatter_tensor future")


def check_bad_arguments(rank, n):
    def raises(exc, words, fn):
        try:
            fn()
        except exc as e:
            for w in words:
                assert w in str(e), "%r not in %r" % (w, str(e))
            return
        raise AssertionError("no %s for %s" % (exc.__name__, words))
    nc = torch.ones(4, 4).t()
    raises(ValueError, ["allreduce", "contiguous"], lambda: dist.all_reduce(nc))
    raises(TypeError, ["int16", "not supported"], lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)))
    raises(ValueError, ["BAND"], lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=R.BAND))
    raises(ValueError, ["all_gather_into_tensor", "output has"],
           lambda: dist.all_gather_into_tensor(torch.empty(n * 3 + 1), torch.ones(3)))
    raises(TypeError, ["float64"],
           lambda: dist.all_gather_into_tensor(torch.empty(n * 3, dtype=torch.float64), torch.ones(3)))
    raises(ValueError, ["reduce_scatter_tensor", "input has"],
           lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n + 1)))
    raises(ValueError, ["all_to_all_single", "split sizes"],
           lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n), [1] * n, [2] * n))
    if n > 1:
        raises(ValueError, ["allgather", "elements"],
               lambda: dist.all_gather([torch.empty(2) for _ in range(n)], torch.ones(3)))
    raises(ValueError, ["recv from any source", "contiguous"], lambda: dist.recv(nc))
    # none of these reached the wire: the group still works, with the same data
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    same(t, torch.full((3,), float(n * (n - 1) / 2)), "all_reduce after bad arguments")


def train(model, pg, steps, seed, hook=None):
    ddp = DDP(model, process_group=pg, bucket_cap_mb=0.002)
    if hook is not None:
        ddp.register_comm_hook(pg, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def make_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def check_ddp(rank, n, gloo):
    world = dist.group.WORLD
    for name, hook in (("default", None), ("allreduce hook", default_hooks.allreduce_hook),
                       ("fp16 hook", default_hooks.fp16_compress_hook)):
        a = train(make_model(), world, 10, 5, hook)
        b = train(make_model(), gloo, 10, 5, hook)
        tol = 1e-3 if hook is default_hooks.fp16_compress_hook else 1e-5
        if not torch.allclose(a, b, atol=tol, rtol=0):
            raise AssertionError("DDP %s: gorun and gloo differ by %g" % (name, (a - b).abs().max()))
        # and every rank holds the same parameters
        outs = [torch.empty_like(a) for _ in range(n)]
        dist.all_gather(outs, a)
        assert all(torch.equal(o, a) for o in outs), "DDP %s: ranks disagree" % name


class ShardedMLP:
    """FSDP-style data parallel training written with the tensor collectives
    (torch 1.13's FullyShardedDataParallel cannot even be imported on Python
    3.11, see notes/torch-backend.md): each layer's parameters live as one
    flat vector sharded over the ranks; a layer is all-gathered
    (all_gather_into_tensor) just before it runs, the next layer's gather
    is issued asynchronously meanwhile (FSDP's prefetch), and the flat
    gradient is reduce-scattered (reduce_scatter_tensor, AVG) so each rank
    updates only its shard."""

    def __init__(self, model, pg):
        self.model, self.pg = model, pg
        self.n, self.rank = dist.get_world_size(pg), dist.get_rank(pg)
        self.layers = [m for m in model if list(m.parameters())]
        self.shards = []
        for layer in self.layers:
            flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
            k = -(-flat.numel() // self.n)  # padded to a multiple of the group
            flat = torch.cat([flat, flat.new_zeros(k * self.n - flat.numel())])
            self.shards.append(flat[self.rank * k:(self.rank + 1) * k].clone())

    def _gather(self, i, async_op):
        shard = self.shards[i]
        full = torch.empty(shard.numel() * self.n)
        w = dist.all_gather_into_tensor(full, shard, group=self.pg, async_op=async_op)
        return full, w

    def _params(self, i, full):
        out, off = {}, 0
        for name, p in self.layers[i].named_parameters():
            out[name] = full[off:off + p.numel()].view_as(p)
            off += p.numel()
        return out

    def step(self, x, y, lr):
        fulls = []
        nxt = self._gather(0, async_op=True)
        h = x
        for i, m in enumerate(self.model):
            if m in self.layers:
                j = self.layers.index(m)
                full, w = nxt
                w.wait()
                if j + 1 < len(self.layers):
                    nxt = self._gather(j + 1, async_op=True)  # prefetch while this layer runs
                full.requires_grad_(True)
                fulls.append(full)
                h = torch.nn.utils.stateless.functional_call(m, self._params(j, full), (h,))
            else:
                h = m(h)
        loss = ((h - y) ** 2).mean()
        loss.backward()
        for j, full in enumerate(fulls):
            g = torch.empty_like(self.shards[j])
            dist.reduce_scatter_tensor(g, full.grad, op=dist.ReduceOp.AVG, group=self.pg)
            self.shards[j] -= lr * g

    def full_parameters(self):
        return torch.cat([self._gather(j, False)[0][:sum(p.numel() for p in layer.parameters())]
                          for j, layer in enumerate(self.layers)])


def check_fsdp_style(rank, n, gloo):
    steps, lr = 6, 0.05
    sharded = ShardedMLP(make_model(), dist.group.WORLD)
    g = torch.Generator().manual_seed(23 + rank)
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]
    for x, y in batches:
        sharded.step(x, y, lr)
    got = sharded.full_parameters()
    # the reference: DDP over gloo (gradients averaged by all-reduce) on the
    # same model and batches
    model = make_model()
    ddp = DDP(model, process_group=gloo)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
    want = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not torch.allclose(got, want, atol=1e-5, rtol=0):
        raise AssertionError("FSDP-style training on gorun and DDP on gloo differ by %g" % (got - want).abs().max())


def check_sparse(rank, n, gloo):
    """all_reduce of sparse COO tensors gives what gloo gives: entries that
    overlap across ranks summed, ranks with no entries, an input with
    duplicate (uncoalesced) indices, a dense trailing dimension; ranks whose
    tensors differ raise on every rank, naming the difference."""
    def inputs():
        yield torch.sparse_coo_tensor([[rank, 0, 3], [1, 1, 2]], [1.0 + rank, 10.0, 0.5], (n + 4, 3))
        idx = [[0, 2, 2]] if rank % 2 == 0 else [[]]  # odd ranks have none; even ones a duplicate
        vals = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]] if rank % 2 == 0 else torch.zeros((0, 2))
        yield torch.sparse_coo_tensor(idx, vals, (5, 2), dtype=torch.float64)
        yield torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), [], (7,))
    for i, t in enumerate(inputs()):
        mine, theirs = t.clone(), t.clone()
        dist.all_reduce(mine)
        dist.all_reduce(theirs, group=gloo)
        if not torch.equal(mine.to_dense(), theirs.to_dense()) or mine.dtype != t.dtype:
            raise AssertionError("sparse all_reduce %d: %s, gloo gives %s" % (i, mine.to_dense(), theirs.to_dense()))
        if not mine.is_coalesced():
            raise AssertionError("sparse all_reduce %d: the result is not coalesced" % i)
    odd = torch.sparse_coo_tensor([[0]], [1.0], (3 + rank % 2,))
    try:
        dist.all_reduce(odd)
        raise AssertionError("sparse all_reduce of sizes that differ across ranks returned")
    except ValueError as e:
        if "differs" not in str(e):
            raise
    try:
        dist.all_reduce(torch.sparse_coo_tensor([[0]], [1.0], (3,)), op=dist.ReduceOp.MAX)
        raise AssertionError("sparse all_reduce with MAX returned")
    except ValueError as e:
        if "MAX" not in str(e):
            raise


def case_all():
    dist.init_process_group("gorun")
    rank, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gorun"
    check_allreduce(rank, n)
    check_others(rank, n)
    check_groups(rank, n)
    check_async(rank, n)
    check_bad_arguments(rank, n)
    gloo = dist.new_group(list(range(n)), backend="gloo")
    check_ddp(rank, n, gloo)
    check_fsdp_style(rank, n, gloo)
    if n > 1:
        check_sparse(rank, n, gloo)
    say("all ok")
    dist.destroy_process_group()


def fixed_tree(vals):
    """gorun's deterministic reduction order (comm/doc.go): pairwise in
    rank order, neighbours (0,1), (2,3)... with the lower rank on the left,
    an odd one out moving up unchanged: ((r0+r1)+(r2+r3)) for 4 ranks."""
    level = list(vals)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def order_sensitive(rank, count, seed):
    """float32 inputs whose sum depends on the order of the additions:
    magnitudes from 1e-4 to 1e8, so that most orders round differently."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    mag = torch.randint(-4, 9, (count,), generator=g).to(torch.float64)
    return (torch.randn(count, generator=g, dtype=torch.float64) * torch.pow(10.0, mag)).to(torch.float32)


def case_det():
    """gorun.Options(deterministic=D), D from argv. Every all-reduce's result
    is compared bit for bit with the fixed tree computed on this rank from
    every rank's inputs, at sizes that take the small (gather, recursive
    doubling) and large (direct, ring) algorithms, with ranks arriving in
    different orders (sleeps). Prints the mismatches per size; the test
    wants none with D=1 and some with D=0 (proof that the inputs can tell
    reduction orders apart). With D=1 a DDP run must also be bitwise equal
    on every rank."""
    det = sys.argv[2] == "1"
    dist.init_process_group("gorun", pg_options=gorun.Options(deterministic=det))
    rank, n = dist.get_rank(), dist.get_world_size()
    counts = [1, 7, 1000, 300_001]
    bad = {}
    for count in counts:
        bad[count] = 0
        for rep in range(3):
            seed = count + rep
            x = order_sensitive(rank, count, seed)
            time.sleep(0.003 * ((rank + rep) % n))  # a different arrival order each rep
            if rep == 1:
                dist.all_reduce(x, async_op=True).wait()  # the asynchronous path as well
            else:
                dist.all_reduce(x)
            want = fixed_tree([order_sensitive(r, count, seed) for r in range(n)])
            bad[count] += int((x.view(torch.int32) != want.view(torch.int32)).sum())
            # whatever the order, every rank holds the same bits
            outs = [torch.empty_like(x) for _ in range(n)]
            dist.all_gather(outs, x)
            assert all(torch.equal(o.view(torch.int32), x.view(torch.int32)) for o in outs), \
                "ranks disagree bitwise (count %d)" % count
    say("TREE det=%d %s" % (det, " ".join("%d:%d" % kv for kv in bad.items())))
    if det:
        p = train(make_model(), dist.group.WORLD, 15, 11)
        outs = [torch.empty_like(p) for _ in range(n)]
        dist.all_gather(outs, p)
        assert all(torch.equal(o, p) for o in outs), "DDP: ranks disagree bitwise"
        say("DETHASH", hashlib.sha256(p.numpy().tobytes()).hexdigest())
    say("det ok")


def case_gloo_default():
    """gorun groups while the default group is gloo: the first gorun group
    founds gorun's world (a subset of the ranks when n > 2, every rank
    otherwise), later gorun groups are carved out of it."""
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    first = [0, n - 1] if n > 2 else list(range(n))
    g = dist.new_group(first, backend="gorun")
    if rank in first:
        assert dist.get_backend(g) == "gorun", dist.get_backend(g)
        t = torch.full((5,), float(rank))
        dist.all_reduce(t, group=g)
        same(t, torch.full((5,), float(sum(first))), "gorun subgroup all_reduce")
        outs = [torch.empty(1, dtype=torch.int64) for _ in first]
        dist.all_gather(outs, torch.tensor([rank]), group=g)
        same(torch.cat(outs), torch.tensor(first), "gorun subgroup all_gather")
        f = dist.all_reduce(torch.ones(3), group=g, async_op=True).get_future()
        same(f.wait()[0], torch.full((3,), float(len(first))), "gorun subgroup future")
        # point-to-point between the group's two ends (group ranks 0 and 1)
        x = torch.full((4,), float(rank))
        peer = len(first) - 1 - first.index(rank)
        if first.index(rank) == 0:
            dist.send(x, first[peer], group=g)
        elif first.index(rank) == len(first) - 1:
            dist.recv(x, first[peer], group=g)
            same(x, torch.full((4,), float(first[0])), "gorun subgroup send/recv")
    inner = dist.new_group([n - 1], backend="gorun")  # within gorun's world
    if rank == n - 1:
        t = torch.full((2,), 7.0)
        dist.all_reduce(t, group=inner)
        same(t, torch.full((2,), 7.0), "gorun group of one")
    t = torch.ones(2)
    dist.all_reduce(t)  # the default group is still gloo's
    same(t, torch.full((2,), float(n)), "gloo default all_reduce")
    say("gloodefault ok")
    dist.destroy_process_group()


def case_schedgroup():
    """Prints the rank's cpu cgroup (cgroup v1) after init and before
    finalize, and checks the collective still works."""
    dist.init_process_group("gorun")
    cg = [l.split(":", 2)[2] for l in open("/proc/self/cgroup").read().splitlines() if l.split(":")[1:2] == ["cpu"]]
    t = torch.ones(3)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(dist.get_world_size())), "all_reduce in the scheduling group")
    say("CPUCGROUP %s job=%s" % (cg[0] if cg else "none", os.environ.get("GORUN_JOB_ID")))
    say("schedgroup ok")
    dist.destroy_process_group()


def case_smoke():
    dist.init_process_group("gorun")
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)
    same(t, torch.full((10,), float(n * (n - 1) / 2)), "smoke all_reduce")
    outs = [torch.empty(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, torch.tensor([rank]))
    same(torch.cat(outs), torch.arange(n), "smoke all_gather")
    dist.barrier()
    say("smoke ok")


def case_fork():
    """Go's runtime does not survive fork: DataLoader workers (forked, never
    calling gorun) work; a forked child that calls gorun gets an error."""
    dist.init_process_group("gorun")
    rank, n = dist.get_rank(), dist.get_world_size()
    ds = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))
    total = sum(b[0].sum() for b in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2))
    assert float(total) == float(torch.arange(64.0).sum()), total
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            dist.all_reduce(torch.ones(1))
            msg = b"no error"
        except gorun.GorunError as e:
            msg = str(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    msg = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    assert "forked" in msg and "spawn" in msg, msg
    t = torch.ones(3)
    dist.all_reduce(t)  # the parent is unaffected
    same(t, torch.full((3,), float(n)), "all_reduce after fork")
    say("fork ok")


def case_kill():
    # gorun stops the other ranks with SIGTERM once one dies; the survivors
    # ignore it here to report what the backend told them.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gorun")
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1000)
    start = time.monotonic()
    try:
        for i in range(1_000_000):
            if i == 20 and rank == n - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)
            start = time.monotonic()
    except gorun.GorunError as e:
        say("KILLERR after=%.2f status=%s lostrank=%d msg=%s" % (time.monotonic() - start, e.status, e.rank, e))
        sys.stdout.flush()
        if sys.argv[2:] == ["exit"]:
            sys.exit(0)  # as a program would: the backend finalizes at exit
        os._exit(0)  # the world is broken; do not wait at exit for a goodbye


def case_desync():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gorun")
    rank = dist.get_rank()
    t = torch.ones(8)
    try:
        if rank == 0:
            dist.broadcast(t, 0)
        else:
            dist.all_reduce(t)
        say("DESYNCERR none")
    except gorun.GorunError as e:
        say("DESYNCERR status=%s msg=%s" % (e.status, e))
    sys.stdout.flush()
    # Stay a moment: rank 0 is its host's rendezvous leader, and its exit
    # would tell a rank that has not yet read the desync that rank 0 is gone.
    time.sleep(2)
    os._exit(0)


def case_timeout():
    # A group's timeout bounds every call: ranks 0 and 1 wait in an
    # all_reduce that the last rank never joins; it only waits, through the
    # store, until they have raised, then finds its own group failed. (The
    # default group is gloo with the default timeout: torch's store
    # connection at start-up obeys init_process_group's timeout too, and 1 s
    # is not enough for it on a loaded machine.)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(backend="gorun", timeout=datetime.timedelta(seconds=1))
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(4)
    try:
        if rank < n - 1:
            start = time.monotonic()
            try:
                dist.all_reduce(t, group=g)
                say("TIMEOUTERR none")
            except gorun.GorunError as e:
                end = time.monotonic()  # CLOCK_MONOTONIC: one clock for every rank on the host
                say("TIMEOUTERR after=%.2f start=%.6f end=%.6f status=%s rank=%d msg=%s"
                    % (end - start, start, end, e.status, e.rank, e))
            store.set("raised%d" % rank, "1")
            store.wait(["late"])  # rank 0 serves the store: stay for the last rank
        else:
            store.wait(["raised%d" % r for r in range(n - 1)])
            try:
                dist.all_reduce(t, group=g)
                say("LATEERR none")
            except gorun.GorunError as e:
                say("LATEERR status=%s msg=%s" % (e.status, e))
            store.set("late", "1")
    except Exception as e:
        say("UNEXPECTED %r" % e)
    finally:
        sys.stdout.flush()
        os._exit(0)  # the world is broken; do not wait at exit for a goodbye


if __name__ == "__main__":
    {"schedgroup": case_schedgroup, "timeout": case_timeout, "all": case_all, "smoke": case_smoke, "gloodefault": case_gloo_default, "fork": case_fork, "det": case_det, "kill": case_kill, "desync": case_desync}[sys.argv[1]]()
