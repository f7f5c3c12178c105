"""Rank program of test_ft_torch.py: a small GPT trained with gorun.ft under
``gorun -np 3 --fault-tolerant``, printing what the tests check.

    ftprog.py CASE[,CASE...] STEPS

Every replica prints, one line each ("RANK r: ..."):
  START inc=I                      its incarnation
  QUORUM step=S id=Q parts=P healed=H digest=D   after each quorum; D is the
                                   SHA-256 of parameters and optimizer state
  COMMIT step=S ok=B               S: the step attempted (1-based)
  DDP world=N step=S               (case ddp) gorun.torch's model was made
                                   for a quorum of N and reduced step S
  FAIL ...                         a bfloat16 sum or float32 average over the
                                   quorum was not what its participants add up to
  DONE step=S digest=D             at the end: at step STEPS or later, in
                                   the first quorum of every replica
  HOLDING                          (FT_HOLD=1) replica 1's first process
                                   committed step FT_AT and waits to be
                                   killed by the test
  FINISHED inc=I                   a replacement that came after the others
                                   finished (gorun.ft.JobFinished, said on
                                   stderr); exits 0

CASE picks the failures the program brings on itself (the launcher's
--inject brings the others), once per job (a marker file in FT_MARKS):
  plain      none
  midstep    replica 1 dies in step FT_AT after its allreduce, before it
             votes: the survivors' allreduce completed, the step must still
             not be committed
  source     replica 0 dies inside state_dict, i.e. while it serves a heal
  healer     a replica dies inside load_state_dict, i.e. while it heals
  lastdie    replica 1 dies after DONE: its replacement finds the job
             finished
  badbatch   a configuration error: every replica raises ValueError at
             start (a global batch of 16 that does not divide by the
             replicas), which a replacement would repeat
  ddp        (not a failure) gradients go through gorun.ft's
             DistributedDataParallel (gorun.torch's ddp mode over the
             quorum) instead of Manager.allreduce_grads
"""

import hashlib
import os
import signal
import sys
import time

import torch

from tinymodels import GPT

import gorun.ft
from ftcommon import once, quorum_or_leave, say

CASES, STEPS = set(sys.argv[1].split(",")), int(sys.argv[2])
AT = int(os.environ.get("FT_AT", "4"))
MARKS = os.environ["FT_MARKS"]
WAIT_S = float(os.environ.get("FT_WAIT_S", "120"))  # how long a replica waits for the others to be back
PACE = float(os.environ.get("FT_PACE_S", "0"))  # a pause after each step (soak runs)
HOLD = os.environ.get("FT_HOLD") == "1"  # replica 1's first process stops after step FT_AT (to be killed)


def digest(model, opt):
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            h.update(("%s/%s" % (pid, k)).encode())
            h.update(v.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def check_reductions(m, q, r):
    """allreduce's contract on values every participant can predict: a
    bfloat16 sum and a float32 average over exactly this quorum's
    participants (replica r contributes r + 1)."""
    b = m.allreduce(torch.full((5,), r + 1.0, dtype=torch.bfloat16), op="sum")
    f = m.allreduce(torch.full((7,), r + 1.0), op="avg")
    if m.errored() is not None:
        return  # a participant died in this step: the values are undefined
    want = sum(p + 1.0 for p in q.participants)
    if not (b == want).all() or not (f == want / len(q.participants)).all():
        say(r, "FAIL reductions over %s: bf16 sum %s (want %s), f32 avg %s (want %s)" % (
            q.participants, b.tolist(), want, f.tolist(), want / len(q.participants)))


def check_no_groups(m, r):
    """Without --fault-tolerant-group every rank is a replica: a group of
    one, and the group calls say so rather than run."""
    if (m.group_size, m.group_rank) != (1, 0):
        say(r, "FAIL group size %d, place %d without replica groups (want 1, 0)" % (m.group_size, m.group_rank))
    try:
        m.group_comm()
        say(r, "FAIL group_comm() gave a handle without replica groups")
    except gorun.ft.GorunError as e:
        if "no replica groups" not in str(e):
            say(r, "FAIL group_comm() without replica groups: %s" % e)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(vocab=64, d=32, heads=4, layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    m = None

    def state_dict():
        if "source" in CASES and m.replica == 0 and once(MARKS, "source"):
            say(m.replica, "DYING serving a heal")
            os.kill(os.getpid(), signal.SIGKILL)
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        if "healer" in CASES and once(MARKS, "healer"):
            say(m.replica, "DYING healing")
            os.kill(os.getpid(), signal.SIGKILL)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    m = gorun.ft.Manager(state_dict=state_dict, load_state_dict=load_state_dict, timeout=60)
    ddp = gorun.ft.DistributedDataParallel(m, model) if "ddp" in CASES else None
    r = m.replica
    say(r, "START inc=%d" % m.incarnation)
    if "badbatch" in CASES and 16 % m.replicas:
        raise ValueError("global batch 16 does not divide by %d replicas" % m.replicas)
    check_no_groups(m, r)
    deadline = time.monotonic() + WAIT_S
    seen_group = None
    while True:
        q = quorum_or_leave(m, r)
        step = m.current_step()
        say(r, "QUORUM step=%d id=%d parts=%s healed=%s digest=%s" % (
            step, q.id, ",".join(map(str, q.participants)), q.healed, digest(model, opt)))
        opt.zero_grad()
        g = torch.Generator().manual_seed(1000 * r + step)
        tokens = torch.randint(0, 64, (2, 16), generator=g)
        if ddp is not None:
            ok = ddp.backward(ddp(tokens, torch.roll(tokens, -1, dims=1)))
            if ok and ddp._group != seen_group:
                seen_group = ddp._group
                say(r, "DDP world=%d step=%d" % (ddp._model.world_size, step + 1))
        else:
            model(tokens, torch.roll(tokens, -1, dims=1)).backward()
            m.allreduce_grads(model.parameters())
        check_reductions(m, q, r)
        if "midstep" in CASES and r == 1 and step + 1 == AT and once(MARKS, "midstep"):
            say(r, "DYING in step %d" % (step + 1))
            os.kill(os.getpid(), signal.SIGKILL)
        ok = m.should_commit()
        say(r, "COMMIT step=%d ok=%s" % (step + 1, ok))
        if ok:
            opt.step()
        if HOLD and r == 1 and m.incarnation == 0 and ok and m.current_step() == AT:
            say(r, "HOLDING")
            while True:
                time.sleep(1)
        if PACE:
            time.sleep(PACE)
        # Done at STEPS, but only with a step committed by every replica,
        # so that a replica lost late is healed before the end. Every
        # participant sees the same quorum, step and verdict, so all stop
        # together.
        if ok and m.current_step() >= STEPS and len(q.participants) == m.replicas:
            break
        if len(q.participants) < m.replicas:
            # Someone is being restarted: leave the two cores to its
            # start-up rather than race ahead by hundreds of steps.
            time.sleep(0.05)
        if time.monotonic() > deadline:
            say(r, "FAIL no step committed by all %d replicas in %d s (at step %d)" % (m.replicas, WAIT_S,
                                                                                       m.current_step()))
            sys.exit(1)
    say(r, "DONE step=%d digest=%s" % (m.current_step(), digest(model, opt)))
    if "lastdie" in CASES and r == 1 and once(MARKS, "lastdie"):
        os.kill(os.getpid(), signal.SIGKILL)
    m.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
