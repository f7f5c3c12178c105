"""torch's own distributed suite (from the installed wheel) on gorun and on
gloo, a few tests at world sizes 2 and 3, through torch_suite.py: gorun
must pass every test of the selection that gloo passes. `make
test-torch-suite` runs the whole suite and prints both backends' counts."""

import os
import subprocess
import sys

from conftest import PYDIR

DRIVER = os.path.join(os.path.dirname(__file__), "torch_suite.py")
SELECTION = "^test_(all_reduce_sum|broadcast|all_gather_coalesced_simple)$"


def test_gorun_passes_what_gloo_passes_on_a_selection_of_torchs_suite(launcher):
    env = dict(os.environ, PYTHONPATH=PYDIR, GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, DRIVER, "--compare", "gloo,gorun", "--world-sizes", "2,3", "-k", SELECTION],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-6000:]
    # the selection really ran: gloo passed each test at each world size
    for n in (2, 3):
        assert "world %d gloo     3 tests:   3 passed" % n in out, out[-3000:]
