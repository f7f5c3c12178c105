"""Rank program of test_ft_hsdp.py: HSDP's shape under gorun.ft, in plain
torch. Run as

    gorun -np 4 --fault-tolerant --fault-tolerant-group 2 python3 ft_hsdp_prog.py STEPS

Two replica groups of two ranks. A small MLP's flat parameters are sharded
in two within each group: each rank holds one shard (and AdamW's state for
it). Each step a rank all-gathers the full parameters over its group,
computes the gradient on its own batch, reduce-scatters it over the group
(its shard's gradient, averaged within the group) and averages that across
the groups with the Manager (the quorum's participants are the ranks at
its place in every live group). A heal copies a rank's shard state from
the rank at its place in a live group.

Every rank prints, one line each ("RANK r: ..."):
  START inc=I
  QUORUM step=S id=Q parts=P healed=H digest=D   D: SHA-256 of the shard
                                   and its AdamW state, after the quorum
  COMMIT step=S ok=B inc=I         S: the step attempted (1-based)
  DYING in step S                  (rank FT_DIE) about to kill itself in
                                   step S, after its allreduce, before its vote
  DONE step=S digest=D

FT_DIE=r (with FT_AT=N and FT_MARKS, a directory): rank r kills itself once,
in the first step >= N whose quorum holds every group (after a quorum with a
heal in it, if FT_DIE_AFTER_HEAL is set); no rank finishes before it did.
"""

import hashlib
import os
import signal
import sys
import time

import torch

import gorun.ft
from ftcommon import once, quorum_or_leave, say

STEPS = int(sys.argv[1])
DIE = int(os.environ.get("FT_DIE", "-1"))
AT = int(os.environ.get("FT_AT", "0"))
MARKS = os.environ.get("FT_MARKS", "")
WAIT_S = float(os.environ.get("FT_WAIT_S", "90"))


def bad_sizes(m, r, chunk):
    """The group calls refuse buffers of the wrong size, naming them."""
    for what, call in (("all_gather", lambda: m.group_all_gather(torch.empty(chunk), torch.empty(chunk))),
                       ("reduce_scatter", lambda: m.group_reduce_scatter(torch.empty(chunk), torch.empty(chunk)))):
        try:
            call()
            say(r, "FAIL group_%s took buffers of the wrong size" % what)
        except ValueError as e:
            if "want %d" % (chunk * m.group_size) not in str(e):
                say(r, "FAIL group_%s: %s" % (what, e))


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)

    m = None
    shard = opt = None

    def digest():
        h = hashlib.sha256()
        h.update(shard.detach().numpy().tobytes())
        for pid, st in opt.state_dict()["state"].items():
            for k, v in st.items():
                h.update(("%s/%s" % (pid, k)).encode())
                h.update(v.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]

    def state_dict():
        return {"shard": shard.detach(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        with torch.no_grad():
            shard.copy_(sd["shard"])
        opt.load_state_dict(sd["optim"])

    m = gorun.ft.Manager(state_dict=state_dict, load_state_dict=load_state_dict, timeout=60)
    r, S, gi = m.replica, m.group_size, m.group_rank
    if S < 2:
        say(r, "FAIL run me under --fault-tolerant-group S with S > 1 (group size %d)" % S)
        sys.exit(1)
    chunk = -(-numel // S)
    flat = torch.zeros(chunk * S)
    flat[:numel] = torch.nn.utils.parameters_to_vector(params).detach()
    shard = torch.nn.Parameter(flat[gi * chunk:(gi + 1) * chunk].clone())
    opt = torch.optim.AdamW([shard], lr=1e-2)
    groups = m.replicas // S
    say(r, "START inc=%d" % m.incarnation)

    deadline = time.monotonic() + WAIT_S
    seen_heal = False
    while True:
        q = quorum_or_leave(m, r)
        seen_heal = seen_heal or q.healed or q.sources > 0
        step = m.current_step()
        say(r, "QUORUM step=%d id=%d parts=%s healed=%s digest=%s" % (
            step, q.id, ",".join(map(str, q.participants)), q.healed, digest()))
        if step == 0 and q.changed:
            bad_sizes(m, r, chunk)
        # The full parameters, gathered over the group.
        full = m.group_all_gather(torch.empty(chunk * S), shard.detach())
        if m.errored() is None and not torch.equal(full[gi * chunk:(gi + 1) * chunk], shard.detach()):
            say(r, "FAIL the all-gather put this rank's shard elsewhere than at its group place %d" % gi)
        torch.nn.utils.vector_to_parameters(full[:numel], params)
        model.zero_grad()
        g = torch.Generator().manual_seed(1000 * r + step)
        x = torch.randn(8, 16, generator=g)
        torch.nn.functional.mse_loss(model(x), torch.sin(x)).backward()
        grad = torch.zeros(chunk * S)
        grad[:numel] = torch.cat([p.grad.reshape(-1) for p in params])
        shard.grad = m.group_reduce_scatter(torch.empty(chunk), grad, op="avg")
        m.allreduce(shard.grad, op="avg")  # this shard, across the groups
        if (r == DIE and step + 1 >= AT and len(q.participants) == groups
                and (seen_heal or not os.environ.get("FT_DIE_AFTER_HEAL")) and once(MARKS, "die")):
            say(r, "DYING in step %d" % (step + 1))
            os.kill(os.getpid(), signal.SIGKILL)
        ok = m.should_commit()
        say(r, "COMMIT step=%d ok=%s inc=%d" % (step + 1, ok, m.incarnation))
        if ok:
            opt.step()
        died = DIE < 0 or os.path.exists(os.path.join(MARKS, "die"))
        if ok and m.current_step() >= STEPS and len(q.participants) == groups and died:
            break
        if len(q.participants) < groups:
            time.sleep(0.05)  # a group is restarting: leave it the cores
        if time.monotonic() > deadline:
            say(r, "FAIL no step committed by all %d groups in %d s" % (groups, WAIT_S))
            sys.exit(1)
    say(r, "DONE step=%d digest=%s" % (m.current_step(), digest()))
    m.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
