"""gorun.ft under `gorun -np 3 --fault-tolerant`, real processes, real kills:

- heal: a replica killed by gorun (--inject kill:...:after-steps) is restarted
  and heals from the live ones: at its first quorum its parameters and
  optimizer state are bitwise the survivors' at that step, and every replica
  ends with the same digest; killed again after its last step, its next
  replacement finds the job finished;
- quorum: a step in which a participant died after its allreduce, before its
  vote, is committed nowhere;
- survivors lose no steps: each commits steps 1, 2, 3, ... with no step
  committed twice or rolled back, and fails at most the step a death fell in;
- a kill of a heal's source, and a kill of the healing replica, inside the
  heal: the heal is retried and ends bitwise equal;
- a deterministic start-up error ends the job at once, naming it, instead of
  replacing replicas until the failure budget is spent;
- a replacement that comes after the others finished is told so
  (gorun.ft.JobFinished), says it and exits 0 (in the heal test);
- every step, a bfloat16 sum and a float32 average come out as exactly the
  quorum's participants add up to (ftprog prints FAIL otherwise).

The rank program is ftprog.py."""

import os
import re
import subprocess
import sys

from conftest import PYDIR

PROG = os.path.join(os.path.dirname(__file__), "ftprog.py")
NP = 3


def run(launcher, tmp_path, case, steps, inject=(), at=4, timeout=150, gorun_flags=()):
    marks = tmp_path / "marks"
    marks.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYDIR, os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    env["GORUN_LIB"] = launcher.lib
    env["FT_MARKS"] = str(marks)
    env["FT_AT"] = str(at)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    flags = list(gorun_flags)
    for spec in inject:
        flags += ["--inject", spec]
    cmd = [launcher.gorun, "-np", str(NP), "--fault-tolerant", "--timeout", "%ds" % timeout, *flags,
           sys.executable, PROG, case, str(steps)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout + 30)
    return p.returncode, p.stdout.decode(errors="replace")


def lines(out, what):
    """(replica, {key: value}) for every "RANK r: WHAT k=v ..." line, in order."""
    got = []
    for m in re.finditer(r"^RANK (\d+): %s (.*)$" % what, out, re.M):
        got.append((int(m.group(1)), dict(kv.split("=", 1) for kv in m.group(2).split())))
    return got


def check_job(code, out, steps, died, deaths):
    """The promises every case keeps; died: the replicas that lost a
    process, deaths: how many processes died. Returns the QUORUM lines."""
    tail = out[-6000:]
    assert code == 0, tail
    assert "FAIL" not in out, tail
    done = {}
    for r, kv in lines(out, "DONE"):
        done[r] = kv
    assert sorted(done) == list(range(NP)), tail
    assert len({kv["digest"] for kv in done.values()}) == 1, ("replicas ended different", done, tail)
    assert len({kv["step"] for kv in done.values()}) == 1, ("replicas ended at different steps", done, tail)
    assert int(done[0]["step"]) >= steps, tail
    starts = lines(out, "START")
    for r in died:
        assert any(sr == r and kv["inc"] != "0" for sr, kv in starts), ("replica %d was not restarted" % r, tail)
    quorums = lines(out, "QUORUM")
    # Every heal left the healed replica bitwise equal to the replicas it
    # joined: its digest at its first quorum is theirs at that step.
    healed = [(r, kv) for r, kv in quorums if kv["healed"] == "True"]
    assert len(healed) >= len(died), ("fewer heals than lost replicas", healed, tail)
    for r, kv in healed:
        others = {okv["digest"] for orr, okv in quorums
                  if orr != r and okv["step"] == kv["step"] and okv["id"] == kv["id"]}
        assert others, ("no other replica reported quorum %s at step %s" % (kv["id"], kv["step"]), tail)
        assert others == {kv["digest"]}, ("replica %d healed to a state its peers do not hold" % r, kv, others, tail)
    # Survivors: steps committed in order, none twice, none rolled back.
    for r in range(NP):
        if r in died:
            continue
        commits = lines(out, "COMMIT")
        mine = [int(kv["step"]) for rr, kv in commits if rr == r and kv["ok"] == "True"]
        assert mine == list(range(1, len(mine) + 1)), ("replica %d committed out of order" % r, mine, tail)
        failed = [int(kv["step"]) for rr, kv in commits if rr == r and kv["ok"] == "False"]
        # At most the step each death fell in is done again.
        assert len(failed) <= deaths, ("replica %d failed %d steps for %d deaths" % (r, len(failed), deaths),
                                       failed, tail)
    return quorums


def test_heal_after_kill_is_bitwise_equal(launcher, tmp_path):
    # Then (lastdie) the healed replica 1 dies after its last step: by the
    # time its next replacement has imported torch the others have
    # finished, so it is told JobFinished, says so and exits 0, and the
    # job succeeds.
    code, out = run(launcher, tmp_path, "plain,lastdie", 12, inject=["kill:rank=1:after-steps=4"])
    check_job(code, out, 12, died={1}, deaths=2)
    tail = out[-6000:]
    fin = lines(out, "FINISHED")
    assert [r for r, _ in fin] == [1] and fin[0][1]["inc"] == "2", ("the late replacement did not finish cleanly", tail)
    assert "the other replicas finished the job" in out, tail
    assert "found the job finished" in out, tail


def test_step_a_participant_died_in_is_not_committed(launcher, tmp_path):
    at = 5
    # Gradients go through gorun.torch's ddp mode over the quorum here
    # (gorun.ft.DistributedDataParallel), the other tests use allreduce.
    code, out = run(launcher, tmp_path, "midstep,ddp", 10, at=at)
    check_job(code, out, 10, died={1}, deaths=1)
    for r in (0, 2):
        worlds = [kv["world"] for rr, kv in lines(out, "DDP") if rr == r]
        # Made for all three, again for the two survivors, and again when
        # the replacement was back.
        assert worlds[:3] == ["3", "2", "3"], ("replica %d: gorun.torch models for worlds %s" % (r, worlds),
                                               out[-6000:])
    assert "RANK 1: DYING in step %d" % at in out, out[-6000:]
    commits = lines(out, "COMMIT")
    for r in (0, 2):
        verdicts = [kv["ok"] for rr, kv in commits if rr == r and kv["step"] == str(at)]
        # The step was attempted with replica 1 in it (and failed), then
        # redone without it (and committed).
        assert verdicts[0] == "False", ("replica %d committed step %d, in which replica 1 died" % (r, at), verdicts,
                                        out[-6000:])
        assert verdicts.count("True") == 1, (r, verdicts, out[-6000:])
        failed = [kv["step"] for rr, kv in commits if rr == r and kv["ok"] == "False"]
        assert failed == [str(at)], ("survivor %d lost more than the step of the death" % r, failed, out[-6000:])


def test_kill_of_heal_source_and_of_healer(launcher, tmp_path):
    # Replica 1 is killed after step 3; its replacement's heal loses a
    # source (replica 0 dies serving it), then the replacement itself dies
    # loading the state; the heals are retried until replicas 0 and 1 are
    # back, bitwise equal.
    code, out = run(launcher, tmp_path, "source,healer", 10, inject=["kill:rank=1:after-steps=3"])
    check_job(code, out, 10, died={0, 1}, deaths=3)
    assert "RANK 0: DYING serving a heal" in out, out[-6000:]
    assert "RANK 1: DYING healing" in out, out[-6000:]


def test_startup_error_ends_the_job(launcher, tmp_path):
    # Every replica raises the same configuration error at start: gorun
    # ends the job at the first failure, with budget left, and no
    # replacement is started.
    code, out = run(launcher, tmp_path, "badbatch", 10, gorun_flags=["--max-failures", "5"])
    tail = out[-6000:]
    assert code != 0, tail
    assert "ValueError: global batch 16 does not divide by 3 replicas" in out, tail
    assert "start-up failure" in out, tail
    incs = {kv["inc"] for _, kv in lines(out, "START")}
    assert incs <= {"0"}, ("a replacement was started for a start-up error", incs, tail)
