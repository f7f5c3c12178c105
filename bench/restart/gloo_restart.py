"""Kill-and-restart benchmark program, the same under gorun and torchrun.

In the first world (TORCHELASTIC_RESTART_COUNT=0) rank 2 prints
"kill t=<unix time>" and SIGKILLs itself KILL_AFTER seconds after its
process group formed; the launcher must stop the world and start a new one.
In the new world rank 0 prints "first-step restart=1 t=<unix time>" after its
first all-reduce, the ranks do STEPS all-reduces and exit 0.
scripts/bench-restart.sh reads the two lines.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

KILL_AFTER = float(os.environ.get("KILL_AFTER", "1.0"))
STEPS = int(os.environ.get("STEPS", "20"))

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
formed = time.time()
step = 0
while True:
    dist.all_reduce(t)
    step += 1
    if step == 1 and rank == 0:
        print(f"first-step restart={restart} t={time.time():.6f}", flush=True)
    if restart == 0 and rank == 2 and time.time() - formed >= KILL_AFTER:
        print(f"kill t={time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if restart > 0 and step >= STEPS:
        break
    if restart == 0:
        time.sleep(0.005)
dist.destroy_process_group()
sys.exit(0)
