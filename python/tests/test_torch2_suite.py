"""torch's own distributed suite (from the installed wheel) on gorun and on
gloo, a selection at world sizes 2 and 3, through torch_suite.py: gorun
must pass every test of the selection that gloo passes, and gloo must pass
all of them (so that the selection really ran). `make test-torch-suite`
runs the whole suite and prints both backends' counts.

The second selection is the suite's tests that it runs for gloo alone,
deciding by the backend's name ("Test requires backend gorun to be one of
{'gloo'}"): gorun@gloo runs their bodies, unchanged, on gorun, for the calls
gorun serves as gloo does (monitored_barrier, sparse all_reduce, a group's
barrier timeout, coalesced all_reduce, object collectives, futures)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import PYDIR

DRIVER = os.path.join(os.path.dirname(__file__), "torch_suite.py")

# A test per call and shape, the quickest of those gorun passes that compare
# what the call produced: every one of them fails when each result of a gorun
# call is off by one. torch 2.15's all_reduce tests (test_all_reduce_sum and
# its kin) compare nothing (_test_all_reduce_helper ignores its expected
# value), so they are not here; DDP's tests check all_reduce's values.
# send_recv_any_source_torch_profiler checks the source each receive from any
# source reports against the data, and that every message arrived once.
OPEN = ["broadcast", "reduce_sum", "reduce_max", "all_gather", "all_gather_complex", "all_gather_coalesced_simple",
        "gather", "scatter", "send_recv", "send_recv_with_tag", "send_recv_any_source_torch_profiler", "isend",
        "irecv", "barrier", "destroy_group",
        "get_rank_size_group", "DistributedDataParallelCPU", "ddp_create_graph", "static_graph_api_cpu"]
# The barriers' tests check that the call raises, naming the rank, or waits;
# the others compare values.
GATED = ["monitored_barrier_gloo", "monitored_barrier_gloo_subgroup", "monitored_barrier_gloo_rank_0_timeout",
         "sparse_all_reduce_sum", "barrier_timeout_full_group", "all_reduce_coalesced_sum",
         "all_reduce_coalesced_max", "scatter_object_list", "all_gather_object_default_pg", "get_future",
         "grads_same_across_ranks_with_no_sync"]


@pytest.mark.parametrize("backends,names", [("gloo,gorun", OPEN), ("gloo,gorun@gloo", GATED)],
                         ids=["as-the-suite-selects-for-gorun", "past-the-suites-gloo-only-gates"])
def test_gorun_passes_what_gloo_passes_on_a_selection_of_torchs_suite(launcher, backends, names):
    env = dict(os.environ, PYTHONPATH=PYDIR, GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, DRIVER, "--compare", backends, "--world-sizes", "2,3", "--jobs", "2",
                        "--test-timeout", "60", "-k", "^test_(%s)$" % "|".join(names)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-6000:]
    # the selection really ran: gloo passed each test at each world size,
    # and so did gorun (the driver's exit status says so; this says it too)
    for n in (2, 3):
        for b in backends.split(","):
            m = re.search(r"world %d %-6s +(\d+) tests: +(\d+) passed" % (n, re.escape(b)), out)
            assert m and m.group(1) == m.group(2) == str(len(names)), (b, n, out[-3000:])
