"""Fault-tolerant torch training three ways, the same model and failures,
side by side: total time to N steps, steps lost by survivors, time to heal.

  torchft   torchft 0.2.0's Manager + DDP over gloo, R replica processes, its
            lighthouse in this process; a replica that dies is started again
            by this script's supervisor loop (torchft leaves restarts to a
            supervisor such as torchx or SLURM) and heals from a live peer.
  ft        gorun -np R --fault-tolerant: gorun.ft's Manager, gradients
            averaged over the quorum on gorun's collectives; gorun restarts
            the dead rank and it heals from the live ones (bench/ft/gorunft_prog.py).
  ftfork    ft, with gorun's fork server (GORUN_FT_FORK_SERVER=1): a
            replacement is forked from a process that already imported torch
            (and torch._dynamo); its heal_s counts from the moment the server
            began forking it (GORUN_FT_FORKED_AT), both forks included.
  ckpt      gorun -np R --max-restarts K: torch DDP over gorun's backend; every
            failure stops the world, which restarts from the last checkpoint
            (written every FT_CKPT_EVERY steps).

Each program reports JSON events (bench/ft/ftmodel.py); the figures:

  total_s    the job's wall time, first process started to last one done:
             N steps, and (fault-tolerant modes) at least one more step
             once every replica is back, so each mode ends with the whole job
  lost       steps survivors did that did not count: their step attempts
             beyond the step they ended at (uncommitted steps, and steps
             redone after a checkpoint reload), the largest over the survivors
  heal_s     a replacement process's start (its first line, before torch is
             imported; for a forked one, the server's start of the fork) to
             its first committed step, median over the failures
  join_s     the replacement's "ready" (torch imported, model built) to its
             first committed step: the framework's own part of the heal
             (join, quorum, state transfer, first step), without Python's
  down_s     the failure (the kill) to the replacement's first committed step
  stall_s    the longest a survivor went between two committed steps
  equal      every replica's final parameters and optimizer state hash alike

and where a replacement's heal_s goes, phase by phase (medians over the
failures; a phase a mode does not report is "-"):

  import     process start to torch imported (torchft: and torchft)
  gorun      gorun.ft imported (libgorun is loaded later, by the Manager)
  model      the model built
  optim      its optimizer built (the first optimizer a process makes
             imports torch._dynamo: the timeline's "dynamo" column says at
             which event it had been imported)
  join       the framework's Manager made (gorun: libgorun loaded, the
             quorum service reached; torchft: its store, manager server,
             process group and DDP wrapper)
  wait       to the heal's load_state_dict being called: the state
             received (gorun: the first start_quorum waits for the
             survivors' next quorum, then receives the sharded state)
  load       load_state_dict itself
  quorum     gorun: the rest of the first start_quorum
  step       from there to the first committed step (torchft: its quorum
             and heal run inside this step, so its wait and load do too)

Each run also records the 1-minute load average at its start: the machine
is shared, and the replacement's import competes with whatever else runs.

    python3 bench/ft/run.py --modes torchft,ft,ftfork,ckpt --runs 3 --steps 600 --kills 1:110,2:370

Rounds alternate the modes, so each sees the same load; prints the medians
and the ratios to torchft. The machine is shared: figures are noisy.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MODES = ("torchft", "ft", "ftfork", "ckpt")


def parse_events(lines):
    out = []
    for line in lines:
        i = line.find("FTEV ")
        if i < 0:
            continue
        try:
            out.append(json.loads(line[i + 5:]))
        except ValueError:
            continue  # a line cut short by a kill
    return out


class Reader:
    """Collects one child's stdout lines on a thread it owns; join() waits."""

    def __init__(self, proc, log):
        self.lines = []
        self._log = log
        self._t = threading.Thread(target=self._run, args=(proc,), daemon=True)
        self._t.start()

    def _run(self, proc):
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            self._log.write(line)

    def join(self):
        self._t.join()


def child_env(extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "python"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def run_torchft(a, marks, log):
    """R torchft replicas under a supervisor loop; returns (events, wall)."""
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse logs every quorum request at info
    from torchft.coordination import LighthouseServer

    lh = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=a.join_timeout_ms,
                          quorum_tick_ms=100, heartbeat_timeout_ms=a.heartbeat_timeout_ms)
    procs, readers, restarts = {}, [], 0
    t0 = time.time()

    def start(r):
        env = child_env({"TORCHFT_LIGHTHOUSE": lh.address(), "FT_MARKS": marks, "FT_KILLS": a.kills,
                         "FT_REPLICAS": str(a.replicas),
                         "FT_REPLICA": str(r), "GORUN_RESTART_COUNT": str(restarts)})
        p = subprocess.Popen([a.python, os.path.join(HERE, "torchft_replica.py"), str(r), str(a.steps)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        readers.append(Reader(p, log))
        procs[r] = p

    try:
        for r in range(a.replicas):
            start(r)
        # The supervisor: a replica that died is started again; one that
        # finished is left; the job ends when every replica has finished.
        while procs:
            for r, p in list(procs.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del procs[r]
                if rc != 0:
                    if rc > 0 or restarts >= a.max_restarts:
                        raise RuntimeError("torchft replica %d exited with %d (see %s)" % (r, rc, log.name))
                    restarts += 1
                    start(r)
            time.sleep(0.01)
        wall = time.time() - t0
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        for rd in readers:
            rd.join()
        lh.shutdown()
    return parse_events(line for rd in readers for line in rd.lines), wall


def run_gorun(a, mode, marks, ckdir, log):
    """gorun -np R (--fault-tolerant | --max-restarts K); returns (events, wall)."""
    gorun = os.environ.get("GORUN_BIN", os.path.join(ROOT, "bin", "gorun"))
    extra = {"FT_MARKS": marks, "FT_KILLS": a.kills, "FT_CKPT_DIR": ckdir, "FT_CKPT_EVERY": str(a.ckpt_every)}
    extra.setdefault("GORUN_LIB", os.environ.get("GORUN_LIB", os.path.join(ROOT, "bin", "libgorun.so")))
    if mode == "ftfork":
        extra["GORUN_FT_FORK_SERVER"] = "1"
    if mode in ("ft", "ftfork"):
        cmd = [gorun, "-np", str(a.replicas), "--fault-tolerant", "--timeout", "%ds" % a.timeout,
               a.python, os.path.join(HERE, "gorunft_prog.py"), str(a.steps)]
    else:
        cmd = [gorun, "-np", str(a.replicas), "--max-restarts", str(a.max_restarts), "--timeout", "%ds" % a.timeout,
               a.python, os.path.join(HERE, "ckpt_prog.py"), str(a.steps)]
    t0 = time.time()
    p = subprocess.Popen(cmd, env=child_env(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rd = Reader(p, log)
    rc = p.wait()
    rd.join()
    wall = time.time() - t0
    if rc != 0:
        raise RuntimeError("%s: gorun exited with %d (see %s)" % (mode, rc, log.name))
    return parse_events(rd.lines), wall


def figures(events, wall, steps, kills):
    """The figures of one run from its events (see the module doc)."""
    killed = {r for r, _ in kills}
    by_pid, order = {}, []
    for e in events:
        if e["pid"] not in by_pid:
            by_pid[e["pid"]] = []
            order.append(e["pid"])
        by_pid[e["pid"]].append(e)
    replicas = {}
    for pid in order:
        evs = by_pid[pid]
        r = next((e["replica"] for e in evs if "replica" in e), None)
        replicas.setdefault(r, []).append(evs)
    lost, stall, heal, join, down, digests = 0, 0.0, [], [], [], {}
    phases = {k: [] for k in PHASES}
    marks, dynamo, forked = {}, [], []
    kill_events = sorted((e["t"], e["replica"]) for e in events if e["ev"] == "kill")
    for r, incs in replicas.items():
        for evs in incs:
            for e in evs:
                if e["ev"] == "done":
                    digests[r] = e["digest"]
        # Each kill's replacement: the first process of the killed replica
        # that started after the kill (under --max-restarts every replica
        # restarts; only the killed one's new process is its replacement).
        for t_kill, kr in kill_events:
            if kr != r:
                continue
            for evs in incs:
                start = next((e["t"] for e in evs if e["ev"] == "start"), None)
                if start is None or start < t_kill:
                    continue
                ready = next((e["t"] for e in evs if e["ev"] == "ready"), None)
                first = next((e["t"] for e in evs if e["ev"] == "step" and e["committed"]), None)
                if first is not None:
                    heal.append(first - start)
                    down.append(first - t_kill)
                    if ready is not None:
                        join.append(first - ready)
                    for k, v in phase_times(evs, start, first).items():
                        phases[k].append(v)
                    when, dyn = timeline(evs, start, first)
                    for k, v in when.items():
                        marks.setdefault(k, []).append(v)
                    dynamo.append(dyn or "-")
                    forked.append(bool(next((e.get("forked") for e in evs if e["ev"] == "start"), False)))
                break
        if r in killed:
            continue
        attempts = sum(1 for evs in incs for e in evs if e["ev"] == "step")
        final = max([e["step"] for evs in incs for e in evs if e["ev"] == "done"] or [steps])
        lost = max(lost, attempts - final)
        ts = sorted(e["t"] for evs in incs for e in evs if e["ev"] == "step" and e["committed"])
        stall = max([stall] + [b - a for a, b in zip(ts, ts[1:])])
    done = len(digests)
    return {
        "total_s": wall, "lost": lost, "stall_s": stall,
        "heal_s": statistics.median(heal) if heal else None,
        "join_s": statistics.median(join) if join else None,
        "down_s": statistics.median(down) if down else None,
        "heals": len(heal), "done": done, "equal": done > 0 and len(set(digests.values())) == 1,
        "phases": {k: statistics.median(v) for k, v in phases.items() if v},
        "timeline": {k: statistics.median(v) for k, v in marks.items() if v},
        "dynamo_at": dynamo, "forked": forked,
    }


# The replacement's timeline: each reported event, in the order a
# replacement reaches them, and the phase that ends at it.
TIMELINE = (("torch", "import"), ("gorun", "gorun"), ("model", "model"), ("optim", "optim"),
            ("joined", "join"), ("state", "wait"), ("healed", "load"), ("quorum", "quorum"),
            ("first", "step"))
PHASES = tuple(p for _, p in TIMELINE)


def phase_times(evs, start, first):
    """A replacement's heal_s cut at the events it reported (see the module
    doc): each phase from the previous reported event to its own."""
    out, prev = {}, start
    for ev, k in TIMELINE:
        t = marks_of(evs, first).get(ev)
        if t is None:
            continue
        out[k] = t - prev
        prev = t
    return out


def marks_of(evs, first):
    """The time of each timeline event a process reported (its first)."""
    at = {}
    for e in evs:
        at.setdefault(e["ev"], e["t"])
    at["first"] = first
    return at


def timeline(evs, start, first):
    """Seconds from the process's start to each timeline event, and the
    first event by which torch._dynamo had been imported (None: never)."""
    at = marks_of(evs, first)
    when = {ev: at[ev] - start for ev, _ in TIMELINE if at.get(ev) is not None}
    dyn = next((e["ev"] for e in evs if e.get("dynamo")), None)
    return when, dyn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="torchft,ft,ftfork,ckpt")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--kills", default="1:110,2:370", help="REPLICA:STEP,... (each a SIGKILL after that step)")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--max-restarts", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600, help="seconds, per job")
    ap.add_argument("--join-timeout-ms", type=int, default=10000,
                    help="torchft lighthouse: wait for stragglers (its train_ddp example's 10000)")
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=5000, help="torchft lighthouse (its default 5000)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--keep", help="keep the runs' logs in this directory")
    ap.add_argument("--reread", metavar="JSON", help="no runs: recompute the figures from the logs of an earlier "
                    "--keep DIR --json JSON run (its wall times, its arguments)")
    a = ap.parse_args()
    if a.reread:
        reread(a.reread)
        return
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error("--modes: unknown mode %r (want %s)" % (m, ", ".join(MODES)))
    kills = [tuple(int(x) for x in k.split(":")) for k in a.kills.split(",") if k]
    for r, s in kills:
        if not (0 <= r < a.replicas and 0 < s < a.steps):
            ap.error("--kills %d:%d: want a replica below %d and a step below %d" % (r, s, a.replicas, a.steps))
    logdir = a.keep or tempfile.mkdtemp(prefix="bench-ft-")
    os.makedirs(logdir, exist_ok=True)
    results = {m: [] for m in modes}
    try:
        for i in range(a.runs):
            for m in (modes[i % len(modes):] + modes[:i % len(modes)]):
                work = tempfile.mkdtemp(prefix="bench-ft-job-")
                marks, ckdir = os.path.join(work, "marks"), os.path.join(work, "ckpt")
                os.makedirs(marks)
                os.makedirs(ckdir)
                load = os.getloadavg()[0]
                try:
                    with open(os.path.join(logdir, "%s-%d.log" % (m, i)), "w") as log:
                        if m == "torchft":
                            events, wall = run_torchft(a, marks, log)
                        else:
                            events, wall = run_gorun(a, m, marks, ckdir, log)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                f = figures(events, wall, a.steps, kills)
                f["load"] = load
                results[m].append(f)
                print("run %d %-8s %s" % (i, m, json.dumps(f, sort_keys=True)), flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(logdir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "results": results}, fh, indent=1)
    report(a, modes, results)


def reread(path):
    with open(path) as fh:
        doc = json.load(fh)
    a = argparse.Namespace(**doc["args"])
    modes = [m for m in a.modes.split(",") if m]
    kills = [tuple(int(x) for x in k.split(":")) for k in a.kills.split(",") if k]
    results = {}
    for m in modes:
        results[m] = []
        for i, old in enumerate(doc["results"][m]):
            with open(os.path.join(a.keep, "%s-%d.log" % (m, i)), errors="replace") as log:
                f = figures(parse_events(log), old["total_s"], a.steps, kills)
            f["load"] = old.get("load")
            results[m].append(f)
            print("run %d %-8s %s" % (i, m, json.dumps(f, sort_keys=True)))
    report(a, modes, results)


def report(a, modes, results):
    med = {}
    for m in modes:
        med[m] = {}
        for k in ("total_s", "lost", "heal_s", "join_s", "down_s", "stall_s"):
            vals = [f[k] for f in results[m] if f[k] is not None]
            med[m][k] = statistics.median(vals) if vals else None
    print("\nmedians of %d runs; %d replicas, %d steps, kills %s, checkpoint every %d steps" %
          (a.runs, a.replicas, a.steps, a.kills, a.ckpt_every))
    print("%-8s %9s %6s %8s %8s %8s %8s %6s" % ("mode", "total_s", "lost", "heal_s", "join_s", "down_s", "stall_s",
                                                 "equal"))
    for m in modes:
        eq = all(f["equal"] for f in results[m])
        print("%-8s %9s %6s %8s %8s %8s %8s %6s" % (m, *(fmt(med[m][k]) for k in
                                                       ("total_s", "lost", "heal_s", "join_s", "down_s", "stall_s")), eq))
    print("\nwhere a replacement's heal_s goes (medians over runs of each run's median)")
    cols = PHASES + ("load",)
    line = "%-8s" + " %7s" * len(cols)
    print(line % ("mode", *cols))
    for m in modes:
        row = [median_of(results[m], "phases", k) for k in PHASES]
        loads = [f["load"] for f in results[m] if f.get("load") is not None]
        row.append(statistics.median(loads) if loads else None)
        print(line % (m, *(fmt(v) for v in row)))
    print("\nthe replacement's timeline: seconds from its process's start (for a forked one, the server's"
          " start of the fork)"
          "\nto each event, medians over runs of each run's median; dynamo: the first event by which"
          "\ntorch._dynamo was imported")
    names = tuple(ev for ev, _ in TIMELINE)
    line = "%-8s" + " %7s" * len(names) + "  %s"
    print(line % ("mode", *names, "dynamo"))
    for m in modes:
        row = [median_of(results[m], "timeline", k) for k in names]
        dyn = sorted({d for f in results[m] for d in f.get("dynamo_at", [])})
        forked = sum(x for f in results[m] for x in f.get("forked", []))
        heals = sum(len(f.get("forked", [])) for f in results[m])
        print(line % (m, *(fmt(v) for v in row), ",".join(dyn) + ("  (forked %d/%d)" % (forked, heals)
                                                                  if forked else "")))
    if "torchft" in modes:
        for m in modes:
            if m == "torchft":
                continue
            print("%s / torchft: %s" % (m, ", ".join("%s %s" % (k, ratio(med[m][k], med["torchft"][k]))
                                                     for k in ("total_s", "heal_s", "join_s", "down_s", "stall_s"))))


def median_of(runs, key, k):
    vals = [f[key][k] for f in runs if k in f.get(key, {})]
    return statistics.median(vals) if vals else None


def fmt(v):
    if v is None:
        return "-"
    return "%.3f" % v if isinstance(v, float) else str(v)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    return "%.2fx" % (a / b)


if __name__ == "__main__":
    main()
