"""A random-kill soak of fault-tolerant torch training: `gorun -np 3
--fault-tolerant --inject random:mtbf=MTBF` on python/tests/ftprog.py (a
small GPT through gorun.ft) for about DURATION, then the tests' checks on
the whole run: the job succeeded, every heal left the healed replica
bitwise equal to its peers at that step, every replica ended with one
digest, survivors committed their steps in order and redid at most one
step per death, every bfloat16 sum and float32 average over the quorum
was right; and no process of the job is left.

    python3 bench/ft/soak.py [--duration 240] [--mtbf 20s] [--seed 1]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TESTS = os.path.join(ROOT, "python", "tests")
sys.path.insert(0, TESTS)

import test_ft_torch  # noqa: E402  (the checks)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=240, help="seconds of training, roughly")
    ap.add_argument("--mtbf", default="20s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pace", type=float, default=0.05, help="seconds of pause per step")
    ap.add_argument("--max-failures", type=int, default=100)
    a = ap.parse_args()
    gorun = os.environ.get("GORUN_BIN", os.path.join(ROOT, "bin", "gorun"))
    steps = int(a.duration / (a.pace + 0.02))
    marks = tempfile.mkdtemp(prefix="ft-soak-")
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python"), TESTS, env.get("PYTHONPATH", "")]),
                "FT_MARKS": marks, "FT_PACE_S": str(a.pace), "FT_WAIT_S": str(a.duration + 300),
                "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    env.setdefault("GORUN_LIB", os.path.join(ROOT, "bin", "libgorun.so"))
    report = os.path.join(marks, "report.json")
    cmd = [gorun, "-np", "3", "--fault-tolerant", "--report", report, "--max-failures", str(a.max_failures),
           "--timeout", "%ds" % (a.duration * 3 + 300), "--inject", "random:mtbf=%s:seed=%d" % (a.mtbf, a.seed),
           sys.executable, os.path.join(TESTS, "ftprog.py"), "plain", str(steps)]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    out = p.stdout.decode(errors="replace")
    joins = []
    try:
        with open(report) as f:
            rep = json.load(f)
        joins = sorted(x["healed_after_start_s"] for x in (rep.get("fault_tolerance") or {}).get("failures", [])
                       if "healed_after_start_s" in x)
        os.remove(report)
    except (OSError, ValueError) as e:
        print("soak: no report: %s" % e)
    os.rmdir(marks)
    deaths = re.findall(r"^gorun:   rank (\d+) \(incarnation \d+, pid \d+\) (?:killed|exited)", out, re.M)
    died = {int(r) for r in deaths}
    left = subprocess.run(["pgrep", "-f", os.path.join(TESTS, "ftprog.py")], stdout=subprocess.PIPE).stdout.split()
    heals = sum(1 for _, kv in test_ft_torch.lines(out, "QUORUM") if kv["healed"] == "True")
    summary = [line for line in out.splitlines() if line.startswith("gorun: fault-tolerant:")]
    print("soak: %.0f s, %d steps asked, %d deaths (replicas %s), %d heals; %s" % (
        wall, steps, len(deaths), sorted(died), heals, summary[-1] if summary else "no summary"))
    if joins:
        print("soak: replacements healed after their process started: %d, median %.3f s, max %.3f s, %d over 2 s%s" % (
            len(joins), joins[len(joins) // 2], joins[-1], sum(1 for j in joins if j > 2),
            " (fork server)" if os.environ.get("GORUN_FT_FORK_SERVER") == "1" else ""))
    try:
        test_ft_torch.check_job(p.returncode, out, steps, died, len(deaths))
    except AssertionError as e:
        print("soak: FAIL:", str(e)[:3000])
        sys.exit(1)
    if left:
        print("soak: FAIL: processes left: %s" % b" ".join(left).decode())
        sys.exit(1)
    print("soak: ok: every heal bitwise equal, one final digest, survivors lost no committed step, no orphans")


if __name__ == "__main__":
    main()
