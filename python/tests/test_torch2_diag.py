"""Diagnosis of torch programs: the flight records of a torch program over
gorun name the torch call that issued each collective, in the dump files
and in the table gorun prints when the ranks disagree."""

import glob
import json
import os
import re
import subprocess
import sys

from conftest import PYDIR

sys.path.insert(0, os.path.dirname(__file__))
import torch2diagprog  # noqa: E402

PROG = os.path.join(os.path.dirname(__file__), "torch2diagprog.py")


def run_gorun(launcher, np, case, *flags, extra_env=None):
    env = dict(os.environ, PYTHONPATH=PYDIR, GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra_env or {})
    p = subprocess.run([launcher.gorun, "-np", str(np), "--timeout", "120s", *flags, sys.executable, PROG, case],
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
