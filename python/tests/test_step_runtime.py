"""gorun.torch under the gorun launcher: in ddp, fsdp and hsdp mode (hsdp:
shard groups of half the ranks), parameters
equal to torch's DDP over gloo (bitwise on 1 and 2 ranks, within 1e-6
relative on 4) for a GPT-like model with a tied embedding and a residual MLP
with frozen and unused parameters (also with no_sync accumulation); fsdp's
peak of gathered parameters within the plan's estimate and below the whole
model (and the whole model on steps with no_sync micro-batches, which hold
every unit gathered); and the bad-input errors. The rank program is step_prog.py."""

import os
import re
import subprocess
import sys

import pytest

from conftest import PYDIR

PROG = os.path.join(os.path.dirname(__file__), "step_prog.py")


def run(launcher, np, case, timeout=150):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    env["GORUN_LIB"] = launcher.lib
    env["GORUN_BIN"] = launcher.gorun
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    cmd = [launcher.gorun, "-np", str(np), "--timeout", "%ds" % timeout, sys.executable, PROG, case]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout + 30)
    return p.returncode, p.stdout.decode(errors="replace")


@pytest.mark.parametrize("np", [1, 2, 4])
def test_modes_match_torch_ddp(launcher, np):
    code, out = run(launcher, np, "equal")
    assert code == 0, out[-4000:]
    assert "FAIL" not in out, out[-4000:]
    want = [("ddp", k, a, str(np <= 2)) for k in ("gpt", "mlp") for a in ("False", "True")]
    sharded = ("fsdp", "hsdp") if np > 1 else ("fsdp",)
    want += [(mode, k, a, str(np <= 2)) for mode in sharded for k in ("gpt", "mlp") for a in ("False", "True")]
    for rank in range(np):
        got = re.findall(r"RANK %d: EQUAL (\w+) (\w+) accumulate=(\w+) exact=(\w+)" % rank, out)
        assert sorted(got) == sorted(want), out[-4000:]
        for mode in ("ddp",) + sharded:
            # The frozen layer never moved; the unused one kept its init.
            assert "RANK %d: UNCHANGED %s inp.weight True" % (rank, mode) in out, out[-4000:]
            assert "RANK %d: UNCHANGED %s unused.weight True" % (rank, mode) in out, out[-4000:]
        # Costs were measured again (every 4 steps) and planned from.
        for mode in ("ddp",) + sharded:
            m = re.search(r"RANK %d: REPLANNED %s gpt measured=(\d+) made=(\d+)" % (rank, mode), out)
            assert m and int(m.group(1)) >= 2 and int(m.group(2)) >= 1, out[-4000:]
        m = re.search(r"RANK %d: METRICS ddp gpt buckets=(\d+) steps=(\d+)" % rank, out)
        assert m and int(m.group(1)) >= 1 and int(m.group(2)) == 14, out[-4000:]
        for mode in sharded:
            for kind in ("gpt", "mlp"):
                m = re.search(r"RANK %d: METRICS %s %s buckets=\d+ steps=14 .* peak=(\d+) planpeak=(\d+) full=(\d+) "
                              r"copies=(\d+)" % (rank, mode, kind), out)
                assert m, out[-4000:]
                peak, plan, full, copies = map(int, m.groups())
                # Every gradient landed in its view of the flat gradient.
                assert copies == 0, (mode, kind, copies)
                m = re.search(r"RANK %d: PEAK %s %s accumulate=False peak=(\d+) planpeak=(\d+) full=(\d+)"
                              % (rank, mode, kind), out)
                assert m, out[-4000:]
                peak, plan, full = map(int, m.groups())
                # Gathered parameters at peak: within the plan's estimate,
                # and (reshard after forward) well under the whole model.
                assert 0 < peak <= plan < full, (mode, kind, peak, plan, full)
                # Steps with no_sync micro-batches count them: every unit
                # stays gathered through those, so the peak is the model.
                m = re.search(r"RANK %d: PEAK %s %s accumulate=True peak=(\d+) planpeak=\d+ full=(\d+)"
                              % (rank, mode, kind), out)
                assert m, out[-4000:]
                assert int(m.group(1)) == int(m.group(2)) == full, (mode, kind, m.groups(), full)


def test_bf16_parameters(launcher):
    code, out = run(launcher, 2, "bf16")
    assert code == 0, out[-4000:]
    assert "FAIL" not in out, out[-4000:]
    for rank in range(2):
        got = re.findall(r"RANK %d: EQUAL (\w+) mlp accumulate=(\w+) exact=(\w+)" % rank, out)
        # ddp: bitwise; the sharded modes within 1e-2 relative (bf16).
        assert sorted(got) == sorted([("ddp", "False", "True"), ("ddp", "True", "True"), ("fsdp", "False", "False"),
                                      ("fsdp", "True", "False"), ("hsdp", "False", "False"),
                                      ("hsdp", "True", "False")]), out[-4000:]


def test_bad_input_is_refused_naming_ranks_and_regions(launcher):
    code, out = run(launcher, 2, "bad", timeout=90)
    assert code == 0, out[-4000:]
    for rank, other in ((0, 1), (1, 0)):
        m = re.search(r"RANK %d: MISMATCH ranks=\[(\d)\] msg=(.*)" % rank, out)
        assert m and int(m.group(1)) == other and "rank %d has" % other in m.group(2), out[-4000:]
        m = re.search(r"RANK %d: PLANMISMATCH ranks=\[(\d)\] msg=(.*)" % rank, out)
        assert m and int(m.group(1)) == other and "disagree on the plan" in m.group(2), out[-4000:]
        for mode in ("ddp", "fsdp"):
            m = re.search(r"RANK %d: ORDER %s after=([0-9.]+) msg=(.*)" % (rank, mode), out)
            assert m, out[-4000:]
            assert float(m.group(1)) < 5.0
            assert 'region "blocks.2" entered out of the plan\'s order' in m.group(2), m.group(2)
            assert 'region "blocks.3" came before it' in m.group(2), m.group(2)
        # Plans that differ but passed no check when adopted: the executor's
        # per-step plan-hash exchange refuses the first planned step (step
        # 1, after the measured one) on every rank, naming the other.
        m = re.search(r"RANK %d: STEPCHECK ddp step=(\d+) after=([0-9.]+) ranks=\[(\d)\] msg=(.*)" % rank, out)
        assert m, out[-4000:]
        assert m.group(1) == "1" and float(m.group(2)) < 5.0 and int(m.group(3)) == other, m.groups()
        assert "plan mismatch" in m.group(4) and "rank %d has" % other in m.group(4), m.group(4)


def test_killed_rank_raises_on_every_survivor_naming_it(launcher):
    code, out = run(launcher, 3, "kill", timeout=90)
    assert code == 128 + 9, out[-4000:]
    got = re.findall(r"RANK (\d): KILLERR after=([0-9.]+) status=(\S+) lostrank=(-?\d+) msg=(.*)", out)
    assert sorted(int(g[0]) for g in got) == [0, 1], "both survivors must raise:\n" + out[-4000:]
    for rank, after, status, lost, msg in got:
        assert float(after) <= 5.0, (rank, after)
        assert status == "GORUN_ERR_PEER_LOST" and lost == "2" and "rank 2" in msg, (rank, status, lost, msg)


def test_deterministic_is_bitwise_equal_across_world_sizes_and_modes(launcher):
    # deterministic=True, micro_batches=4: ddp, fsdp and hsdp (shard groups
    # of half the ranks) at 1, 2 and 4 ranks end in the same bits.
    digests = {}
    for np in (1, 2, 4):
        code, out = run(launcher, np, "det", timeout=120)
        assert code == 0, out[-4000:]
        for mode in ("ddp", "fsdp", "hsdp"):
            got = re.findall(r"RANK (\d): DIGEST %s (\w+)" % mode, out)
            assert sorted(int(r) for r, _ in got) == list(range(np)), out[-4000:]
            digests[(mode, np)] = {d for _, d in got}
            if np == 2:
                # Forward outside no_sync on the first of 2 micro-batches: refused.
                for rank in range(np):
                    assert re.search(r"RANK %d: SPLITERR %s .*micro_batches=4 on 2 ranks.*micro-batch 1 of the step, "
                                     r"outside no_sync" % (rank, mode), out), out[-4000:]
    assert len(set.union(*digests.values())) == 1, digests


def test_parameter_unused_on_every_rank_keeps_no_gradient(launcher):
    code, out = run(launcher, 2, "unused", timeout=90)
    assert code == 0, out[-4000:]
    for rank in range(2):
        # As in DDP: no gradient where no rank made one (side: rank 0 only).
        assert "RANK %d: GRADS ours unused=False side=True" % rank in out, out[-4000:]
        assert "RANK %d: GRADS ddp unused=False side=True" % rank in out, out[-4000:]
        # AdamW's weight decay left it alone; every bit equals DDP's.
        assert "RANK %d: UNUSED differ=[] moved=False" % rank in out, out[-4000:]


def test_load_state_dict_reaches_the_shards(launcher):
    code, out = run(launcher, 2, "load", timeout=90)
    assert code == 0, out[-4000:]
    for rank in range(2):
        for mode in ("fsdp", "hsdp"):
            assert "RANK %d: LOADED %s loaded=True trained=True" % (rank, mode) in out, out[-4000:]


def test_sharded_parameter_unused_on_every_rank_keeps_no_gradient_as_fsdp2(launcher):
    code, out = run(launcher, 2, "unused_sharded", timeout=90)
    assert code == 0, out[-4000:]
    for rank in range(2):
        for name in ("ddp", "fsdp2", "fsdp", "hsdp"):
            # No gradient where no rank made one (unused, side), as in DDP and FSDP2.
            assert "RANK %d: GRADS %s unused=False side=False outp=True" % (rank, name) in out, out[-4000:]
        for name in ("fsdp", "hsdp", "fsdp2"):
            # AdamW's weight decay left them alone; every bit equals DDP's and FSDP2's.
            assert "RANK %d: UNUSEDSHARD %s differ=[] differ_fsdp2=[] moved=[]" % (rank, name) in out, out[-4000:]
