"""gorun.torch's hsdp mode over a gorun.ft.Manager, under
``gorun -np 4 --fault-tolerant --fault-tolerant-group 2``: real processes,
real kills. The rank program is step_prog.py's ft_hsdp case: a GPT-like
model (tied embedding, 4 blocks, a parameter on the root) sharded in two
within each replica group by distribute(mode="hsdp", manager=m), beside a
plain torch replica of it whose gradients the Manager's own calls average
over the same ranks; odd steps accumulate a no_sync micro-batch first.

One job, two failures:
- gorun kills rank 1 after step 3 (--inject): group 0 is restarted, and
  each new rank heals its shards and optimizer state from the rank at its
  place in group 1;
- after that heal, rank 3 kills itself inside a backward, while the last
  blocks' collectives are in flight: its group is restarted, and the
  survivors' step fails inside the executor, which must not raise but tell
  the Manager, so that the step is committed nowhere.

Checked: every heal leaves the healed rank's shards, whole parameters and
optimizer state bitwise those of the rank at its place in the other group;
at the end the groups hold bitwise equal shards at each place, and the
model is bitwise the plain torch replica (the gradient is the
average over every rank of every participating group, the optimizer step
is taken exactly on the committed steps); the step rank 3 died in failed
on the survivors (errored, not committed) and was then done again; the
survivors committed their steps in order."""

import os
import re
import subprocess
import sys

from conftest import PYDIR

PROG = os.path.join(os.path.dirname(__file__), "step_prog.py")
NP, GROUP = 4, 2


def records(out, what):
    """Every "RANK r: WHAT k=v ..." line as (r, {k: v}), in output order."""
    pat = re.compile(r"^RANK (\d+): %s (.*)$" % what, re.M)
    return [(int(r), dict(kv.split("=", 1) for kv in rest.split())) for r, rest in pat.findall(out)]


def test_hsdp_over_manager_heals_and_skips_failed_step(launcher, tmp_path):
    steps, timeout = 9, 150
    (tmp_path / "marks").mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYDIR, os.environ.get("PYTHONPATH", "")]),
               GORUN_LIB=launcher.lib, FT_MARKS=str(tmp_path / "marks"), FT_DIE="3", FT_AT="5",
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    flags = ["--fault-tolerant", "--fault-tolerant-group", str(GROUP), "--timeout", "%ds" % timeout,
             "--inject", "kill:rank=1:after-steps=3"]
    cmd = [launcher.gorun, "-np", str(NP)] + flags + [sys.executable, PROG, "ft_hsdp", str(steps)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout + 30)
    out = p.stdout.decode(errors="replace")
    tail = out[-6000:]
    assert p.returncode == 0, tail
    assert "FAIL" not in out and "Traceback" not in out, tail

    # What a Manager cannot go with is refused, naming it.
    for r in range(NP):
        assert "RANK %d: REFUSED mode: gorun.torch.distribute: manager= goes with mode='hsdp'" % r in out, tail
        assert re.search(r"RANK %d: REFUSED mode,shard_size: .*shard_size=4, but the Manager's replica groups have 2 "
                         r"ranks" % r, out), tail
        assert "RANK %d: REFUSED deterministic,mode: gorun.torch.distribute: deterministic=" % r in out, tail

    starts = records(out, "START")
    for r in range(NP):
        incs = sorted(kv["inc"] for rr, kv in starts if rr == r)
        assert incs == ["0", "1"], ("rank %d started as incarnations %s, want 0 and 1" % (r, incs), tail)

    quorums = records(out, "QUORUM")
    healed = [(r, kv) for r, kv in quorums if kv["healed"] == "True"]
    assert sorted(r for r, _ in healed) == list(range(NP)), ("want one heal per rank", healed, tail)
    for r, kv in healed:
        peers = {okv["digest"] for orr, okv in quorums
                 if orr != r and orr % GROUP == r % GROUP and okv["step"] == kv["step"] and okv["id"] == kv["id"]}
        assert peers, ("nobody at rank %d's place reported quorum %s" % (r, kv["id"]), tail)
        assert peers == {kv["digest"]}, ("rank %d healed to a state its peer does not hold" % r, kv, peers, tail)

    done = dict(records(out, "DONE"))
    assert sorted(done) == list(range(NP)), tail
    assert len({kv["step"] for kv in done.values()}) == 1, ("ranks ended at different steps", done, tail)
    assert int(done[0]["step"]) >= steps, tail
    for r in range(GROUP, NP):
        assert done[r]["digest"] == done[r % GROUP]["digest"], ("rank %d's shards differ from rank %d's"
                                                                % (r, r % GROUP), done, tail)
    assert done[0]["digest"] != done[1]["digest"], ("both places hold the same shards", done, tail)
    for r, kv in done.items():
        # Bitwise: the same sums in the same order (groups and quorums of
        # a power of two, so scaling before or after the sum is exact).
        assert float(kv["worst"]) == 0.0, ("rank %d: the model left the plain torch replica" % r, kv, tail)
        # An evaluation (no gradients) gathers the shards for the call.
        assert kv["eval"] == "True", ("rank %d: the evaluation's loss is not the replica's" % r, kv, tail)

    died = re.search(r"^RANK 3: DYING in step (\d+)$", out, re.M)
    assert died, tail
    at = died.group(1)
    commits = records(out, "COMMIT")
    for r in (0, 1):
        mine = [kv for rr, kv in commits if rr == r and kv["inc"] == "1" and kv["step"] == at]
        # The survivors' own step failed in the executor (a peer lost),
        # was kept (no exception), and was not committed; then redone.
        assert mine and mine[0]["ok"] == "False" and mine[0]["errored"] == "GORUN_ERR_PEER_LOST", (
            "rank %d in step %s" % (r, at), mine, tail)
        assert [kv["ok"] for kv in mine].count("True") == 1, (r, mine, tail)
        ok = [int(kv["step"]) for rr, kv in commits if rr == r and kv["inc"] == "1" and kv["ok"] == "True"]
        assert ok == list(range(ok[0], ok[0] + len(ok))), ("rank %d committed out of order" % r, ok, tail)
    assert not [kv for rr, kv in commits if rr in (2, 3) and kv["inc"] == "0" and kv["step"] == at and
                kv["ok"] == "True"], ("group 1 committed the step its rank 3 died in", tail)
