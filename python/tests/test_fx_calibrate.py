"""gorun.fx prices communication by measuring the process group: every
rank calibrates gorun's α-β model on the real gloo group, the ranks agree
on the figures, gorun.fx.plan uses them by default, and the plan they give
(different from the default constants' plan on this slow group) runs
bitwise equal to the unbucketed graph."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.ops, "_c10d_functional") or not hasattr(torch.ops._c10d_functional, "wait_tensor"):
    pytest.skip("gorun.fx needs torch 2.x functional collectives", allow_module_level=True)

import fxrank  # noqa: E402
import gorun.fx as gfx  # noqa: E402

WORLD = 2
DEFAULT_LATENCY_NS = 20000  # gorun_plan's default α


def test_calibrated_plan_is_the_default_and_runs_bitwise_equal_on_2_ranks(launcher):
    spec = {"model": {}, "repeats": 1, "plan_on_rank": True, "profile_repeats": 1}
    # The parent's profiled step graph, planned on every rank with the
    # figures the ranks measure and agree on.
    _, _, spec["step"] = fxrank.prepare(spec, WORLD)
    spec["sides"] = [{"name": "unbucketed", "kind": "unbucketed"},
                     {"name": "gorun calibrated", "kind": "gorun", "passes": "blocks,overlap"},
                     {"name": "gorun defaults", "kind": "gorun", "passes": "blocks,overlap", "comm": False}]
    r = fxrank.run_ranks(WORLD, spec, timeout=150)
    plans = r["plans"]
    assert len(plans) == WORLD and all(p == plans[0] for p in plans), "ranks planned differently: %s" % plans
    p = plans[0]
    comm = p["measured"]
    assert set(comm) == {"latency_ns", "bus_bandwidth", "copy_bandwidth"}
    assert all(v > 0 for v in comm.values()), comm
    # gloo over loopback is a slow group next to the model's default α ...
    assert comm["latency_ns"] > DEFAULT_LATENCY_NS, comm
    # ... plan() took the measured figures without being handed them ...
    assert p["gorun calibrated"]["comm"] == comm
    assert p["gorun defaults"]["comm"] is None
    # ... and they changed the plan.
    assert p["gorun calibrated"]["hash"] != p["gorun defaults"]["hash"], p
    assert r["reference_ok"]
    for s in r["sides"]:
        assert s["equal"], s
    cal, dflt = r["sides"][1], r["sides"][2]
    # a slower group is worth fewer, bigger buckets
    print("calibrated", comm, cal["collectives"], "defaults", dflt["collectives"])
    assert sum(cal["collectives"].values()) <= sum(dflt["collectives"].values()), (cal, dflt)


def test_plan_takes_the_remembered_calibration_and_explicit_options_win(traced_flat):
    step = traced_flat
    group = step["groups"][0]["name"]
    measured = {"latency_ns": 2000000, "bus_bandwidth": 2e8, "copy_bandwidth": 2e10}
    saved = dict(gfx._CALIBRATED)
    try:
        gfx._CALIBRATED[group] = measured
        _, s_default = gfx.plan(step)
        _, s_explicit = gfx.plan(step, latency_ns=20000, bus_bandwidth=1e9)
        _, s_none = gfx.plan(step, comm=False)
    finally:
        gfx._CALIBRATED.clear()
        gfx._CALIBRATED.update(saved)
    assert s_default["comm"] == measured
    assert s_default["hash"] != s_none["hash"]
    assert s_explicit["hash"] != s_default["hash"]
    with pytest.raises(gfx.FxError, match="comm has unknown keys"):
        gfx.plan(step, comm={"latency": 1})


def test_calibrate_comm_refuses_a_lone_rank():
    with pytest.raises(gfx.FxError, match="has 1 rank"):
        gfx.calibrate_comm("0", 1)


@pytest.fixture(scope="module")
def traced_flat():
    spec = {"model": {}, "repeats": 1}
    with fxrank.fake_group(WORLD) as group:
        _, _, _, joint = fxrank.build(spec, 0, WORLD, group)
        return gfx.to_step_graph(joint)


def test_region_less_loss_nodes_plan_with_reshard(traced_flat_unjoined):
    # The loss and its gradient outside every block, as the trace has them:
    # reshard's re-gathers must still land in declared regions.
    joint, step = traced_flat_unjoined
    loose = [n["name"] for n in step["nodes"] if n["kind"] == "compute" and "region" not in n
             and n["direction"] != "optimizer"]
    assert loose, "the trace should leave the top-level loss outside every block"
    planned, summary = gfx.plan(step, "reshard,blocks,overlap", comm=False)
    regathers = [n for n in planned["nodes"] if n["kind"] in ("start", "wait") and gfx.REGATHER in n["name"]]
    assert regathers and all(n.get("region") in planned["regions"] for n in regathers), regathers
    gm = gfx.apply_plan(joint, planned)
    assert sum(gfx.count_collectives(gm).values()) == sum(1 for n in planned["nodes"] if n["kind"] == "start")


@pytest.fixture(scope="module")
def traced_flat_unjoined():
    spec = {"model": {}, "repeats": 1}
    with fxrank.fake_group(WORLD) as group:
        _, _, _, joint = fxrank.build(spec, 0, WORLD, group)
        return joint, gfx.to_step_graph(joint, join_regions=False)
