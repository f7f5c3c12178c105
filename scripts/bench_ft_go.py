#!/usr/bin/env python3
"""Fault-tolerant training against restarts from a checkpoint, on the Go trainer.

Runs, alternately and REPS times each, the same job with the same kills:
  ft:       gorun --fault-tolerant ... trainer --mode dp --fault-tolerant
  restart:  gorun --max-restarts K ... trainer --mode dp --checkpoint DIR --checkpoint-every C
and prints the medians of the total time to N steps, the steps lost (computed
and thrown away or done again) and the time from each kill to the job
training again (ft: the replacement's heal done; restart: the first step
of the next world), with the ratios.

Usage: bench_ft_go.py GORUN TRAINER [--np 4] [--steps 60] [--kills 20,40] [--reps 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd):
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("command failed (%d): %s\n%s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-2000:], p.stderr[-2000:]))
    return wall, p.stdout


def ft_run(a, tmp, kills):
    rep = os.path.join(tmp, "ft.json")
    cmd = [a.gorun, "-np", str(a.np), "--fault-tolerant", "--max-failures", str(len(kills)), "--report", rep, "--tag-output"]
    for k in kills:
        cmd += ["--inject", "kill:rank=1:after-steps=%d" % k]
    cmd += [a.trainer, "--mode", "dp", "--fault-tolerant", "--steps", str(a.steps), "--batch", str(a.batch)]
    wall, out = run(cmd)
    r = json.load(open(rep))["fault_tolerance"]
    heal = [f["time_to_heal_s"] for f in (r["failures"] or []) if f.get("time_to_heal_s") is not None]
    if len(heal) != len(kills):
        sys.exit("ft: %d of %d failures healed:\n%s" % (len(heal), len(kills), json.dumps(r, indent=1)))
    states = {l.split()[-1] for l in out.splitlines() if " state " in l}
    if len(states) != 1:
        sys.exit("ft: the replicas ended with different states: %s" % states)
    return wall, r["uncommitted_steps"], heal


def restart_run(a, tmp, kills):
    rep = os.path.join(tmp, "restart.json")
    ck = tempfile.mkdtemp(dir=tmp)
    cmd = [a.gorun, "-np", str(a.np), "--max-restarts", str(len(kills)), "--report", rep, "--tag-output"]
    for k in kills:
        cmd += ["--inject", "kill:rank=1:after-steps=%d" % k]
    cmd += [a.trainer, "--mode", "dp", "--deterministic", "--steps", str(a.steps), "--batch", str(a.batch),
            "--checkpoint", ck, "--checkpoint-every", str(a.every)]
    wall, out = run(cmd)
    r = json.load(open(rep))
    rec = [f["time_to_recover_s"] for f in r["faults"] if f.get("time_to_recover_s") is not None]
    if len(rec) != len(kills):
        sys.exit("restart: %d of %d faults recovered:\n%s" % (len(rec), len(kills), json.dumps(r["faults"], indent=1)))
    done = sum(1 for l in out.splitlines() if l.startswith("[0] step "))
    return wall, done - a.steps, rec


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gorun")
    p.add_argument("trainer")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--kills", default="20,45")
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps (restart mode)")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    a.kills = [int(k) for k in a.kills.split(",")]
    res = {"ft": [], "restart": [], "ft0": [], "restart0": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.reps):
            res["ft0"].append(ft_run(a, tmp, []))
            res["restart0"].append(restart_run(a, tmp, []))
            res["ft"].append(ft_run(a, tmp, a.kills))
            res["restart"].append(restart_run(a, tmp, a.kills))
    med = statistics.median
    print("fault tolerance vs restarts from a checkpoint: Go trainer (default model), %d ranks, %d steps, "
          "rank 1 killed after steps %s, checkpoint every %d steps, median of %d runs each (a shared machine: noisy)"
          % (a.np, a.steps, ",".join(map(str, a.kills)), a.every, a.reps))
    print("%-28s %12s %12s %8s" % ("", "--fault-tolerant", "--max-restarts", "ratio"))
    ft_t, rs_t = med(r[0] for r in res["ft"]), med(r[0] for r in res["restart"])
    ft_0, rs_0 = med(r[0] for r in res["ft0"]), med(r[0] for r in res["restart0"])
    print("%-28s %11.2fs %13.2fs %8.2f" % ("same, no failure", ft_0, rs_0, rs_0 / ft_0))
    print("%-28s %11.2fs %13.2fs %8.2f" % ("total time to %d steps" % a.steps, ft_t, rs_t, rs_t / ft_t))
    print("%-28s %11.2fs %13.2fs %8.2f" % ("time the failures cost", ft_t - ft_0, rs_t - rs_0, (rs_t - rs_0) / max(ft_t - ft_0, 1e-3)))
    ft_l, rs_l = med(r[1] for r in res["ft"]), med(r[1] for r in res["restart"])
    print("%-28s %12g %14g" % ("steps lost (all kills)", ft_l, rs_l))
    ft_h = med(h for r in res["ft"] for h in r[2])
    rs_h = med(h for r in res["restart"] for h in r[2])
    print("%-28s %11.3fs %13.3fs %8.1f" % ("kill -> training again", ft_h, rs_h, rs_h / ft_h))
    print("(ft: kill -> the replacement healed, while the survivors never stopped; restart: kill -> first step of the next world)")


if __name__ == "__main__":
    main()
