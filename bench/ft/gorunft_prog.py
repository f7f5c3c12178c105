"""The same training under `gorun --fault-tolerant`, with gorun.ft's Manager.

Every replica is one rank; the loop is torchft's (quorum, forward and
backward, gradients averaged over the participants, commit), with gorun
serving the quorum and restarting a dead replica, which heals from the live
ones at its first quorum.

    gorun -np R --fault-tolerant python3 gorunft_prog.py STEPS
"""

import ftmodel

ftmodel.started()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

ftmodel.event("torch", replica=ftmodel.replica_id())

import gorun.ft  # noqa: E402

ftmodel.event("gorun", replica=ftmodel.replica_id())


def main():
    steps = int(sys.argv[1])
    torch.set_num_threads(1)
    model, opt = ftmodel.build()

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        ftmodel.event("state", replica=ftmodel.replica_id())
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        ftmodel.event("healed", replica=ftmodel.replica_id())

    ftmodel.event("ready", replica=ftmodel.replica_id())
    m = gorun.ft.Manager(state_dict=state_dict, load_state_dict=load_state_dict)
    replica = m.replica
    ftmodel.event("joined", replica=replica)
    first = True
    deadline = time.monotonic() + ftmodel.WAIT_S
    while True:
        try:
            q = m.start_quorum()
        except gorun.ft.JobFinished:
            ftmodel.event("late", replica=replica)
            break
        if first:
            ftmodel.event("quorum", replica=replica, healed=q.healed)
            first = False
        step = m.current_step()
        opt.zero_grad()
        tokens, labels = ftmodel.batch(replica, step)
        model(tokens, labels).backward()
        m.allreduce_grads(model.parameters())
        committed = m.should_commit()
        if committed:
            opt.step()
        ftmodel.event("step", replica=replica, step=m.current_step(), committed=committed,
                      participants=len(q.participants), healed=q.healed)
        if committed:
            ftmodel.maybe_die(replica, m.current_step())
        if ftmodel.finished(committed, m.current_step(), steps, len(q.participants), m.replicas, deadline):
            break
    ftmodel.event("done", replica=replica, step=m.current_step(), digest=ftmodel.digest(model, opt))
    m.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
