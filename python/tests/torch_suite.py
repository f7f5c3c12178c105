"""Runs torch's own distributed suite from the installed wheel
(torch/testing/_internal/distributed/distributed_test.py,
DistributedTest._DistTestBase) on a backend, as torch's runner
test/distributed/test_distributed_spawn.py does (it is not in the wheel):
BACKEND, WORLD_SIZE and TEMP_DIR in the environment, one test class that
spawns WORLD_SIZE processes per test, each of which init_process_group()s
with init_method file://.

    torch_suite.py --compare gloo,gorun --world-sizes 2,3 [-k REGEX]

runs the same selection on each backend and world size (each in a process
of its own: the suite reads BACKEND when it is imported), prints each
backend's counts side by side and every test that the first backend passes
and another does not. The one thing done for a backend is the suite's own
table of backend features (DistTestCases.backend_feature): gorun joins the
sets that name gloo for what it serves on CPU ("ddp", "subgroup"), as gloo
is in them; nothing else differs between the backends' runs.

    torch_suite.py --backend gorun --world-size 2 [-k REGEX]

runs one (what --compare starts) and prints "RESULT name" lines.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--compare", help="backends, comma-separated; the first is the reference")
    ap.add_argument("--world-sizes", default="2,3")
    ap.add_argument("-k", default="", help="run the tests whose names match this regular expression")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds for one backend's run")
    ARGS = ap.parse_args()
    if ARGS.backend:
        os.environ["BACKEND"] = ARGS.backend
        os.environ["WORLD_SIZE"] = str(ARGS.world_size)
        # the suite's setUp replaces it with a directory per test (and
        # removes that); this one is only for the import, removed at the end
        os.environ["TEMP_DIR"] = TEMP_DIR = tempfile.mkdtemp(prefix="gorun-torch-suite-")
else:
    ARGS = None

SUITE = "BACKEND" in os.environ and (ARGS is None or ARGS.backend)
if SUITE:
    import unittest

    import torch  # noqa: F401
    from torch.testing._internal.common_distributed import DistTestCases

    import gorun  # noqa: F401  (registers the backend in the spawned ranks too)

    for feature in ("ddp", "subgroup"):
        if "gloo" in DistTestCases.backend_feature[feature]:
            DistTestCases.backend_feature[feature].add("gorun")
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()


def run_one(pattern):
    """Runs the selection on $BACKEND, prints "RESULT name" per test."""
    loader = unittest.TestLoader()
    names = [n for n in loader.getTestCaseNames(TestDistBackendWithSpawn) if re.search(pattern, n)]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            print("PASS", test._testMethodName, flush=True)

        def addFailure(self, test, err):
            super().addFailure(test, err)
            print("FAIL", test._testMethodName, flush=True)

        def addError(self, test, err):
            super().addError(test, err)
            print("ERROR", test._testMethodName, flush=True)

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            print("SKIP", test._testMethodName, "--", reason, flush=True)

    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=0, resultclass=Result)
    try:
        runner.run(suite)
    finally:
        shutil.rmtree(TEMP_DIR, ignore_errors=True)


def compare(backends, sizes, pattern, timeout):
    results = {}
    for n in sizes:
        for b in backends:
            start = time.monotonic()
            env = dict(os.environ)
            for k in ("BACKEND", "WORLD_SIZE", "TEMP_DIR"):
                env.pop(k, None)
            p = subprocess.run([sys.executable, __file__, "--backend", b, "--world-size", str(n), "-k", pattern],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
            out = p.stdout.decode(errors="replace")
            res = {}
            for line in out.splitlines():
                m = re.match(r"(PASS|FAIL|ERROR|SKIP) (\S+)", line)
                if m:
                    res[m.group(2)] = m.group(1)
            if not res:
                sys.stderr.write(p.stderr.decode(errors="replace")[-4000:])
                raise SystemExit("torch_suite: no results from %s at world size %d" % (b, n))
            results[(b, n)] = res
            counts = {k: sum(1 for v in res.values() if v == k) for k in ("PASS", "FAIL", "ERROR", "SKIP")}
            print("world %d %-6s %3d tests: %3d passed %3d failed %3d errors %3d skipped (%.0f s)" % (
                n, b, len(res), counts["PASS"], counts["FAIL"], counts["ERROR"], counts["SKIP"],
                time.monotonic() - start), flush=True)
    ref = backends[0]
    missing = 0
    for n in sizes:
        for b in backends[1:]:
            for name, r in sorted(results[(ref, n)].items()):
                if r == "PASS" and results[(b, n)].get(name) != "PASS":
                    missing += 1
                    print("world %d: %s passes %s, %s: %s" % (n, ref, name, b, results[(b, n)].get(name)))
    print("%d tests that %s passes and another backend does not" % (missing, ref))
    return missing


if __name__ == "__main__":
    if ARGS.backend:
        run_one(ARGS.k)
    elif ARGS.compare:
        sys.exit(1 if compare(ARGS.compare.split(","), [int(x) for x in ARGS.world_sizes.split(",")], ARGS.k,
                              ARGS.timeout) else 0)
    else:
        raise SystemExit("torch_suite: give --backend or --compare")
