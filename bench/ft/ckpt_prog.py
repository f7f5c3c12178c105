"""The same training under `gorun --max-restarts`: stop the world, restart
it, reload the last checkpoint.

torch's DistributedDataParallel over the process group FT_BACKEND (gorun's
backend "gorun" by default; "gloo" works too). Rank 0 writes a checkpoint
(model, optimizer, step) every FT_CKPT_EVERY steps to FT_CKPT_DIR, by an
atomic rename; every rank of a new world loads it. A failure (FT_KILLS)
stops every rank; gorun starts the world again, and the steps since the
last checkpoint are done again: those are the steps lost.

    gorun -np R --max-restarts K python3 ckpt_prog.py STEPS
"""

import ftmodel

ftmodel.started()

import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ftmodel.event("torch", replica=ftmodel.replica_id())


def main():
    steps = int(sys.argv[1])
    every = int(os.environ.get("FT_CKPT_EVERY", "20"))
    ckdir = os.environ["FT_CKPT_DIR"]
    backend = os.environ.get("FT_BACKEND", "gorun")
    if backend == "gorun":
        import gorun  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    ftmodel.event("ready", replica=ftmodel.replica_id())
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = ftmodel.build()
    path = os.path.join(ckdir, "ckpt.pt")
    step = 0
    if os.path.exists(path):
        sd = torch.load(path, weights_only=False)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        step = sd["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    while step < steps:
        opt.zero_grad()
        tokens, labels = ftmodel.batch(rank, step)
        ddp(tokens, labels).backward()
        opt.step()
        step += 1
        ftmodel.event("step", replica=rank, step=step, committed=True, participants=world)
        if rank == 0 and step % every == 0 and step < steps:
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
        ftmodel.maybe_die(rank, step)
    ftmodel.event("done", replica=rank, step=step, digest=ftmodel.digest(model, opt))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
