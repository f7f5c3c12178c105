"""torch 2.x on gorun: every way torch starts a group, with and without the
gorun launcher, and the calls torch 2.x added (functional collectives, the
coalescing manager, object collectives, batch_isend_irecv), each checked by
torch2prog.py on every rank against values each rank computes alone."""

import os
import re
import subprocess
import sys

import pytest

from conftest import PYDIR
from test_backend import free_port, ranks_ok

PROG = os.path.join(os.path.dirname(__file__), "torch2prog.py")


def clean_env(lib, **kw):
    """The environment of a process not started by gorun."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GORUN_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=PYDIR, GORUN_LIB=lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update({k: str(v) for k, v in kw.items()})
    return env


def run_gorun(launcher, np, *args, extra_env=None):
    env = dict(os.environ, PYTHONPATH=PYDIR, GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra_env or {})
    p = subprocess.run([launcher.gorun, "-np", str(np), "--timeout", "240s", sys.executable, PROG, *args], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return p.returncode, p.stdout.decode(errors="replace")


def run_torchrun_style(launcher, np, *args):
    """RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun sets them, no gorun."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, PROG, *args],
                              env=clean_env(launcher.lib, RANK=r, WORLD_SIZE=np, LOCAL_RANK=r, LOCAL_WORLD_SIZE=np,
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(np)]
    out, codes = "", []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=240)
        finally:
            p.kill()
        out += o.decode(errors="replace")
        codes.append(p.returncode)
    return codes, out


@pytest.mark.parametrize("np", [2, 3])
def test_torch2_calls_under_gorun(launcher, np):
    code, out = run_gorun(launcher, np, "surface")
    assert code == 0, out[-6000:]
    ranks_ok(out, np, "surface")


def test_torch2_calls_torchrun_style_without_gorun(launcher):
    codes, out = run_torchrun_style(launcher, 2, "surface")
    assert codes == [0, 0], out[-6000:]
    ranks_ok(out, 2, "surface")


def test_new_group_with_a_timeout_or_options_unlike_the_worlds(launcher):
    code, out = run_gorun(launcher, 2, "timeoutgroup")
    assert code == 0, out[-6000:]
    ranks_ok(out, 2, "timeoutgroup")


def test_destroy_then_init_again_under_gorun(launcher):
    code, out = run_gorun(launcher, 2, "reinit")
    assert code == 0, out[-6000:]
    ranks_ok(out, 2, "reinit")


def test_destroy_then_init_again_without_gorun(launcher):
    codes, out = run_torchrun_style(launcher, 2, "reinit")
    assert codes == [0, 0], out[-6000:]
    ranks_ok(out, 2, "reinit")


@pytest.mark.parametrize("backend", ["gorun", "gloo"])
def test_spawn_with_tcp_and_file_init_without_gorun(launcher, backend):
    """mp.spawn, init_process_group(init_method=tcp:// then file://,
    rank=r, world_size=2); gloo runs the same checks as the reference."""
    p = subprocess.run([sys.executable, PROG, "spawn", "2", backend, str(free_port())],
                       env=clean_env(launcher.lib), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-6000:]
    for init in ("tcp", "file"):
        ranks_ok(out, 2, "spawn %s" % init)


def test_spawn_with_world_size_set_without_rank_under_gorun(launcher):
    """One gorun rank (its environment says rank 0 of 1, and WORLD_SIZE is
    exported as torch's own runner does) spawns 3 processes that
    init_process_group with rank= and world_size=3: identity is torch's."""
    code, out = run_gorun(launcher, 1, "spawn", "3", "gorun", str(free_port()), extra_env={"WORLD_SIZE": "3"})
    assert code == 0, out[-6000:]
    for init in ("tcp", "file"):
        ranks_ok(out, 3, "spawn %s" % init)


def test_spawn_with_world_size_set_without_rank_without_gorun(launcher):
    """The same as above in a process gorun did not start: WORLD_SIZE is
    exported (as torch's own runner does), RANK is not, and the spawned
    processes init_process_group with rank= and world_size=2 (tcp:// only:
    the identity is decided before the store's kind matters)."""
    p = subprocess.run([sys.executable, PROG, "spawn", "2", "gorun", str(free_port()), "tcp"],
                       env=clean_env(launcher.lib, WORLD_SIZE=2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-6000:]
    ranks_ok(out, 2, "spawn tcp")
    assert "spawn file" not in out, out[-6000:]


def test_a_backend_per_device_gives_gorun_the_cpu_tensors(launcher):
    """init_process_group("cpu:gorun,cuda:gloo"): the group's CPU backend is
    gorun's (on a machine with GPUs, "cpu:gorun,cuda:nccl" is the same; on
    one without, torch refuses that group at init: "nccl2 requires at least
    one CUDA device"), receives from any source included."""
    code, out = run_gorun(launcher, 2, "mixed")
    assert code == 0, out[-6000:]
    ranks_ok(out, 2, "mixed")


def test_a_receive_from_any_source_waits_for_a_sender_past_the_connect_timeout(launcher):
    """One sender of three is silent for over twice the connect timeout
    (3 s): its message is still received from any source, where the channel
    used to be given up after the timeout and the message lost (a hang);
    an explicit receive from a rank that never sends still fails with the
    timeout. About 15 s."""
    code, out = run_gorun(launcher, 4, "latesender")
    assert code == 0, out[-6000:]
    ranks_ok(out, 4, "late sender")


def _params(out, np):
    got = {}
    for line in out.splitlines():
        if "PARAMS " in line and line.startswith("RANK "):
            r = int(line.split(":")[0].split()[1])
            got[r] = [float(v) for v in line.split("PARAMS ", 1)[1].split()]
    assert sorted(got) == list(range(np)), out[-3000:]
    return got


@pytest.mark.parametrize("np", [2, 3])
def test_dtensor_and_fsdp2_train_to_gloos_parameters(launcher, np):
    """distribute_tensor, redistribute and fully_shard training over gorun
    and over gloo (the same program, the same seeds): the same parameters
    on every rank, and gorun's equal to gloo's."""
    runs = {}
    for backend in ("gorun", "gloo"):
        code, out = run_gorun(launcher, np, "train", backend)
        assert code == 0, out[-6000:]
        ranks_ok(out, np, "train")
        runs[backend] = _params(out, np)
    for b, got in runs.items():
        assert all(got[r] == got[0] for r in range(np)), "%s: ranks hold different parameters" % b
    a, b = runs["gorun"][0], runs["gloo"][0]
    assert len(a) == len(b) == 8 * 16 + 16 + 16 * 16 + 16 + 16 * 4 + 4, (len(a), len(b))
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= 1e-5, "gorun and gloo parameters differ by %g" % worst


def test_a_groups_own_shorter_timeout_fails_a_call_naming_it(launcher):
    code, out = run_gorun(launcher, 2, "grouptimeout")
    assert code == 0, out[-6000:]
    ranks_ok(out, 2, "grouptimeout")
    m = re.search(r"RANK 0: GROUPTIMEOUT after=([0-9.]+) msg=(.*)", out)
    assert m, out[-3000:]
    after, msg = float(m.group(1)), m.group(2)
    assert 2.0 <= after < 60, "raised after %.2f s; the group's timeout is 2 s, the world's 120 s" % after
    assert "allreduce" in msg and "group's timeout" in msg, msg
