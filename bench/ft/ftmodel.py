"""What every fault-tolerance benchmark program trains, and how it reports.

The same model, data, optimizer and failures for each way of surviving a
failure (torchft's Manager over gloo, gorun --fault-tolerant with gorun.ft,
gorun --max-restarts from a checkpoint), so their figures compare:

- the model: python/tests/tinymodels.py's GPT (tied embedding), AdamW;
- the data: replica r's batch at step s is a pure function of (r, s), so a
  step redone after a failure sees the same batch;
- the failures: FT_KILLS="R:S,R:S" makes replica R SIGKILL itself right
  after it finished (committed) step S, once per job: a marker file in
  FT_MARKS (a directory the driver makes per job) keeps the restarted
  process from dying again at the same step;
- the report: one JSON object per line on stdout, prefixed "FTEV ", with
  the wall-clock time t: {"ev": "start"} as the program's very first act
  (before torch is imported), {"ev": "torch"} once torch (and the
  framework's package, for torchft) is imported, {"ev": "model"} and
  {"ev": "optim"} once the model and its optimizer are built,
  {"ev": "ready"} once torch is imported and
  the model built, just before the framework joins (its Manager, its
  process group), {"ev": "joined"} once it has (gorun.ft also reports
  {"ev": "gorun"}, gorun.ft imported, and {"ev": "quorum"}, its first
  start_quorum returned), {"ev": "state"} and {"ev": "healed"} when the
  heal's load_state_dict is called (the state received) and has returned, {"ev": "step", "step": S, "committed": bool,
  "participants": N} after every step attempt, {"ev": "done", "digest": D}
  at the end, D being the SHA-256 of the parameters and optimizer state.
  A fault-tolerant replica ends at step N or later, in the first step all
  replicas committed (finished()).

Every event carries "dynamo": whether torch._dynamo was imported by then.

bench/ft/run.py reads those lines into the figures.
"""

import hashlib
import io
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "python", "tests")


def event(ev, t=None, **kw):
    """One report line; flushed at once so that a SIGKILL loses nothing.
    Every line says whether torch._dynamo has been imported by then, which
    is how the timeline finds the step that paid for it."""
    kw["ev"] = ev
    kw["t"] = time.time() if t is None else t
    kw["pid"] = os.getpid()
    kw["dynamo"] = "torch._dynamo" in sys.modules
    sys.stdout.write("FTEV " + json.dumps(kw, sort_keys=True) + "\n")
    sys.stdout.flush()


def replica_id():
    """This process's replica: FT_REPLICA (set by bench/ft/run.py for
    torchft's replicas), else the rank gorun gave it."""
    return int(os.environ.get("FT_REPLICA", os.environ.get("RANK", "0")))


def started():
    """The "start" event: the program's first line, or, for a process
    forked from gorun's fork server, the moment the server began forking
    it (GORUN_FT_FORKED_AT, both forks included): when the replacement's
    process began to be made."""
    forked = os.environ.get("GORUN_FT_FORKED_AT")
    event("start", t=float(forked) if forked else None, replica=replica_id(),
          incarnation=int(os.environ.get("GORUN_RESTART_COUNT", "0")), forked=bool(forked))


def build(seed=0):
    """The model and its optimizer, identical on every replica."""
    import torch

    sys.path.insert(0, TESTS)
    from tinymodels import GPT

    torch.manual_seed(seed)
    model = GPT(vocab=128, d=int(os.environ.get("FT_WIDTH", "64")), heads=4, layers=4)
    event("model", replica=replica_id())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    event("optim", replica=replica_id())
    return model, opt


def batch(replica, step, size=4, seq=32, vocab=128):
    import torch

    g = torch.Generator().manual_seed(1_000_003 * (replica + 1) + step)
    tokens = torch.randint(0, vocab, (size, seq), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def digest(model, opt):
    """SHA-256 of the parameters and the optimizer state, in a fixed order:
    equal digests mean bitwise equal state."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    st = opt.state_dict()
    for pid in sorted(st["state"]):
        for k, v in sorted(st["state"][pid].items()):
            h.update(("%s/%s" % (pid, k)).encode())
            if torch.is_tensor(v):
                h.update(v.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(v).encode())
    return h.hexdigest()[:16]


def kills():
    """FT_KILLS as [(replica, step)]."""
    out = []
    for item in filter(None, os.environ.get("FT_KILLS", "").split(",")):
        r, s = item.split(":")
        out.append((int(r), int(s)))
    return out


def maybe_die(replica, step):
    """SIGKILL this process if FT_KILLS names (replica, S) with S <= step
    (a replica that healed can skip past S) and it has not fired yet in this
    job."""
    marks = os.environ.get("FT_MARKS")
    for r, s in kills():
        if r != replica or step < s or not marks:
            continue
        mark = os.path.join(marks, "killed-%d-%d" % (r, s))
        try:
            fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        event("kill", replica=replica, step=step)
        os.kill(os.getpid(), signal.SIGKILL)


WAIT_S = 300  # how long the survivors wait, past N, for every replica to be back


def finished(committed, step, steps, participants, replicas, deadline):
    """Whether a fault-tolerant replica stops after this step: at step N or
    later, in a step every replica committed, so that a replica lost late
    is back and equal at the end and "time to N steps" means the same job
    in every mode. Every participant decides alike. Past the deadline the
    program fails rather than waits for ever."""
    if committed and step >= steps and participants == replicas:
        return True
    if time.monotonic() > deadline:
        event("fail", why="no step committed by all %d replicas in %d s" % (replicas, WAIT_S))
        sys.exit(1)
    return False


def save_bytes(obj):
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def load_bytes(data):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)
