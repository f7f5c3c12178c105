"""gorun.fx: the chunk pass's plans applied to a SimpleFSDP GPT's joint graph
and run on 2 ranks over gloo. Forward chunks are bitwise equal to the
unchunked graph; backward chunks differ only where the split reorders a sum
over the batch (the weight gradients), and only there."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.ops, "_c10d_functional") or not hasattr(torch.ops._c10d_functional, "wait_tensor"):
    pytest.skip("gorun.fx needs torch 2.x functional collectives", allow_module_level=True)

import fxrank  # noqa: E402
import gorun.fx as gfx  # noqa: E402

WORLD = 2
LR = 0.01


@pytest.fixture(scope="module")
def traced():
    """One block; the step graph declares chunk modes (chunks=2). The
    joint graph stays in the fake group's scope only while tracing, so the
    layout (the second trace) is made here too."""
    spec = {"model": {"layers": 1}, "repeats": 1, "lr": LR, "batch": 8}
    with fxrank.fake_group(WORLD) as group:
        fsdp, _, batch, joint = fxrank.build(spec, 0, WORLD, group)
        step = gfx.to_step_graph(joint, chunks=2)
        plain = gfx.to_step_graph(joint)
    spec["fx_nodes"] = [n.name for n in joint.gm.graph.nodes]
    return spec, fsdp, joint, step, plain


def _plan(step, **opts):
    planned, _ = gfx.plan(step, "chunk", chunk_regions="layers.*", chunk_always=True, **opts)
    return planned


def test_layout_reads_batch_partial_and_whole_tensors(traced):
    _, fsdp, joint, step, _ = traced
    lay = gfx.chunk_layout(joint, 2)
    fx = {n.name: n for n in joint.gm.graph.nodes}
    modes = {t["name"]: t.get("chunk") for t in step["tensors"]}
    ph = [n.name for n in joint.gm.graph.nodes if n.op == "placeholder"]
    assert [modes[p] for p in ph] == ["replicated"] * len(fsdp.names) + ["batch", "batch"]
    # the weight gradients of the block's matmuls are partial sums; the
    # activations' gradients are batch tensors; the causal mask is whole
    mm = [n for n in joint.gm.graph.nodes if n.target is torch.ops.aten.mm.default
          and gfx.directions(joint.gm.graph)[n] == "backward"]
    assert {modes[n.name] for n in mm} == {"partial", "batch"}
    for n in mm:
        a = fx[n.name].args[0]
        assert (modes[n.name] == "partial") == (lay.value[a.name] == ("batch", 1)), n.name
    assert modes["bitwise_not"] == "replicated"
    # the loss cannot run per chunk, and says why
    loss = next(n for n in joint.gm.graph.nodes if n.target is torch.ops.aten.nll_loss_forward.default)
    per = {a: lay.value[a.name] for a in loss.all_input_nodes if lay.value[a.name][0] == "batch"}
    assert lay.rule(loss, per)[0] == "no"


def test_chunked_plans_run_on_2_ranks_over_gloo(traced, launcher):
    spec, fsdp, joint, step, _ = traced
    fwd = _plan(step, chunk_dirs="forward")
    fwd4 = _plan(step, chunk_dirs="forward", chunk_count=4)
    assert {n["chunk"]["count"] for n in fwd4["nodes"] if n.get("chunk")} == {4}
    bwd_acc = _plan(step, chunk_dirs="backward")
    bwd_rs = _plan(step, chunk_dirs="backward", chunk_accumulate=False)
    both, _ = gfx.plan(step, "chunk,blocks,overlap", chunk_regions="layers.*", chunk_always=True,
                       chunk_accumulate=False)
    for p, d in ((fwd, "forward"), (bwd_acc, "backward"), (bwd_rs, "backward")):
        chunked = {n["direction"] for n in p["nodes"] if n.get("chunk")}
        assert chunked == {d}, (d, chunked)
    rs_per_chunk = [n for n in bwd_rs["nodes"] if n["kind"] == "start" and "#" in n["name"]]
    assert len(rs_per_chunk) == 2 * 8, "each of the block's 8 gradients reduce-scattered per chunk"
    sides = [{"name": "unchunked", "kind": "unbucketed"},
             {"name": "chunk fwd", "kind": "gorun", "planned": fwd},
             {"name": "chunk fwd x4", "kind": "gorun", "planned": fwd4},
             {"name": "chunk bwd accumulate", "kind": "gorun", "planned": bwd_acc, "bound": True},
             {"name": "chunk bwd per-chunk rs", "kind": "gorun", "planned": bwd_rs, "bound": True},
             {"name": "chunk,blocks,overlap", "kind": "gorun", "planned": both, "bound": True}]
    r = fxrank.run_ranks(WORLD, dict(spec, sides=sides), timeout=170)
    assert r["reference_ok"]
    s = {x["name"]: x for x in r["sides"]}
    # Forward: every op of the block is batch-parallel, so the chunks'
    # concatenation is the unchunked result, bit for bit.
    for name in ("chunk fwd", "chunk fwd x4"):
        assert s[name]["equal"] and s[name]["unequal"] == [], s[name]
    assert s["chunk bwd per-chunk rs"]["collectives"] == {"all_gather": 11, "reduce_scatter": 11 + 8}
    # Backward: the block's weight gradients are sums over the batch; per
    # chunk they are summed in another order. Exactly those shards may
    # differ (outputs 1+i, i indexing fsdp.names); the loss and every other
    # shard are bitwise equal; and every element of the shards that differ
    # is within the reordering bound (fxrank.reorder_bound: 2·γ(n)·Σ|terms|
    # of the unchunked graph's own sums, plus the update's two roundings).
    block = {1 + i for i, n in enumerate(fsdp.names) if n.startswith("layers.0.")}
    for name in ("chunk bwd accumulate", "chunk bwd per-chunk rs", "chunk,blocks,overlap"):
        x = s[name]
        assert x["unequal"] and set(x["unequal"]) <= block, (name, x["unequal"], sorted(block))
        assert x["within_bound"], (name, x["bound_ratio"], x["max_abs_diff"])
        assert 0 < x["bound_ratio"] <= 1, x


def test_plans_the_rewrite_cannot_do_are_refused(traced):
    spec, _, joint, step, plain = traced
    # The loss is a mean over the batch: per chunk it would be another mean.
    with pytest.raises(gfx.FxError, match=r"nll_loss_forward.*per chunk, but it cannot"):
        gfx.apply_plan(joint, gfx.plan(step, "chunk", chunk_regions="output", chunk_always=True,
                                       chunk_dirs="forward")[0])
    # Without declared modes the pass takes every computed tensor for a
    # batch tensor, the forward's causal mask too, and splits it: refused,
    # not silently wrong.
    with pytest.raises(gfx.FxError, match=r"splits bitwise_not along the batch, but it has no batch dimension"):
        gfx.apply_plan(joint, _plan(plain, chunk_dirs="backward"))
    # Declared as a batch tensor, a weight gradient's chunks are summed as
    # partial sums are; concatenated, they are refused.
    wrong = dict(step, tensors=[dict(t, chunk="batch") if t.get("chunk") == "partial" else t for t in step["tensors"]])
    with pytest.raises(gfx.FxError, match=r"concatenates \w+, whose chunks are \['partial'\]"):
        gfx.apply_plan(joint, _plan(wrong, chunk_dirs="backward"))
    # A chunk boundary moved (chunk 1 reads chunk 0's tensor).
    bad = _plan(step, chunk_dirs="forward")
    for n in bad["nodes"]:
        if n.get("chunk", {}).get("index") == 1 and any(r.endswith("#1") for r in n["reads"]):
            n["reads"] = [r[:-1] + "0" if r.endswith("#1") else r for r in n["reads"]]
            break
    with pytest.raises(gfx.FxError, match=r"\(chunk 1\) reads \w+#0, a tensor of chunk 0"):
        gfx.apply_plan(joint, bad)
    # An all-gather of a batch chunk: rank-major results would interleave
    # ranks and chunks. A reduce-scatter of a partial sum's chunk is fine.
    ch = gfx._Chunker(joint, {"nodes": []}, torch.fx.Graph(), {"x#0": None, "g#0": None})
    ch.mode.update({"x#0": ("batch", 0), "g#0": ("partial", None)})
    ch.check_start({"name": "rs#0", "op": "reduce_scatter", "members": [{"in": "g#0", "out": "G#0"}]})
    assert ch.mode["G#0"] == ("partial", None)
    with pytest.raises(gfx.FxError, match=r"start ag#0: all_gather of x#0, a chunk of the batch"):
        ch.check_start({"name": "ag#0", "op": "all_gather", "members": [{"in": "x#0", "out": "X#0"}]})


def _verdicts(fn, *xs):
    """chunk_layout's verdict on every node of make_fx(fn)(*xs), the batch
    being dim 0 of every x: node name -> the mode it has when it runs per
    chunk on whatever per-chunk inputs it can have."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(fn)(*xs)
    joint = gfx.Joint(gm, [], len(xs), [], 1, None, {},
                      retrace=lambda k: make_fx(fn)(*[x[:x.shape[0] // k] for x in xs]))
    lay = gfx.chunk_layout(joint, 2)
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            per = {a: lay.value[a.name] for a in n.all_input_nodes
                   if gfx._leaf_kind(lay.value[a.name]) in ("batch", "partial")}
            out[n.target.__name__.split(".")[0]] = lay.rule(n, per) if per else lay.value[n.name]
    return out


def test_layout_rules_split_what_is_batch_parallel_and_refuse_the_rest():
    x, w = torch.randn(8, 4, 6), torch.randn(6, 5)
    v = _verdicts(lambda x: torch.softmax(torch.nn.functional.gelu(x @ w) * 2, -1), x)
    assert v["view"] == ("batch", 0) and v["mm"] == ("batch", 0) and v["gelu"] == ("batch", 0)
    assert v["_softmax"] == ("batch", 0)
    # a sum over the batch is a partial sum, and stays one through linear ops
    v = _verdicts(lambda x: (x.sum(0) * 3).t(), x[:, 0])
    assert v["sum"] == ("partial", None) and v["mul"] == ("partial", None) and v["t"] == ("partial", None)
    # ... but not when a whole term is added per chunk
    v = _verdicts(lambda x: x.sum(0) + 1, x[:, 0])
    assert v["add"][0] == "no" and "counted 2 times" in v["add"][1], v["add"]
    # a mean over the batch, a softmax along it, a cumulative sum along it
    assert _verdicts(lambda x: x - x.mean(0), x)["mean"][0] == "no"
    assert "along the batch dimension" in _verdicts(lambda x: torch.softmax(x, 0), x)["_softmax"][1]
    assert "does not know" in _verdicts(lambda x: x.cumsum(0), x)["cumsum"][1]
    # seq-major: a transpose keeps the batch outermost in memory, a copy in
    # its order does not, and what is made of the copy has rows that are
    # not the samples in order, although dim 0 still halves with the batch
    v = _verdicts(lambda x: x.transpose(0, 1).reshape(-1, 6) @ w, x)
    assert v["transpose"] == ("batch", 1), v
    assert v["clone"][0] == "no" and "outermost" in v["clone"][1], v
    assert v["_unsafe_view"][0] == "no" and "samples in order" in v["_unsafe_view"][1], v
    assert v["mm"][0] == "no", v
    # complex views (RoPE) change the element size, not the rows
    v = _verdicts(lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(x.shape[0], 4, 3, 2)) * 2), x)
    assert v["view_as_complex"] == ("batch", 0) and v["view_as_real"] == ("batch", 0), v
    # a size argument may change with the batch; any other argument may not
    assert _verdicts(lambda x: x.reshape(x.shape[0] * 4, 6), x)["view"] == ("batch", 0)
    v = _verdicts(lambda x: x / x.shape[0], x)
    assert v["div"][0] == "no" and "not a size" in v["div"][1], v
