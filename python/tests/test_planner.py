"""gorun_plan through ctypes: the planner's results, hash and errors."""

import json
import os
import subprocess

import pytest

from conftest import ROOT

STEP = os.path.join(ROOT, "libgorun", "testdata", "step.json")
TRAINER = os.path.join(ROOT, "libgorun", "testdata", "trainer-step.json")


@pytest.fixture(scope="module")
def planner(launcher):
    os.environ["GORUN_LIB"] = launcher.lib
    from gorun import _planner
    return _planner


def load(p):
    with open(p) as f:
        return json.load(f)


def test_plan_matches_gorun_plan(planner, launcher):
    res = planner.plan(load(STEP), passes="reshard,blocks,overlap", cap_bytes=1 << 20)
    cli = subprocess.run([launcher.gorun, "plan", "--json", "--passes", "reshard,blocks,overlap",
                          "--cap", str(1 << 20), STEP], capture_output=True, check=True)
    assert res["plan"] == json.loads(cli.stdout)
    assert res["graph"]["schema"] == "gorun.stepgraph/v1"
    starts = [n["name"] for n in res["graph"]["nodes"] if n["kind"] == "start"]
    assert starts == [b["name"] for b in res["plan"]["buckets"]]
    assert res["hash"].startswith("sha256:") and len(res["hash"]) == 7 + 64
    assert len(res["buckets_hash"]) == 16
    assert "schedule:" in res["text"]


def test_hash_is_the_same_for_the_same_plan(planner):
    g = load(STEP)
    a = planner.plan(g, passes=["reshard", "blocks", "overlap"])
    b = planner.plan(json.dumps(g), passes="reshard,blocks,overlap")
    c = planner.plan(g, passes="blocks,overlap")
    assert a == b
    assert a["hash"] != c["hash"]
    assert "graph" not in planner.plan(g, passes="")


def test_budget_refuses_the_chunk_rewrite(planner):
    g = load(TRAINER)
    free = planner.plan(g, passes="chunk")["plan"]
    assert free["peak_bytes_after"] > free["peak_bytes_before"]
    budget = free["peak_bytes_before"] + 1
    tight = planner.plan(g, passes="chunk", peak_budget_bytes=budget)
    assert "refused" in tight["plan"]["passes"][0]["refused"]
    assert tight["plan"]["peak_bytes_after"] == free["peak_bytes_before"]
    assert "graph" not in tight
    ok = planner.plan(g, passes="chunk", peak_budget_bytes=free["peak_bytes_after"])
    assert ok["plan"]["passes"][0].get("refused") is None
    assert ok["plan"]["peak_bytes_after"] == free["peak_bytes_after"]


@pytest.mark.parametrize("graph, opts, want", [
    ("{}", {}, "schema"),
    (None, {"passes": "blocks,fuse"}, 'unknown pass "fuse"'),
    (None, {"peak_budget": 1}, 'unknown field "peak_budget"'),
    (None, {"peak_budget_bytes": -5}, "negative"),
])
def test_errors_name_what_was_wrong(planner, graph, opts, want):
    from gorun._lib import GorunError
    with pytest.raises(GorunError) as e:
        planner.plan(graph if graph is not None else load(STEP), **opts)
    assert e.value.status == "GORUN_ERR_INVALID"
    assert want in str(e.value)
