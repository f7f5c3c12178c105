"""Runs rank programs under the real gorun launcher.

The tests need bin/gorun and bin/libgorun.so (``make build lib``, which
``make test-python`` does first); GORUN_BIN and GORUN_LIB override them.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYDIR = os.path.join(ROOT, "python")
RANKPROG = os.path.join(os.path.dirname(__file__), "rankprog.py")
# In-process tests (the exporter) import the package from this checkout.
sys.path.insert(0, PYDIR)


class Launcher:
    def __init__(self, gorun, lib):
        self.gorun = gorun
        self.lib = lib

    def run(self, np, case, *args, timeout=180, extra_env=None, gorun_flags=(), wrapper=()):
        """gorun -np NP [WRAPPER...] python3 rankprog.py CASE ARGS...; returns (exit code, output)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
        env["GORUN_LIB"] = self.lib
        env.setdefault("OMP_NUM_THREADS", "1")
        if extra_env:
            env.update(extra_env)
        cmd = [self.gorun, "-np", str(np), "--timeout", "%ds" % timeout, *gorun_flags,
               *wrapper, sys.executable, RANKPROG, case, *args]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout + 30, cwd=ROOT)
        return p.returncode, p.stdout.decode(errors="replace")


@pytest.fixture(scope="session")
def launcher():
    gorun = os.environ.get("GORUN_BIN", os.path.join(ROOT, "bin", "gorun"))
    lib = os.environ.get("GORUN_LIB", os.path.join(ROOT, "bin", "libgorun.so"))
    for p, how in ((gorun, "make build"), (lib, "make lib")):
        if not os.path.isfile(p):
            pytest.fail("%s is missing: run `%s` (make test-python does)" % (p, how))
    return Launcher(gorun, lib)
