"""gorun.export: a small transformer's training step, traced as one joint
graph (forward, loss, backward, SGD), written as a step graph and planned
by the real `gorun plan`."""

import json
import os
import subprocess
import sys

import pytest
import torch

import gorun.export as ex
from conftest import PYDIR, ROOT
from tinymodels import Transformer, transformer

HERE = os.path.dirname(os.path.abspath(__file__))


def plan(launcher, graph, tmp_path, passes):
    path = tmp_path / "step.json"
    ex.save(graph, str(path))
    p = subprocess.run([launcher.gorun, "plan", "--json", "--passes", passes, str(path)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def test_dp_step_graph_has_blocks_and_one_all_reduce_per_gradient(launcher, tmp_path):
    model, x = transformer()
    params = {n: p.numel() for n, p in model.named_parameters()}
    # Without the profile every op costs 1 ns: the planner's choices below
    # do not move with the machine's load.
    g = ex.step_graph(model, x, world_size=4, mode="dp", profile=False)
    assert g["schema"] == "gorun.stepgraph/v1"
    assert g["regions"] == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    by = {(n["kind"], n.get("direction"), n.get("region")) for n in g["nodes"] if n["kind"] == "compute"}
    for r in g["regions"]:
        assert ("compute", "forward", r) in by and ("compute", "backward", r) in by, r
    # the traced backward visits the blocks in reverse order
    bwd = []
    for n in g["nodes"]:
        if n["kind"] == "compute" and n.get("direction") == "backward" and (not bwd or bwd[-1] != n["region"]):
            bwd.append(n["region"])
    assert bwd == list(reversed(g["regions"]))
    starts = [n for n in g["nodes"] if n["kind"] == "start"]
    assert len(starts) == len(params)
    assert all(s["op"] == "all_reduce" and s["direction"] == "backward" and s["group"] == "dp" for s in starts)
    assert sorted(m["bytes"] for s in starts for m in s["members"]) == sorted(4 * n for n in params.values())
    # a block's gradients are reduced in its own region
    assert {s["region"] for s in starts} == set(g["regions"])
    assert sum(1 for s in starts if s["region"] == "layers.1") == sum(1 for n in params if n.startswith("layers.1."))
    out = plan(launcher, g, tmp_path, "blocks,overlap")
    assert 0 < len(out["buckets"]) < len(starts), "bucketing should merge per-parameter collectives"
    assert out["estimate"]["After"]["collectives"] == len(out["buckets"])


def test_sharded_step_graph_gathers_ahead_and_reduce_scatters(launcher, tmp_path):
    model, x = transformer()
    nparams = len(list(model.parameters()))
    n = 4
    g = ex.step_graph(model, x, world_size=n, mode="sharded")
    # costs are measured, not guessed: the matmuls took more than a nanosecond
    assert max(nd["cost_ns"] for nd in g["nodes"] if nd["kind"] == "compute") > 1
    g = ex.step_graph(model, x, world_size=n, mode="sharded", profile=False)
    ag = [s for s in g["nodes"] if s["kind"] == "start" and s["op"] == "all_gather"]
    rs = [s for s in g["nodes"] if s["kind"] == "start" and s["op"] == "reduce_scatter"]
    assert len(ag) == len(rs) == nparams
    assert all(s["direction"] == "forward" for s in ag) and all(s["direction"] == "backward" for s in rs)
    for s in ag + rs:
        for m in s["members"]:
            assert m["bytes"] % 4 == 0
    # block i+1's gathers are issued as block i's forward begins
    pos = {nd["name"]: i for i, nd in enumerate(g["nodes"])}
    first_fwd = {}
    for i, nd in enumerate(g["nodes"]):
        if nd["kind"] == "compute" and nd["direction"] == "forward":
            first_fwd.setdefault(nd["region"], i)
    l2 = [s for s in ag if s["region"] == "layers.2"]
    assert l2 and all(first_fwd["layers.0"] < pos[s["name"]] < first_fwd["layers.1"] for s in l2)
    out = plan(launcher, g, tmp_path, "reshard,blocks,overlap")
    assert any(b["op"] == "all_gather" and b["direction"] == "backward" for b in out["buckets"]), \
        "reshard should gather again for backward"
    assert out["peak_bytes_after"] < out["peak_bytes_before"]


def test_tied_weights_are_one_parameter_read_by_several_regions():
    from tinymodels import gpt
    model, (tokens, labels) = gpt(layers=2)

    class LM(torch.nn.Module):  # the exporter's model takes one input
        def __init__(self):
            super().__init__()
            self.gpt = model

        def forward(self, t):
            return self.gpt(t, torch.roll(t, -1, dims=1))

    lm = LM()
    blocks = ["gpt.tok_embeddings", "gpt.layers.0", "gpt.layers.1", "gpt.norm", "gpt.output"]
    g = ex.step_graph(lm, tokens, world_size=2, mode="sharded", blocks=blocks, profile=False)
    ag = [s for s in g["nodes"] if s["kind"] == "start" and s["op"] == "all_gather"]
    # model.parameters() lists the tied weight once; so does the graph
    assert model.output.weight is model.tok_embeddings.weight
    assert len(ag) == len(list(model.parameters()))
    emb = [s for s in ag if s["region"] == "gpt.tok_embeddings"]
    assert len(emb) == 1
    out = emb[0]["members"][0]["out"]
    regions = {n["region"] for n in g["nodes"] if n["kind"] == "compute" and out in n.get("reads", [])}
    assert {"gpt.tok_embeddings", "gpt.output"} <= regions


def test_cli_writes_a_graph_that_gorun_plan_reads(launcher, tmp_path):
    out = tmp_path / "cli.json"
    env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + HERE, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "gorun.export", "tinymodels:transformer", "-o", str(out),
                        "--world-size", "2", "--mode", "sharded"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.returncode == 0, p.stdout.decode()
    assert b"5 regions" in p.stdout and b"78 collectives" in p.stdout
    q = subprocess.run([launcher.gorun, "plan", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert q.returncode == 0, q.stdout.decode()


def test_untraceable_model_and_bad_arguments_raise_clearly():
    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            if x.sum() > 0:  # a branch on a value fake tensors do not have
                return self.lin(x)
            return x

    with pytest.raises(ex.ExportError, match="cannot trace DataDependent's training step"):
        ex.step_graph(DataDependent(), torch.ones(2, 4), profile=False)
    model, x = transformer()
    with pytest.raises(ex.ExportError, match="mode 'zero3'"):
        ex.step_graph(model, x, mode="zero3")
    with pytest.raises(ex.ExportError, match="world_size 0"):
        ex.step_graph(model, x, world_size=0)
