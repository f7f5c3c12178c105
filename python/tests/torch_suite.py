"""Runs torch's own distributed suite from the installed wheel
(torch/testing/_internal/distributed/distributed_test.py,
DistributedTest._DistTestBase) on a backend, as torch's runner
test/distributed/test_distributed_spawn.py does (it is not in the wheel):
BACKEND, WORLD_SIZE and TEMP_DIR in the environment, one test class whose
setUp starts WORLD_SIZE processes per test, each of which
init_process_group()s with init_method file://.

    torch_suite.py --compare gloo,gorun --world-sizes 2,3 [-k REGEX]
                   [--jobs J] [--test-timeout S] [--start fork|spawn]
                   [--markdown FILE] [--json FILE]

runs the same selection on each backend and world size, each in J shards
(processes of their own, run J at a time: the suite reads BACKEND when it is
imported), prints each backend's counts side by side and every test that
the first backend passes and another does not, with the reason. --markdown
writes the counts and the table of every test's result per backend (failures
with their reason); --json writes the raw results.

    torch_suite.py --backend gorun --world-size 2 [-k REGEX] [--shard I/J]

runs one shard (what --compare starts) and prints one tab-separated
"RESULT status name reason" line per test.

A backend written B@G (e.g. gorun@gloo) runs on B the tests as the suite
selects them for G: the suite decides many skips by the backend's name
when it is imported ("Test requires backend gorun to be one of {'gloo'}",
"Only gloo backend supports timeouts"), and this runs those tests' bodies
on B unchanged. It is a diagnosis of what B would do past G's gates, shown
in a column of its own, not B's result.

What the driver does alike for every backend:
- the ranks of a test are forked from the runner (--start fork, the
  default) rather than spawned: a spawned rank imports torch and the suite
  afresh, 5-15 s per rank on a shared 2-core machine, which made the whole
  suite a matter of hours; torch ran this same class forked for years
  (test_distributed_fork.py). --start spawn is torch's runner's way.
- a test that has not finished after --test-timeout seconds (default 120;
  torch's own is 300, DISTRIBUTED_TESTS_DEFAULT_TIMEOUT) is ended by the
  suite's own timeout handling and counts as an error.
- the suite's table of backend features (DistTestCases.backend_feature):
  gorun joins the sets that name gloo for what it serves on CPU ("ddp",
  "subgroup"), as gloo is in them.
Nothing else differs between the backends' runs.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

STATUSES = ("PASS", "FAIL", "ERROR", "SKIP")
SMALL_WORLD = "Skipped due to small world size"  # skip_if_small_worldsize's reason

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--shard", default="0/1", help="I/J: the I-th of J interleaved parts of the selection")
    ap.add_argument("--compare", help="backends, comma-separated; the first is the reference")
    ap.add_argument("--world-sizes", default="2,3")
    ap.add_argument("-k", default="", help="run the tests whose names match this regular expression")
    ap.add_argument("--jobs", type=int, default=2, help="shards per backend and world size, run this many at a time")
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork", help="how a test's ranks are started")
    ap.add_argument("--test-timeout", type=int, default=120, help="seconds one test may take")
    ap.add_argument("--timeout", type=int, default=4 * 3600, help="seconds for one shard")
    ap.add_argument("--large-world", type=int, default=0,
                    help="then run, at this world size, the tests the first backend skipped as too few ranks")
    ap.add_argument("--markdown", help="write the counts and the per-test table here")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--gaps", help="the explained gaps (backend<TAB>test<TAB>reason): exit 0 when the gaps are "
                                   "exactly these, 1 naming any other or any listed one that now passes")
    ARGS = ap.parse_args()
    m = re.fullmatch(r"(\d+)/(\d+)", ARGS.shard)
    if not m or not int(m.group(1)) < int(m.group(2)):
        ap.error("--shard %r: want I/J with 0 <= I < J" % ARGS.shard)
    if ARGS.jobs < 1:
        ap.error("--jobs %d: want at least 1" % ARGS.jobs)
    if ARGS.backend:
        os.environ["BACKEND"] = ARGS.backend.split("@")[0]
        os.environ.pop("GORUN_SUITE_GATES", None)
        if "@" in ARGS.backend:
            os.environ["GORUN_SUITE_GATES"] = ARGS.backend.split("@")[1]
        os.environ["WORLD_SIZE"] = str(ARGS.world_size)
        # torch's own knob, read when common_distributed is imported
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.test_timeout)
        # the suite's setUp replaces it with a directory per test (and
        # removes that); this one is only for the import, removed at the end
        os.environ["TEMP_DIR"] = TEMP_DIR = tempfile.mkdtemp(prefix="gorun-torch-suite-")
else:
    ARGS = None

SUITE = "BACKEND" in os.environ and (ARGS is None or ARGS.backend)
if SUITE:
    import unittest

    import torch
    from torch.testing._internal.common_distributed import DistTestCases

    import gorun  # noqa: F401  (registers the backend; the library loads on first use, so forks are clean)

    for feature in ("ddp", "subgroup"):
        if "gloo" in DistTestCases.backend_feature[feature]:
            DistTestCases.backend_feature[feature].add("gorun")
    # --backend B@G: the suite's decorators, evaluated as it is imported,
    # see G; the ranks, the test bodies and the suite's run-time checks see B.
    _backend = os.environ["BACKEND"]
    os.environ["BACKEND"] = os.environ.get("GORUN_SUITE_GATES", _backend)
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    distributed_test.BACKEND = os.environ["BACKEND"] = _backend

    START = os.environ.setdefault("GORUN_SUITE_START", ARGS.start if ARGS else "spawn")

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if START == "fork":
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()


def reason_of(err):
    """One line that says why a test failed: the exception a rank raised
    (the last one of the first rank's traceback that the runner passed up),
    else the runner's own."""
    text = str(err[1]) if err[1] is not None else ""
    lines = text.splitlines()
    found, after_tb = [], False
    for ln in lines:
        if ln.startswith("Traceback "):
            after_tb = True
            continue
        if after_tb and ln and not ln.startswith(" "):
            found.append(ln)
            after_tb = False
        if ln.startswith("Process ") and "exited with error code" in ln and found:
            break  # the first rank's exception is enough
    if found:
        line = found[-1]
    else:  # the runner's own assertion (a rank's exit code): its first and last lines
        text = [ln for ln in lines if ln.strip()]
        line = "%s: %s" % (err[0].__name__, " ... ".join(dict.fromkeys(text[:1] + text[-1:])))
    return re.sub(r"\s+", " ", line)[:300]


def run_one(pattern, shard):
    """Runs shard I/J of the selection on $BACKEND, prints a RESULT line per test."""
    i, j = (int(x) for x in shard.split("/"))
    loader = unittest.TestLoader()
    names = [n for n in sorted(loader.getTestCaseNames(TestDistBackendWithSpawn)) if re.search(pattern, n)][i::j]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)

    class Result(unittest.TextTestResult):
        def startTest(self, test):
            self._t0 = time.monotonic()
            super().startTest(test)

        def _say(self, test, status, reason=""):
            print("RESULT\t%s\t%s\t%.1f\t%s" % (status, test._testMethodName, time.monotonic() - self._t0,
                                                reason.replace("\t", " ")), flush=True)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._say(test, "PASS")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._say(test, "FAIL", reason_of(err))

        def addError(self, test, err):
            super().addError(test, err)
            self._say(test, "ERROR", reason_of(err))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._say(test, "SKIP", re.sub(r"\s+", " ", str(reason))[:300])

    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=0, resultclass=Result)
    try:
        runner.run(suite)
    finally:
        shutil.rmtree(TEMP_DIR, ignore_errors=True)


def parse(out):
    res = {}
    for line in out.splitlines():
        f = line.split("\t")
        if len(f) == 5 and f[0] == "RESULT" and f[1] in STATUSES:
            res[f[2]] = {"status": f[1], "secs": float(f[3]), "reason": f[4]}
    return res


def run_shards(backend, n, args, pattern):
    """Every shard of one backend at one world size, args.jobs at a time."""
    env = dict(os.environ)
    for k in ("BACKEND", "WORLD_SIZE", "TEMP_DIR", "GORUN_SUITE_START", "GORUN_SUITE_GATES"):
        env.pop(k, None)
    procs = []
    for i in range(args.jobs):
        cmd = [sys.executable, __file__, "--backend", backend, "--world-size", str(n), "-k", pattern,
               "--shard", "%d/%d" % (i, args.jobs), "--start", args.start, "--test-timeout", str(args.test_timeout)]
        log = tempfile.TemporaryFile()
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True),
                      log))
    res, errs = {}, []
    deadline = time.monotonic() + args.timeout
    for p, log in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, _ = p.communicate()
            errs.append("a shard ran past %d s" % args.timeout)
        got = parse(out.decode(errors="replace"))
        if p.returncode != 0 and not got:
            log.seek(0)
            errs.append(log.read().decode(errors="replace")[-3000:])
        log.close()
        res.update(got)
    return res, errs


def counts(res):
    return {k: sum(1 for v in res.values() if v["status"] == k) for k in STATUSES}


def load_gaps(path):
    """The explained gaps of a --gaps file: {(backend, test): reason}."""
    gaps = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if not s.strip() or s.lstrip().startswith("#"):
                continue
            f3 = s.split("\t")
            if len(f3) != 3 or not all(x.strip() for x in f3) or not f3[1].startswith("test_"):
                raise SystemExit("torch_suite: %s:%d: want backend<TAB>test_name<TAB>reason, got %r" % (path, i, s))
            if (f3[0], f3[1]) in gaps:
                raise SystemExit("torch_suite: %s:%d: %s %s listed twice" % (path, i, f3[0], f3[1]))
            gaps[(f3[0], f3[1])] = f3[2]
    return gaps


def judge_gaps(args, backends, sizes, results, missing, gaps):
    """The number of gaps that are not as the list says: a gap not listed,
    or a listed one whose test the backend now passes (where the reference
    passes it too). Listed tests that did not run (-k) count neither way."""
    ref, bad = backends[0], 0
    for n, b, name, other in missing:
        if (b, name) not in gaps:
            bad += 1
            print("unexplained gap: world %d %s %s: %s (not in %s)" % (
                n, b, name, "%s %s" % (other["status"], other["reason"]) if other else "not run", args.gaps))
    for (b, name) in sorted(gaps):
        if b not in backends[1:]:
            continue
        for n in sizes:
            r, o = results[(ref, n)].get(name), results[(b, n)].get(name)
            if r and o and r["status"] == "PASS" and o["status"] == "PASS":
                bad += 1
                print("explained gap now passes: world %d %s %s: remove it from %s" % (n, b, name, args.gaps))
    print("%d gaps, %s" % (len(missing), "each explained in %s" % args.gaps if not bad
                            else "%d not as %s says" % (bad, args.gaps)))
    return bad


def compare(args):
    backends = args.compare.split(",")
    sizes = [int(x) for x in args.world_sizes.split(",")]
    results, secs = {}, {}
    ref = backends[0]
    gaps = load_gaps(args.gaps) if args.gaps else None

    def run(n, pattern):
        for b in backends:
            start = time.monotonic()
            res, errs = run_shards(b, n, args, pattern)
            for e in errs:
                sys.stderr.write(e + "\n")
            if not res:
                raise SystemExit("torch_suite: no results from %s at world size %d" % (b, n))
            results[(b, n)], secs[(b, n)] = res, time.monotonic() - start
            c = counts(res)
            print("world %d %-6s %3d tests: %3d passed %3d failed %3d errors %3d skipped (%.0f s)" % (
                n, b, len(res), c["PASS"], c["FAIL"], c["ERROR"], c["SKIP"], secs[(b, n)]), flush=True)
    for n in sizes:
        run(n, args.k)
    if args.large_world and args.large_world not in sizes:
        # torch 2.x skips its subgroup tests below 8 ranks (skip_if_small_worldsize)
        small = sorted({name for (b, n), res in results.items() if b == ref
                        for name, r in res.items() if r["status"] == "SKIP" and SMALL_WORLD in r["reason"]})
        if small:
            sizes.append(args.large_world)
            run(args.large_world, "^(%s)$" % "|".join(re.escape(x) for x in small))
    missing = []
    for n in sizes:
        for b in backends[1:]:
            for name, r in sorted(results[(ref, n)].items()):
                other = results[(b, n)].get(name)
                if r["status"] == "PASS" and (other is None or other["status"] != "PASS"):
                    missing.append((n, b, name, other))
                    print("world %d: %s passes %s, %s: %s %s%s" % (
                        n, ref, name, b, other["status"] if other else "not run", other["reason"] if other else "",
                        " (explained)" if gaps is not None and (b, name) in gaps else ""))
    print("%d tests that %s passes and another backend does not" % (len(missing), ref))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"%s/%d" % k: v for k, v in results.items()}, f, indent=1, sort_keys=True)
    if args.markdown:
        write_markdown(args, backends, sizes, results, secs)
    if gaps is not None:
        return judge_gaps(args, backends, sizes, results, missing, gaps)
    return len(missing)


def write_markdown(args, backends, sizes, results, secs):
    with open(args.markdown, "w") as f:
        f.write("Made by `torch_suite.py --compare %s --world-sizes %s%s%s --jobs %d --start %s --test-timeout %d`"
                " (torch %s).\n\n" % (args.compare, args.world_sizes, " -k '%s'" % args.k if args.k else "",
                                      " --large-world %d" % args.large_world if args.large_world else "",
                                      args.jobs, args.start, args.test_timeout, torch_version()))
        f.write("| world size | backend | tests | passed | failed | errors | skipped | wall s |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for n in sizes:
            for b in backends:
                c = counts(results[(b, n)])
                f.write("| %d | %s | %d | %d | %d | %d | %d | %.0f |\n" % (
                    n, b, len(results[(b, n)]), c["PASS"], c["FAIL"], c["ERROR"], c["SKIP"], secs[(b, n)]))
        for n in sizes:
            f.write("\n### World size %d\n\n| test | %s |\n|---|%s\n" % (
                n, " | ".join(backends), "---|" * len(backends)))
            names = sorted(set().union(*(results[(b, n)] for b in backends)))
            for name in names:
                cells = []
                for b in backends:
                    r = results[(b, n)].get(name)
                    if r is None:
                        cells.append("not run")
                    elif r["status"] == "PASS":
                        cells.append("pass")
                    else:
                        cells.append("%s: %s" % (r["status"].lower(), r["reason"].replace("|", "\\|")))
                f.write("| `%s` | %s |\n" % (name, " | ".join(cells)))


def torch_version():
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120)
        return out.stdout.decode().strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    if ARGS.backend:
        run_one(ARGS.k, ARGS.shard)
    elif ARGS.compare:
        sys.exit(1 if compare(ARGS) else 0)
    else:
        raise SystemExit("torch_suite: give --backend or --compare")
