"""Rank program of test_torch2_diag.py. ``desync``: a torch program whose
two ranks part ways on purpose, so that its flight records can be checked
for the torch calls that issued each collective; under gorun on 2 ranks,
each rank prints "RANK r: DESYNC status=... msg=..." and exits 1.
``trace [exit]``: the same calls without parting, then a barrier, for
GORUN_TRACE; it prints "trace ok".
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import gorun

# The torch calls both ranks make before they part, in order: the names
# the flight records must carry (test_torch2_diag.py reads them from here).
COMMON = ["all_reduce", "all_reduce", "all_reduce_coalesced", "broadcast", "all_gather", "all_to_all_single",
          "all_reduce", "reduce_scatter_tensor"]
# The call each rank makes where they part.
PART = {0: "reduce_scatter_tensor", 1: "all_gather_into_tensor"}


def say(text):
    os.write(1, ("RANK %d: %s\n" % (dist.get_rank(), text)).encode())


def common(n):
    t = torch.ones(8)
    dist.all_reduce(t)  # the synchronous fast path
    dist.all_reduce(t, async_op=True).wait()
    dist.all_reduce_coalesced([torch.ones(4), torch.ones(3)])
    dist.broadcast(t, 0)
    dist.all_gather([torch.empty(8) for _ in range(n)], t)
    dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n))
    funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
    dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * n))


def case_desync():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gorun")
    rank, n = dist.get_rank(), dist.get_world_size()
    common(n)
    try:
        if rank == 0:
            dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * n))
        else:
            dist.all_gather_into_tensor(torch.empty(4 * n), torch.ones(4))
        say("DESYNC none")
    except gorun.GorunError as e:
        say("DESYNC status=%s msg=%s" % (e.status, e))
    # Stay a moment: rank 0 is its host's rendezvous leader, and its exit
    # would tell a rank that has not yet read the desync that rank 0 is gone.
    # Then fail, as a program that does not catch the error does: gorun
    # prints the ranks' merged flight records for a failed job.
    time.sleep(2)
    os._exit(1)


def case_trace():
    """A plain torch.distributed program: GORUN_TRACE alone makes its trace.
    With "exit" it leaves without destroy_process_group."""
    dist.init_process_group("gorun")
    common(dist.get_world_size())
    dist.barrier()
    if sys.argv[2:] != ["exit"]:
        dist.destroy_process_group()
    os.write(1, b"trace ok\n")


if __name__ == "__main__":
    {"desync": case_desync, "trace": case_trace}[sys.argv[1]]()
