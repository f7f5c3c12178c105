"""Diagnosis of torch programs: the flight records of a torch program over
gorun name the torch call that issued each collective, in the dump files
and in the table gorun prints when the ranks disagree."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import PYDIR

sys.path.insert(0, os.path.dirname(__file__))
import torch2diagprog  # noqa: E402

PROG = os.path.join(os.path.dirname(__file__), "torch2diagprog.py")


def run_gorun(launcher, np, case, *flags, prog_args=(), extra_env=None):
    env = dict(os.environ, PYTHONPATH=PYDIR, GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra_env or {})
    p = subprocess.run([launcher.gorun, "-np", str(np), "--timeout", "120s", *flags, sys.executable, PROG, case, *prog_args],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    return p.returncode, p.stdout.decode(errors="replace")


def test_desync_dump_names_the_torch_call_on_each_rank(launcher, tmp_path):
    code, out = run_gorun(launcher, 2, "desync", "--output-dir", str(tmp_path))
    assert code != 0, out[-6000:]  # the ranks fail on purpose
    got = dict(re.findall(r"RANK (\d): DESYNC (.*)", out))
    assert sorted(got) == ["0", "1"], out[-6000:]
    for r, text in got.items():
        assert text.startswith("status=GORUN_ERR_DESYNC"), (r, text)
    dumps = {}
    for f in glob.glob(os.path.join(str(tmp_path), "flight", "flight-*.json")):
        with open(f) as fh:
            d = json.load(fh)
        dumps[d["rank"]] = d
    assert sorted(dumps) == [0, 1], "want one dump per rank in %s:\n%s" % (tmp_path, out[-6000:])
    # comm.Kind's numbers in the JSON (comm/transport.go): AllReduce 1,
    # AllGather 2, ReduceScatter 3, Broadcast 4, AllToAll 6.
    kinds = {"all_reduce": 1, "all_reduce_coalesced": 1, "broadcast": 4, "all_gather": 2,
             "all_gather_into_tensor": 2, "all_to_all_single": 6, "reduce_scatter_tensor": 3}
    for r, d in dumps.items():
        recs = [x for x in d["records"] if not x.get("p2p")]
        want = torch2diagprog.COMMON + [torch2diagprog.PART[r]]
        assert [x.get("label", "") for x in recs] == want, (r, [(x.get("label"), x["call"]) for x in recs])
        # Each label sits on the library call it issued, in issue order.
        for x, name in zip(recs, want):
            assert x["call"]["kind"] == kinds[name], (r, name, x["call"])
        assert recs[-1]["state"] in ("running", "failed"), (r, recs[-1])  # dumped when the desync was found
    # gorun's merged table names both ranks' torch calls at the disagreement.
    m = re.search(r"first disagreement at #(\d+): (.*)", out)
    assert m, out[-6000:]
    assert int(m.group(1)) == len(torch2diagprog.COMMON) + 1, m.group(0)
    assert re.search(r"rank 0 called reduce_scatter_tensor ReduceScatter\(", m.group(2)), m.group(0)
    assert re.search(r"rank 1 called all_gather_into_tensor AllGather\(", m.group(2)), m.group(0)


def read_trace(path):
    with open(path) as f:
        d = json.load(f)
    tracks = {e["tid"]: e["args"]["name"] for e in d["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    return d, tracks


@pytest.mark.parametrize("how", ["destroy", "exit"])
def test_gorun_trace_env_writes_one_span_per_collective(launcher, tmp_path, how):
    """GORUN_TRACE=<dir>, and nothing else, makes a plain torch.distributed
    program write a Chrome/Perfetto trace per rank, closed at
    destroy_process_group or at the process's exit."""
    code, out = run_gorun(launcher, 2, "trace", prog_args=["exit"] if how == "exit" else [],
                          extra_env={"GORUN_TRACE": str(tmp_path)})
    assert code == 0 and out.count("trace ok") == 2, out[-6000:]
    want = torch2diagprog.COMMON + ["Barrier"]  # barrier carries no label: its kind names it
    for r in range(2):
        d, tracks = read_trace(os.path.join(str(tmp_path), "gorun-trace.rank%d.json" % r))
        world = [t for t, n in tracks.items() if n == "world"]
        assert len(world) == 1, tracks
        spans = [e for e in d["traceEvents"] if e["ph"] == "X" and e["tid"] == world[0]]
        assert [e["name"] for e in spans] == want, (r, [e["name"] for e in spans])
        assert [e["args"]["seq"] for e in spans] == list(range(1, len(want) + 1)), (r, spans)
        assert all(e["pid"] == r and e["dur"] > 0 and e["args"]["state"] == "done" for e in spans), (r, spans)
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(spans, spans[1:])), "spans overlap or go back: %s" % spans
        # Waits behind an earlier call, when any, are on the world's
        # queued track, each before its call's start.
        queued = [t for t, n in tracks.items() if n == "world: queued"]
        starts = {e["args"]["seq"]: e["ts"] for e in spans}
        for e in d["traceEvents"]:
            if e["ph"] == "X" and e["tid"] != world[0]:
                assert e["tid"] in queued and e["ts"] + e["dur"] <= starts[e["args"]["seq"]] + 1, e


def test_gorun_trace_env_naming_a_missing_directory_fails_init(launcher, tmp_path):
    missing = os.path.join(str(tmp_path), "nowhere", "t")
    code, out = run_gorun(launcher, 2, "trace", extra_env={"GORUN_TRACE": missing})
    assert code != 0, out[-6000:]
    assert "GORUN_TRACE" in out and "nowhere" in out and "does not exist" in out, out[-6000:]
