#!/usr/bin/env python3
"""A lost host's ranks taken over by a spare host, across 4 namespace hosts.

Brings up 4 namespace hosts with sshd (tests/testhosts; root), two slots
each, and runs 4 ranks of the Go trainer on the first two (the other two
hosts are spares; the trainer's restartable mode wants a power of two
ranks). After step KILL the second host is killed whole (its agent and
its 2 ranks: --inject kill-host). Alternately, REPS times each:

  ft:       gorun --fault-tolerant ... trainer --mode dp --fault-tolerant
            the lost ranks start on the first spare and heal from the two
            survivors, which never stop;
  restart:  gorun --max-restarts 1 --min-np 4 --max-np 4 ... trainer --mode dp
            --checkpoint DIR --checkpoint-every C: the world ends and
            restarts on the hosts left (a spare among them) from the last
            checkpoint.

Prints medians of: the replacement's join after its process started (ft:
process start -> healed; restart: the new world's ranks started -> its
first step), kill -> training again (ft: -> healed; restart: -> the first
step of the next world), steps lost, total time; and the machine's load.

Usage: bench_ft_hosts.py GORUN TRAINER [--steps 200] [--kill 20] [--reps 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd):
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("command failed (%d): %s\n%s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:], p.stderr[-3000:]))
    return wall, p.stdout


def ft_run(a, tmp):
    rep = os.path.join(tmp, "ft.json")
    cmd = a.base + ["-np", "4", "--fault-tolerant", "--report", rep, "--tag-output",
                    "--inject", "kill-host:host=%s:after-steps=%d" % (a.victim, a.kill),
                    a.trainer, "--mode", "dp", "--fault-tolerant", "--steps", str(a.steps), "--batch", str(a.batch),
                    "--step-sleep", a.sleep]
    wall, out = run(cmd)
    full = json.load(open(rep))
    r = full["fault_tolerance"]
    f = r["failures"]
    inj = [x["injected_at_s"] for x in full["faults"] if x.get("injected_at_s") is not None]
    lh = r.get("lost_hosts") or []
    if len(f) != 2 or any(x.get("healed_after_start_s") is None for x in f) or not lh or not lh[0]["action"].startswith("replaced on spare host"):
        sys.exit("ft: the lost rank was not replaced on the spare and healed:\n%s" % json.dumps(r, indent=1))
    states = {l.split()[-1] for l in out.splitlines() if " state " in l}
    if len(states) != 1:
        sys.exit("ft: the replicas ended with different states: %s" % states)
    return {"wall": wall, "join": max(x["healed_after_start_s"] for x in f), "again": max(x["healed_at_s"] for x in f) - inj[0],
            "lost": r["uncommitted_steps"]}


def restart_run(a, tmp):
    rep = os.path.join(tmp, "restart.json")
    ck = tempfile.mkdtemp(dir=tmp)
    cmd = a.base + ["-np", "4", "--max-restarts", "1", "--min-np", "4", "--max-np", "4", "--report", rep, "--tag-output",
                    "--inject", "kill-host:host=%s:after-steps=%d" % (a.victim, a.kill),
                    a.trainer, "--mode", "dp", "--steps", str(a.steps), "--batch", str(a.batch),
                    "--checkpoint", ck, "--checkpoint-every", str(a.every)]
    wall, out = run(cmd)
    r = json.load(open(rep))
    rec = [x["time_to_recover_s"] for x in r["faults"] if x.get("time_to_recover_s") is not None]
    w = r["worlds"]
    if len(rec) != 1 or len(w) != 2 or w[1].get("first_step_at_s") is None or w[1].get("ranks_started_at_s") is None:
        sys.exit("restart: not one recovery into a second world:\n%s" % json.dumps(r, indent=1))
    done = sum(1 for l in out.splitlines() if l.startswith("[0,") and "] step " in l)
    return {"wall": wall, "join": w[1]["first_step_at_s"] - w[1]["ranks_started_at_s"], "again": rec[0],
            "lost": done - a.steps}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gorun")
    p.add_argument("trainer")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--kill", type=int, default=25)
    p.add_argument("--sleep", default="0s", help="the fault-tolerant trainer's pause after each step")
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps (restart mode)")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_ft_hosts: needs root (network namespaces, sshd)")
    name = ("gf%d" % os.getpid())[:8]
    env = subprocess.run(["bash", os.path.join(ROOT, "tests/testhosts/netns-up.sh"), "4", name, "--owner", str(os.getpid())],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    kv = dict(l.split("=", 1) for l in env.splitlines() if "=" in l)
    try:
        hosts = open(os.path.join(kv["STATE"], "hostfile")).read().split()
        a.victim = hosts[1]
        with tempfile.TemporaryDirectory() as tmp:
            hf = os.path.join(tmp, "hostfile")
            open(hf, "w").write("".join("%s slots=2\n" % h for h in hosts))
            a.base = [a.gorun, "--launch-agent", "ssh -F " + kv["SSH_CONFIG"], "-hostfile", hf]
            load0 = os.getloadavg()
            res = {"ft": [], "restart": []}
            for _ in range(a.reps):
                res["ft"].append(ft_run(a, tmp))
                res["restart"].append(restart_run(a, tmp))
            load1 = os.getloadavg()
    finally:
        subprocess.run(["bash", os.path.join(ROOT, "tests/testhosts/netns-down.sh"), name], stdout=subprocess.DEVNULL)
    med = lambda mode, k: statistics.median(r[k] for r in res[mode])
    print("a lost host taken over by a spare, 4 namespace hosts of 2 slots (4 ranks on 2 hosts + 2 spares), Go trainer --mode dp, %d steps, "
          "host 2 killed after step %d, checkpoint every %d steps (restart), median of %d runs each" % (a.steps, a.kill, a.every, a.reps))
    print("load average (1 min) %.1f before, %.1f after; a shared 2-core machine: noisy" % (load0[0], load1[0]))
    print("%-44s %16s %14s %7s" % ("", "--fault-tolerant", "--max-restarts", "ratio"))
    for k, what in (("join", "replacement's process start -> training"), ("again", "kill -> training again")):
        f, r = med("ft", k), med("restart", k)
        print("%-44s %15.3fs %13.3fs %7.1f" % (what, f, r, r / max(f, 1e-6)))
    print("%-44s %16g %14g" % ("steps lost (computed again or thrown away)", med("ft", "lost"), med("restart", "lost")))
    f, r = med("ft", "wall"), med("restart", "wall")
    print("%-44s %15.2fs %13.2fs %7.2f" % ("total time to %d steps" % a.steps, f, r, r / f))
    print("(kill: the fault's injection, as gorun's report has it; ft: the slower of the 2 replacements on the "
          "spare healed from the survivors, which never stopped; restart: every rank of the next world started, then its first step)")
    print("ft join times: %s" % " ".join("%.3f" % r["join"] for r in res["ft"]))


if __name__ == "__main__":
    main()
