"""gorun.ft with replica groups (HSDP's shape) under
``gorun -np 4 --fault-tolerant --fault-tolerant-group 2``, real processes,
real kills. The rank program is ft_hsdp_prog.py: a small MLP's flat
parameters sharded in two within each group (all-gather and
reduce-scatter over the group's communicator), each shard's gradient
averaged across the groups by the Manager, AdamW on the shard.

One job, two failures:
- gorun kills rank 1 after step 3 (--inject): its whole group (ranks 0
  and 1) is restarted, and each new rank heals its shard from the rank at
  its place in the other group;
- later, once that heal happened, rank 3 kills itself in a step after its
  cross-group allreduce and before its vote: that step is committed
  nowhere, group 1 is restarted and heals from the healed group 0.

Checked: after every heal, the healed rank's shard state (the shard and
its AdamW moments) is bitwise the state of the rank at its place in the
other group at that step; at the end the two groups hold bitwise equal
shards at every place (and the two places hold different shards); the
step rank 3 died in was not committed by anyone who saw it; the ranks that
lived through a failure committed their steps in order, losing at most
the step the failure fell in."""

import os
import re
import subprocess
import sys

from conftest import PYDIR

PROG = os.path.join(os.path.dirname(__file__), "ft_hsdp_prog.py")
NP, GROUP = 4, 2


def lines(out, what):
    """(rank, {key: value}) for every "RANK r: WHAT k=v ..." line, in order."""
    got = []
    for m in re.finditer(r"^RANK (\d+): %s (.*)$" % what, out, re.M):
        got.append((int(m.group(1)), dict(kv.split("=", 1) for kv in m.group(2).split())))
    return got


def test_replica_group_heal_and_commit(launcher, tmp_path):
    steps, timeout = 10, 90
    marks = tmp_path / "marks"
    marks.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYDIR, env.get("PYTHONPATH", "")])
    env["GORUN_LIB"] = launcher.lib
    env.update(FT_MARKS=str(marks), FT_DIE="3", FT_AT="6", FT_DIE_AFTER_HEAL="1", OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    cmd = [launcher.gorun, "-np", str(NP), "--fault-tolerant", "--fault-tolerant-group", str(GROUP),
           "--timeout", "%ds" % timeout, "--inject", "kill:rank=1:after-steps=3",
           sys.executable, PROG, str(steps)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout + 30)
    out = p.stdout.decode(errors="replace")
    tail = out[-6000:]
    assert p.returncode == 0, tail
    assert "FAIL" not in out, tail

    # Both groups were restarted whole, once each.
    starts = lines(out, "START")
    for r in range(NP):
        incs = sorted(kv["inc"] for rr, kv in starts if rr == r)
        assert incs == ["0", "1"], ("rank %d started as incarnations %s, want 0 and 1" % (r, incs), tail)

    # Every heal: the healed rank's shard state is the state of the rank at
    # its place in the other group, in the same quorum.
    quorums = lines(out, "QUORUM")
    healed = [(r, kv) for r, kv in quorums if kv["healed"] == "True"]
    assert sorted(r for r, _ in healed) == list(range(NP)), ("want one heal per rank", healed, tail)
    for r, kv in healed:
        peers = {okv["digest"] for orr, okv in quorums
                 if orr != r and orr % GROUP == r % GROUP and okv["step"] == kv["step"] and okv["id"] == kv["id"]}
        assert peers, ("nobody at rank %d's place reported quorum %s at step %s" % (r, kv["id"], kv["step"]), tail)
        assert peers == {kv["digest"]}, ("rank %d healed to a shard state its peer does not hold" % r, kv, peers,
                                         tail)

    # At the end: same step everywhere, each shard bitwise equal across the
    # groups, and the two shards different (each place holds its own).
    done = dict(lines(out, "DONE"))
    assert sorted(done) == list(range(NP)), tail
    assert len({kv["step"] for kv in done.values()}) == 1, ("ranks ended at different steps", done, tail)
    assert int(done[0]["step"]) >= steps, tail
    for r in range(GROUP, NP):
        assert done[r]["digest"] == done[r % GROUP]["digest"], (
            "rank %d's shard differs from rank %d's" % (r, r % GROUP), done, tail)
    assert done[0]["digest"] != done[1]["digest"], ("both places hold the same shard", done, tail)

    # The step rank 3 died in (after its allreduce, before its vote) was not
    # committed: group 0 saw it fail, then did it again without group 1.
    died = re.search(r"^RANK 3: DYING in step (\d+)$", out, re.M)
    assert died, tail
    at = died.group(1)
    commits = lines(out, "COMMIT")
    for r in (0, 1):
        verdicts = [kv["ok"] for rr, kv in commits if rr == r and kv["step"] == at]
        assert verdicts and verdicts[0] == "False", (
            "rank %d committed step %s, in which rank 3 died" % (r, at), verdicts, tail)
        assert verdicts.count("True") == 1, (r, verdicts, tail)
    assert not [kv for rr, kv in commits if rr in (2, 3) and kv["inc"] == "0" and kv["step"] == at and
                kv["ok"] == "True"], ("group 1 committed the step its rank 3 died in", tail)

    # Ranks that lived through a failure: steps committed in order, none
    # twice, and at most the step of the failure lost.
    for r in range(NP):
        for inc in ("0", "1"):
            mine = [kv for rr, kv in commits if rr == r and kv["inc"] == inc]
            ok = [int(kv["step"]) for kv in mine if kv["ok"] == "True"]
            if ok:
                assert ok == list(range(ok[0], ok[0] + len(ok))), (
                    "rank %d incarnation %s committed out of order" % (r, inc), ok, tail)
            failed = [kv["step"] for kv in mine if kv["ok"] == "False"]
            assert len(failed) <= 1, ("rank %d incarnation %s failed steps %s" % (r, inc, failed), tail)
