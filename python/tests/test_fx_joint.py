"""gorun.fx: a SimpleFSDP GPT's joint training graph as a gorun step graph,
and gorun's plan applied back to the FX graph and run on 2 ranks over gloo,
bitwise equal to the unbucketed graph."""

import collections

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.ops, "_c10d_functional") or not hasattr(torch.ops._c10d_functional, "wait_tensor"):
    pytest.skip("gorun.fx needs torch 2.x functional collectives", allow_module_level=True)

import fxrank  # noqa: E402
import gorun.fx as gfx  # noqa: E402
from gorun.export import _block_of  # noqa: E402

WORLD = 2
BLOCKS = ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"]


@pytest.fixture(scope="module")
def traced():
    spec = {"model": {}, "repeats": 1}
    with fxrank.fake_group(WORLD) as group:
        fsdp, _, batch, joint = fxrank.build(spec, 0, WORLD, group)
        costs = gfx.profile_costs(joint, batch, fsdp, repeats=1)
        step = gfx.to_step_graph(joint, costs)
    spec["fx_nodes"] = [n.name for n in joint.gm.graph.nodes]
    return spec, fsdp, joint, costs, step


@pytest.fixture(scope="module")
def flat(traced):
    """The step graph with every compute at 1 ns: what the planner does
    with it does not move with the profile (and the machine's load)."""
    return gfx.to_step_graph(traced[2])


def test_step_graph_nodes_map_back_to_fx_nodes(traced):
    _, _, joint, costs, step = traced
    fx = {n.name: n for n in joint.gm.graph.nodes}
    computes = [n for n in step["nodes"] if n["kind"] == "compute"]
    names = [n["name"] for n in computes]
    assert len(names) == len(set(names))
    want = [n.name for n in joint.gm.graph.nodes if n.op == "call_function"
            and n.target not in (gfx.ALL_GATHER, gfx.REDUCE_SCATTER, gfx.WAIT)]
    assert sorted(names) == sorted(want)
    # costs are the profile's, so the matmuls cost more than a view
    mm = [c["cost_ns"] for c in computes if fx[c["name"]].target is torch.ops.aten.mm.default]
    assert mm and min(mm) > 1
    starts = {n["name"]: n for n in step["nodes"] if n["kind"] == "start"}
    waits = [n for n in step["nodes"] if n["kind"] == "wait"]
    assert sorted(w["of"] for w in waits) == sorted(starts)
    pos = {n["name"]: i for i, n in enumerate(step["nodes"])}
    for w in waits:
        assert fx[w["of"]].target in (gfx.ALL_GATHER, gfx.REDUCE_SCATTER)
        assert pos[w["of"]] < pos[w["name"]]


def test_regions_and_directions_come_from_the_joint_graph(traced):
    _, _, joint, _, step = traced
    assert step["regions"] == BLOCKS
    computes = [n for n in step["nodes"] if n["kind"] == "compute"]
    by = collections.Counter((c["direction"], c.get("region")) for c in computes)
    for b in BLOCKS:
        assert by[("forward", b)] > 0 and by[("backward", b)] > 0, b
    # the optimizer is the SGD update of every shard, outside every block
    opt = [c for c in computes if c["direction"] == "optimizer"]
    assert opt and all("region" not in c for c in opt)
    assert by[("optimizer", None)] == len(opt)
    # make_fx records ops as they ran: forward, then backward, then the optimizer
    dirs = [c["direction"] for c in computes]
    assert dirs == sorted(dirs, key=["forward", "backward", "optimizer"].index)
    # backward visits the blocks in reverse
    seen = []
    for c in computes:
        if c["direction"] == "backward" and (not seen or seen[-1] != c["region"]):
            seen.append(c["region"])
    assert seen == list(reversed(BLOCKS)), seen


def test_collectives_are_simplefsdp_gathers_and_reduce_scatters(traced):
    _, fsdp, joint, _, step = traced
    shard_of = {n.name: fsdp.names[i] for i, n in
                enumerate(n for n in joint.gm.graph.nodes if n.op == "placeholder") if i < len(fsdp.names)}
    starts = [n for n in step["nodes"] if n["kind"] == "start"]
    ag = [s for s in starts if s["op"] == "all_gather"]
    rs = [s for s in starts if s["op"] == "reduce_scatter"]
    assert len(ag) == len(rs) == len(fsdp.names) and len(starts) == 2 * len(fsdp.names)
    for s in ag:
        (m,) = s["members"]
        fqn = shard_of[m["in"]]
        assert s["direction"] == "forward" and s["region"] == _block_of(fqn, BLOCKS), (s["name"], fqn)
        assert m["bytes"] == 4 * fsdp.shards[fsdp.names.index(fqn)].numel()
    # a reduce-scatter differentiates one gather (same autograd sequence
    # number) and sits in the gather's region: the gradient of a block's
    # parameters is reduced in that block's backward
    fx = {n.name: n for n in joint.gm.graph.nodes}
    ag_by_seq = {fx[s["name"]].meta["seq_nr"]: s for s in ag}
    assert len(ag_by_seq) == len(ag)
    for s in rs:
        (m,) = s["members"]
        assert s["region"] == ag_by_seq[fx[s["name"]].meta["seq_nr"]]["region"], s["name"]
        assert s["direction"] == "backward" and s["dtype"] == "f32"
        assert m["bytes"] % (4 * WORLD) == 0
    # every reduce-scatter's shard feeds exactly one SGD update
    reads = collections.Counter(t for n in step["nodes"] if n["kind"] == "compute" and n["direction"] == "optimizer"
                                for t in n["reads"])
    assert all(reads[s["members"][0]["out"]] == 1 for s in rs)
    assert sum(m["bytes"] for s in rs for m in s["members"]) == WORLD * sum(m["bytes"] for s in ag for m in s["members"])


def test_tied_weight_is_one_member_read_by_several_regions(traced):
    _, fsdp, joint, _, step = traced
    assert fsdp.aliases == {"output.weight": "tok_embeddings.weight"}
    assert "output.weight" not in fsdp.names
    i = fsdp.names.index("tok_embeddings.weight")
    ph = [n.name for n in joint.gm.graph.nodes if n.op == "placeholder"][i]
    gathers = [s for s in step["nodes"] if s["kind"] == "start" and s["members"][0]["in"] == ph]
    assert len(gathers) == 1 and gathers[0]["region"] == "tok_embeddings"
    out = gathers[0]["members"][0]["out"]
    readers = {(n["direction"], n.get("region")) for n in step["nodes"]
               if n["kind"] == "compute" and out in n.get("reads", [])}
    assert ("forward", "tok_embeddings") in readers
    assert ("forward", "output") in readers and ("backward", "output") in readers
    # one gradient for the shard: both regions' contributions meet before one reduce-scatter
    rs = [s for s in step["nodes"] if s["kind"] == "start" and s["op"] == "reduce_scatter"
          and s["members"][0]["bytes"] == WORLD * gathers[0]["members"][0]["bytes"]]
    assert len(rs) == 1


def test_gorun_plan_reads_the_step_graph(flat, launcher):
    planned, summary = gfx.plan(flat, "reshard,blocks,overlap")
    assert summary["estimate"]["Before"]["collectives"] == 2 * 35
    assert summary["estimate"]["After"]["collectives"] < summary["estimate"]["Before"]["collectives"]
    assert summary["peak_bytes_after"] < summary["peak_bytes_before"], "reshard should free gathered weights"
    assert any(n["name"].endswith(gfx.REGATHER) for n in planned["nodes"] if n["kind"] == "start")


def test_planned_graph_runs_bitwise_equal_on_2_ranks_over_gloo(traced, flat, launcher):
    spec, _, joint, _, _ = traced
    sides = [{"name": "unbucketed", "kind": "unbucketed"}]
    for passes in ("blocks,overlap", "reshard,blocks,overlap"):
        planned, _ = gfx.plan(flat, passes)
        gm = gfx.apply_plan(joint, planned)
        c = gfx.count_collectives(gm)
        assert sum(c.values()) == sum(1 for n in planned["nodes"] if n["kind"] == "start")
        assert sum(c.values()) < 70, (passes, c)
        sides.append({"name": passes, "kind": "gorun", "planned": planned})
    spec = dict(spec, sides=sides)
    r = fxrank.run_ranks(WORLD, spec, timeout=150)
    assert r["reference_ok"], "the joint graph's step differs from autograd on the unsharded model"
    for s in r["sides"]:
        assert s["equal"], s
    base, resh = r["sides"][0], r["sides"][2]
    assert resh["peak_bytes"] < base["peak_bytes"], (resh, base)


def test_bad_plans_are_refused_clearly(traced):
    _, _, joint, _, step = traced
    planned, _ = gfx.plan(step, "blocks")
    bad = dict(planned, nodes=[n for n in planned["nodes"] if n["kind"] != "start"])
    with pytest.raises(gfx.FxError, match="its start .* has not run"):
        gfx.apply_plan(joint, bad)
    bad = dict(planned, nodes=[dict(n, name="nosuch") if n["kind"] == "compute" else n for n in planned["nodes"]])
    with pytest.raises(gfx.FxError, match="planned compute nosuch has no FX node"):
        gfx.apply_plan(joint, bad)


def test_ddp_style_all_reduce_buckets_run_bitwise_equal_on_2_ranks(launcher):
    # Replicated parameters: one all-reduce per gradient. Priced at gloo's
    # latency (~0.3 ms here) the planner merges them into a few buckets.
    spec = {"model": {"layers": 2}, "repeats": 1, "mode": "replicate"}
    joint, _, step = fxrank.prepare(spec, WORLD, profile=False)
    starts = [n for n in step["nodes"] if n["kind"] == "start"]
    assert starts and all(s["op"] == "all_reduce" and s["direction"] == "backward" for s in starts)
    planned, _ = gfx.plan(step, "blocks,overlap", latency_ns=300000)
    merged = sum(1 for n in planned["nodes"] if n["kind"] == "start")
    assert merged < len(starts) and any(len(n["members"]) > 1 for n in planned["nodes"] if n["kind"] == "start")
    spec["sides"] = [{"name": "unbucketed", "kind": "unbucketed"},
                     {"name": "ddp buckets", "kind": "gorun", "planned": planned}]
    r = fxrank.run_ranks(WORLD, spec, timeout=150)
    assert r["reference_ok"]
    assert r["sides"][1]["collectives"] == {"all_reduce": merged}
    assert all(s["equal"] for s in r["sides"]), r["sides"]
