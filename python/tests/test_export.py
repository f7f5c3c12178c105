"""gorun.export: a small transformer's training step, traced with torch.fx,
written as a step graph and planned by the real `gorun plan`."""

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
    g = ex.step_graph(model, x, world_size=4, mode="dp")
    assert g["schema"] == "gorun.stepgraph/v1"
    assert g["regions"] == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    by = {(n["kind"], n.get("direction"), n.get("region")) for n in g["nodes"] if n["kind"] == "compute"}
    for r in g["regions"]:
        assert ("compute", "forward", r) in by and ("compute", "backward", r) in by, r
    # backward compute runs blocks in reverse order
    bwd = [n["region"] for n in g["nodes"] if n["kind"] == "compute" and n.get("direction") == "backward"]
    assert bwd == list(reversed(g["regions"]))
    starts = [n for n in g["nodes"] if n["kind"] == "start"]
    params = dict(model.named_parameters())
    assert len(starts) == len(params)
    assert all(s["op"] == "all_reduce" and s["direction"] == "backward" for s in starts)
    assert sum(m["bytes"] for s in starts for m in s["members"]) == sum(4 * p.numel() for p in params.values())
    # a block's gradients are reduced in its own region, right after its backward
    assert {s["region"] for s in starts if "layers.1." in s["name"]} == {"layers.1"}
    out = plan(launcher, g, tmp_path, "blocks,overlap")
    assert 0 < len(out["buckets"]) < len(starts), "blocks should merge per-parameter collectives"
    assert out["estimate"]["After"]["collectives"] == len(out["buckets"])


def test_sharded_step_graph_gathers_ahead_and_reduce_scatters(launcher, tmp_path):
    model, x = transformer()
    n = 4
    g = ex.step_graph(model, x, world_size=n, mode="sharded")
    ag = [s for s in g["nodes"] if s["kind"] == "start" and s["op"] == "all_gather"]
    rs = [s for s in g["nodes"] if s["kind"] == "start" and s["op"] == "reduce_scatter"]
    assert [s["name"] for s in ag] == ["ag." + r for r in g["regions"]]
    assert len(rs) == len(list(model.parameters()))
    for s in ag:
        for m in s["members"]:
            assert m["in"].endswith(".shard") and m["bytes"] % 4 == 0
    # block i+1's gather starts in block i's region (hidden behind its compute)
    assert ag[2]["region"] == g["regions"][1]
    out = plan(launcher, g, tmp_path, "reshard,blocks,overlap")
    assert any(b["op"] == "all_gather" and b["direction"] == "backward" for b in out["buckets"]), \
        "reshard should gather again for backward"


def test_cli_writes_a_graph_that_gorun_plan_reads(launcher, tmp_path):
    out = tmp_path / "cli.json"
    env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + HERE, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "gorun.export", "tinymodels:transformer", "-o", str(out),
                        "--world-size", "2", "--mode", "sharded"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.returncode == 0, p.stdout.decode()
    assert b"5 regions" in p.stdout
    q = subprocess.run([launcher.gorun, "plan", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert q.returncode == 0, q.stdout.decode()


def test_untraceable_model_and_bad_arguments_raise_clearly():
    class Branches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            if x.sum() > 0:  # fx cannot branch on a Proxy's value
                return self.lin(x)
            return x

    with pytest.raises(ex.ExportError, match="cannot trace Branches"):
        ex.step_graph(Branches(), torch.ones(2, 4))
    model, x = transformer()
    with pytest.raises(ex.ExportError, match="mode 'zero3'"):
        ex.step_graph(model, x, mode="zero3")
    with pytest.raises(ex.ExportError, match="world_size 0"):
        ex.step_graph(model, x, world_size=0)
