"""One replica group (of one process) trained with torchft 0.2.0's Manager.

The anchor for gorun --fault-tolerant on torch: torchft's own pattern, as
in its train_ddp example. Each replica has its own TCPStore (the replica
group's, hosted here since the group is this one process), a
ProcessGroupGloo that the Manager reconfigures at every quorum change, and
torchft's DistributedDataParallel, whose comm hook averages the gradients
over the quorum's participants. Before the forward pass a quorum is
started (the optimizer wrapper's zero_grad); after backward the step is
applied only if should_commit agrees. A replacement process heals from a
live peer (torchft's HTTP checkpoint transport) at its first quorum.

    TORCHFT_LIGHTHOUSE=http://host:port python3 torchft_replica.py REPLICA STEPS

bench/ft/run.py starts the lighthouse and restarts a replica that died.
"""

import ftmodel

ftmodel.started()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo  # noqa: E402

ftmodel.event("torch", replica=int(sys.argv[1]))


def main():
    replica, steps = int(sys.argv[1]), int(sys.argv[2])
    timeout = timedelta(seconds=float(os.environ.get("FT_TIMEOUT_S", "10")))
    torch.set_num_threads(1)
    model, opt = ftmodel.build()
    ftmodel.event("ready", replica=replica)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def load_state_dict(sd):
        ftmodel.event("state", replica=ftmodel.replica_id())
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        ftmodel.event("healed", replica=ftmodel.replica_id())

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        replica_id="bench_%d" % replica,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        timeout=timeout,
        quorum_timeout=timeout * 3,
        connect_timeout=timeout,
    )
    ddp = DistributedDataParallel(manager, model)
    ftmodel.event("joined", replica=replica)
    replicas = int(os.environ["FT_REPLICAS"])
    deadline = time.monotonic() + ftmodel.WAIT_S
    while True:
        step = manager.current_step()
        manager.start_quorum()
        opt.zero_grad()
        tokens, labels = ftmodel.batch(replica, step)
        ddp(tokens, labels).backward()
        committed = manager.should_commit()
        if committed:
            opt.step()
        ftmodel.event("step", replica=replica, step=step + 1 if committed else step, committed=committed,
                      participants=manager.num_participants())
        if committed:
            ftmodel.maybe_die(replica, step + 1)
        if ftmodel.finished(committed, manager.current_step(), steps, manager.num_participants(), replicas, deadline):
            break
    ftmodel.event("done", replica=replica, step=manager.current_step(), digest=ftmodel.digest(model, opt))
    manager.shutdown(wait=False)
    sys.stdout.flush()
    # torch 2.15's gloo can abort in the interpreter's teardown after a
    # finished run; the report is written, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
