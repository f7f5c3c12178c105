"""The gorun torch.distributed backend under the real gorun launcher.

Each test starts real rank processes with ``gorun -np N python3 rankprog.py
CASE`` and checks what every rank printed. rankprog.py holds the checks
themselves: every collective × dtype × op against a reference computed on
each rank, subgroups, async work and futures, bad arguments, and DDP against
gloo.
"""

import os
import random
import re
import socket
import subprocess
import sys

import pytest

from conftest import PYDIR, RANKPROG


def ranks_ok(out, n, case):
    missing = [r for r in range(n) if "RANK %d: %s ok" % (r, case) not in out]
    assert not missing, "ranks %s did not finish %r:\n%s" % (missing, case, out[-6000:])


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_collectives_groups_async_badargs_ddp(launcher, np):
    code, out = launcher.run(np, "all")
    assert code == 0, out[-6000:]
    ranks_ok(out, np, "all")


def test_deterministic_mode_follows_the_fixed_tree_and_plain_mode_does_not(launcher):
    """Deterministic mode: every all-reduce equals, bit for bit, the fixed
    pairwise tree each rank computes itself, at every size and arrival
    order; DDP is bitwise the same on every rank. Plain mode on the same
    inputs must differ from the tree somewhere: otherwise the inputs could
    not tell a broken deterministic mode from a working one."""
    got = {}
    for det in ("1", "0"):
        # 4 ranks: the fixed tree ((r0+r1)+(r2+r3)) differs from a left
        # fold (((r0+r1)+r2)+r3) as well as from the ring's orders.
        code, out = launcher.run(4, "det", det)
        assert code == 0, out[-6000:]
        ranks_ok(out, 4, "det")
        lines = set(re.findall(r"TREE det=%s (.*)" % det, out))
        assert len(lines) == 1, "ranks report different mismatches: %s\n%s" % (lines, out[-3000:])
        got[det] = {int(k): int(v) for k, v in (kv.split(":") for kv in lines.pop().split())}
    assert all(v == 0 for v in got["1"].values()), "deterministic mode left the fixed tree: %s" % got["1"]
    assert sum(got["0"].values()) > 0, "plain mode matched the tree everywhere: the test cannot see order"


def test_fork_children_never_hang(launcher):
    code, out = launcher.run(2, "fork")
    assert code == 0, out[-6000:]
    ranks_ok(out, 2, "fork")


def test_killed_rank_raises_on_every_survivor_within_5s_naming_it(launcher):
    code, out = launcher.run(3, "kill")
    assert code == 128 + 9, "gorun should exit with the killed rank's code:\n" + out[-3000:]
    got = re.findall(r"RANK (\d): KILLERR after=([0-9.]+) status=(\S+) lostrank=(-?\d+) msg=(.*)", out)
    assert sorted(int(g[0]) for g in got) == [0, 1], "both survivors must raise:\n" + out[-3000:]
    for rank, after, status, lost, msg in got:
        assert float(after) <= 5.0, "rank %s raised after %ss" % (rank, after)
        assert status == "GORUN_ERR_PEER_LOST", (rank, status, msg)
        assert lost == "2" and "rank 2" in msg, (rank, lost, msg)


def test_a_survivor_that_exits_gets_one_line_from_finalize_not_a_traceback(launcher):
    code, out = launcher.run(3, "kill", "exit")
    assert code == 128 + 9, out[-3000:]
    assert len(re.findall(r"RANK \d: KILLERR", out)) == 2, out[-3000:]
    assert "Traceback" not in out and "Error in atexit" not in out, out[-3000:]
    lines = re.findall(r"gorun: at exit: .*", out)
    assert lines and all("rank 2" in l for l in lines), out[-3000:]


def test_desync_raises_on_every_rank_naming_both_calls(launcher):
    code, out = launcher.run(3, "desync")
    assert code == 0, out[-3000:]
    got = re.findall(r"RANK (\d): DESYNCERR status=(\S+) msg=(.*)", out)
    assert sorted(int(g[0]) for g in got) == [0, 1, 2], out[-3000:]
    for rank, status, msg in got:
        assert status == "GORUN_ERR_DESYNC", (rank, status, msg)
        assert "Broadcast" in msg and "AllReduce" in msg, (rank, msg)


def test_timeout_fails_a_call_a_rank_never_joins_naming_that_rank(launcher):
    code, out = launcher.run(3, "timeout")
    assert code == 0, out[-3000:]
    got = re.findall(r"RANK (\d): TIMEOUTERR after=([0-9.]+) start=([0-9.]+) end=([0-9.]+) status=(\S+) rank=(-?\d+) msg=(.*)",
                     out)
    assert sorted(int(g[0]) for g in got) == [0, 1], "both waiting ranks must raise:\n" + out[-3000:]
    # The first rank whose call has waited the timeout (1 s) fails the group
    # on every rank, so a rank that called later raises sooner by its own
    # clock (0.99 s, seen): none raises before the first call's 1 s, on the
    # host's one monotonic clock. How long after is the machine's business.
    first = min(float(g[2]) for g in got)
    for rank, after, start, end, status, behind, msg in got:
        assert float(end) - first >= 1.0, "rank %s raised %.3fs after the first call began, before the 1 s timeout" % (
            rank, float(end) - first)
        assert status == "GORUN_ERR_TIMEOUT", (rank, status, msg)
        assert behind == "2" and "rank 2" in msg, (rank, behind, msg)
    late = re.findall(r"RANK 2: LATEERR status=(\S+) msg=(.*)", out)
    assert late and late[0][0] == "GORUN_ERR_TIMEOUT", "the late rank must find its group failed:\n" + out[-3000:]


def test_gorun_groups_with_a_gloo_default_group(launcher):
    """init_process_group("gloo") then new_group(backend="gorun"): on 3 ranks
    the first gorun group is [0, 2], a world of its members alone."""
    code, out = launcher.run(3, "gloodefault")
    assert code == 0, out[-6000:]
    ranks_ok(out, 3, "gloodefault")


def free_port():
    """A port free a moment ago, picked below the kernel's ephemeral range:
    one from a bind to port 0 comes from that range, from which the kernel
    also hands out other processes' outgoing connections, and may be taken
    before torch's store binds it (as rendezvoustest.FreePort, in Go)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            hi = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        hi = 32768
    for _ in range(50):
        port = random.randrange(20000, hi) if hi - 20000 >= 1000 else 0
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port in 50 tries")


@pytest.mark.parametrize("case", ["smoke", "gloodefault"])
def test_torch_style_launch_without_gorun_bootstraps_through_the_store(launcher, case):
    """RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT only, as torchrun sets them:
    the rendezvous endpoint and secret travel through torch's store (smoke:
    gorun is the default group; gloodefault: a gorun group of every rank
    under a gloo default group)."""
    port = free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GORUN_")}
        env.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=PYDIR, GORUN_LIB=launcher.lib, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, RANKPROG, case], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out = ""
    for p in procs:
        try:
            o, _ = p.communicate(timeout=120)
        finally:
            p.kill()
        out += o.decode(errors="replace")
        assert p.returncode == 0, out[-3000:]
    ranks_ok(out, 2, case)


def _sched_group_host():
    """Why ranks could not join a job's cpu cgroup here ("" if they can):
    root, autogroup on, a cgroup v1 cpu hierarchy with this process at its
    root, and fewer CPUs than the 4 ranks the test starts."""
    try:
        autogroup = open("/proc/sys/kernel/sched_autogroup_enabled").read().strip()
        cg = [l.split(":", 2)[2] for l in open("/proc/self/cgroup").read().splitlines() if l.split(":")[1:2] == ["cpu"]]
    except OSError as e:
        return str(e)
    if os.geteuid() != 0:
        return "not root"
    if autogroup != "1":
        return "autogroup is off"
    if cg != ["/"]:
        return "no cgroup v1 cpu hierarchy with this process at its root (%s)" % cg
    if os.cpu_count() >= 4:
        return "%d CPUs: 4 ranks are not crowded" % os.cpu_count()
    return ""


def test_crowded_ranks_share_the_jobs_cpu_cgroup_unless_told_otherwise(launcher):
    """4 ranks on fewer CPUs, each in a session of its own (gorun's default
    for a Python interpreter): the library moves every rank into the job's
    cpu cgroup, one CFS group in which a waiting rank can yield its core to
    a peer; with --session own they stay where they are."""
    why = _sched_group_host()
    if why:
        pytest.skip(why)
    code, out = launcher.run(4, "schedgroup")
    assert code == 0, out[-3000:]
    ranks_ok(out, 4, "schedgroup")
    got = re.findall(r"RANK (\d): CPUCGROUP (\S+) job=(\S+)", out)
    assert len(got) == 4, out[-3000:]
    for rank, cg, job in got:
        assert cg == "/gorun-sched-" + job, "rank %s is in cpu cgroup %s" % (rank, cg)
    assert not os.path.exists("/sys/fs/cgroup/cpu/gorun-sched-" + got[0][2]), "the job's cgroup outlived it"
    # Behind a wrapper that leads the session gorun gave the rank (a shell
    # script that runs python3, a profiler), the interpreter is no session
    # leader, yet alone in its session's group: it joins too.
    code, out = launcher.run(4, "schedgroup", wrapper=("/bin/sh", "-c", '"$0" "$@"; exit $?'))
    assert code == 0, out[-3000:]
    got = re.findall(r"RANK (\d): CPUCGROUP (\S+) job=(\S+)", out)
    assert len(got) == 4, out[-3000:]
    for rank, cg, job in got:
        assert cg == "/gorun-sched-" + job, "wrapped rank %s is in cpu cgroup %s" % (rank, cg)
    assert not os.path.exists("/sys/fs/cgroup/cpu/gorun-sched-" + got[0][2]), "the wrapped job's cgroup outlived it"
    code, out = launcher.run(4, "schedgroup", gorun_flags=("--session", "own"))
    assert code == 0, out[-3000:]
    got = re.findall(r"RANK (\d): CPUCGROUP (\S+) job=", out)
    assert [g[1] for g in got] == ["/"] * 4, got
