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

With --torch PYTHON the same is done for a torch program too (bench/ft's
small GPT; its libgorun from GORUN_LIB, default bin/libgorun.so), 3 ranks
of one slot each on the first three hosts and the fourth a spare: ft runs
bench/ft/gorunft_prog.py (the host is killed after step KILL), restart runs
bench/ft/ckpt_prog.py under --max-restarts 1 --min-np 3 --max-np 3 with the
host killed at the moment the ft run's kill landed (ckpt_prog does not
report steps to gorun). The torch figures come from the programs' own
timestamped events: the replacement's process start -> its first committed
step, and the part of it after the program was ready (torch imported, model
built): its join and heal.

Usage: bench_ft_hosts.py GORUN TRAINER [--steps 200] [--kill 25] [--reps 5] [--torch PYTHON]
"""
import datetime
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

sys.path.insert(0, HERE)
from bench_ft_go import run  # noqa: E402  (one timed, checked command runner for both benches)


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


def events(out):
    """The bench/ft programs' events, each with its rank from the tag."""
    evs = []
    for l in out.splitlines():
        tag, sep, rest = l.partition("] FTEV ")
        if sep:
            e = json.loads(rest)
            e["rank"] = int(tag.lstrip("[").split(",")[0])
            evs.append(e)
    return evs


def start_abs(rep):
    return datetime.datetime.fromisoformat(rep["start"][:26] + "+00:00").timestamp()


def torch_run(a, tmp, mode, at=None):
    rep = os.path.join(tmp, "torch-%s.json" % mode)
    marks = tempfile.mkdtemp(dir=tmp)
    ck = tempfile.mkdtemp(dir=tmp)
    here = os.path.join(ROOT, "bench", "ft")
    x = ["-x", "PYTHONPATH=%s:%s" % (here, os.path.join(ROOT, "python")), "-x", "GORUN_LIB=" + a.lib,
         "-x", "OMP_NUM_THREADS=1", "-x", "PYTHONWARNINGS=ignore", "-x", "FT_MARKS=" + marks,
         "-x", "FT_CKPT_DIR=" + ck, "-x", "FT_CKPT_EVERY=%d" % a.every]
    base = [a.gorun, "--launch-agent", a.ssh, "-hostfile", a.hf1, "-np", "3", "--report", rep, "--tag-output"] + x
    if mode == "ft":
        cmd = base + ["--fault-tolerant", "--inject", "kill-host:host=%s:after-steps=%d" % (a.victim1, a.kill),
                      a.torch, os.path.join(here, "gorunft_prog.py"), str(a.torch_steps)]
    else:
        cmd = base + ["--max-restarts", "1", "--min-np", "3", "--max-np", "3", "--inject", "kill-host:host=%s:at=%.3fs" % (a.victim1, at),
                      a.torch, os.path.join(here, "ckpt_prog.py"), str(a.torch_steps)]
    wall, out = run(cmd)
    full = json.load(open(rep))
    inj = [x["injected_at_s"] for x in full["faults"] if x.get("injected_at_s") is not None]
    if len(inj) != 1:
        sys.exit("torch %s: the host was not killed:\n%s" % (mode, json.dumps(full["faults"], indent=1)))
    kill = start_abs(full) + inj[0]
    evs = events(out)
    # The killed rank's process that started after the kill: its start,
    # when it was ready, and its first committed step.
    pids = [e["pid"] for e in evs if e["ev"] == "start" and e["rank"] == 1 and e["t"] > kill]
    if not pids:
        sys.exit("torch %s: no replacement of rank 1 started after the kill" % mode)
    mine = [e for e in evs if e["pid"] == pids[0]]
    t = lambda ev: next(e["t"] for e in mine if e["ev"] == ev and (ev != "step" or e["committed"]))
    done = [e for e in evs if e["ev"] == "done"]
    if mode == "ft" and len({e["digest"] for e in done}) != 1:
        sys.exit("torch ft: the replicas ended with different states")
    return {"wall": wall, "join": t("step") - t("start"), "after_ready": t("step") - t("ready"),
            "again": t("step") - kill, "inj": inj[0]}


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
    p.add_argument("--torch", help="also measure bench/ft's torch program with this python")
    p.add_argument("--torch-steps", type=int, default=120)
    a = p.parse_args()
    a.lib = os.environ.get("GORUN_LIB", os.path.join(ROOT, "bin", "libgorun.so"))
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
            a.ssh = "ssh -F " + kv["SSH_CONFIG"]
            a.base = [a.gorun, "--launch-agent", a.ssh, "-hostfile", hf]
            a.hf1, a.victim1 = os.path.join(tmp, "hostfile1"), hosts[1]
            open(a.hf1, "w").write("".join("%s slots=1\n" % h for h in hosts))
            load0 = os.getloadavg()
            res = {"ft": [], "restart": [], "torch-ft": [], "torch-restart": []}
            for _ in range(a.reps):
                res["ft"].append(ft_run(a, tmp))
                res["restart"].append(restart_run(a, tmp))
                if a.torch:
                    res["torch-ft"].append(torch_run(a, tmp, "ft"))
                    res["torch-restart"].append(torch_run(a, tmp, "restart", res["torch-ft"][-1]["inj"]))
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
    if not a.torch:
        return
    print()
    print("the same, torch (bench/ft's GPT, gorun.ft / torch.distributed on gorun), 3 ranks of 1 slot + 1 spare, %d steps, "
          "host 2 killed after step %d (restart: at the same moment), checkpoint every %d steps" % (a.torch_steps, a.kill, a.every))
    print("%-44s %16s %14s %7s" % ("", "--fault-tolerant", "--max-restarts", "ratio"))
    for k, what in (("join", "replacement's process start -> first step"), ("after_ready", "  of which after it was ready (join, heal)"),
                    ("again", "kill -> the replacement's first step")):
        f, r = med("torch-ft", k), med("torch-restart", k)
        print("%-44s %15.3fs %13.3fs %7.1f" % (what, f, r, r / max(f, 1e-6)))
    f, r = med("torch-ft", "wall"), med("torch-restart", "wall")
    print("%-44s %15.2fs %13.2fs %7.2f" % ("total time to %d steps" % a.torch_steps, f, r, r / f))
    print("torch ft join times: %s" % " ".join("%.3f" % r["join"] for r in res["torch-ft"]))


if __name__ == "__main__":
    main()
