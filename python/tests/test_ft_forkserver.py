"""gorun's fork server for fault-tolerant Python ranks (GORUN_FT_FORK_SERVER=1),
under `gorun -np 3 --fault-tolerant` with real processes and real kills:

- a replacement forked from the server heals bitwise equal to the survivors,
  and the supervisor owns it: when the forked replacement is SIGKILLed
  (lastdie), gorun sees exactly that (killed by SIGKILL), replaces it, again
  by a fork, and the job ends with nothing left;
- the server killed during the job: the next replacement starts as a new
  process (and heals), the server is started again, nothing is left;
- gorun SIGKILLed while a forked replacement runs: every process of the job
  (ranks, the server, the replacement) is gone;
- a server that initialised CUDA is refused, saying so, and replacements
  start as new processes;
- command lines the server cannot reproduce are refused before any fork.

"Nothing left" is checked by environment: every process the job made carries
this test's FT_MARKS directory in its environment (/proc/PID/environ).

The rank program is ftprog.py (see test_ft_torch.py)."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import PYDIR
from test_ft_torch import NP, PROG, check_job, lines

sys.path.insert(0, PYDIR)
from gorun import _forkserver  # noqa: E402


def job_env(launcher, marks, extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYDIR, os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    env["GORUN_LIB"] = launcher.lib
    env["FT_MARKS"] = str(marks)
    env["FT_AT"] = "4"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    env["GORUN_FT_FORK_SERVER"] = "1"
    env.update(extra or {})
    return env


def start(launcher, tmp_path, case, steps, inject=(), extra=None, timeout=150):
    """gorun -vv -np 3 --fault-tolerant ... ftprog.py CASE STEPS, started;
    returns (the process, its marks directory). -vv: the supervisor's
    debug lines say which replacements were forked."""
    marks = tmp_path / "marks"
    marks.mkdir()
    flags = []
    for spec in inject:
        flags += ["--inject", spec]
    cmd = [launcher.gorun, "-vv", "-np", str(NP), "--fault-tolerant", "--timeout", "%ds" % timeout, *flags,
           sys.executable, PROG, case, str(steps)]
    p = subprocess.Popen(cmd, env=job_env(launcher, marks, extra), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    return p, marks


def finish(p, timeout=180):
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out.decode(errors="replace")


def left_behind(marks):
    """The pids of live processes whose environment names marks."""
    want = ("FT_MARKS=%s" % marks).encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if want in env and state != "Z":
            out.append(int(d))
    return out


def assert_nothing_left(marks, within=10.0):
    deadline = time.monotonic() + within
    while True:
        left = left_behind(marks)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    cmds = {}
    for pid in left:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmds[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass
    for pid in left:  # do not leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, ("processes of the job left behind", cmds)


def forked(out):
    """{rank: [pid, ...]} of the replacements the supervisor forked."""
    got = {}
    for m in re.finditer(r"replacement forked pid=(\d+) rank=(\d+)", out):
        got.setdefault(int(m.group(2)), []).append(int(m.group(1)))
    return got


def server_pids(marks):
    """The live fork servers of the job of marks."""
    out = []
    for pid in left_behind(marks):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if b"gorun._forkserver" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def test_forked_replacement_heals_and_is_owned(launcher, tmp_path):
    # Replica 1 is killed after step 4; its replacement is forked from the
    # server and heals. Then (lastdie) that forked replacement dies by
    # SIGKILL after its last step: gorun must see that exit as it is and
    # replace it (by a fork again), and the late replacement finds the job
    # finished.
    p, marks = start(launcher, tmp_path, "plain,lastdie", 12, inject=["kill:rank=1:after-steps=4"])
    code, out = finish(p)
    tail = out[-8000:]
    check_job(code, out, 12, died={1}, deaths=2)
    pids = forked(out).get(1, [])
    assert len(pids) >= 1, ("no replacement of rank 1 was forked", tail)
    # The forked incarnation 1 died by its own SIGKILL; the supervisor
    # reaped it and gorun names exactly that pid and cause.
    m = re.search(r"rank 1 \(incarnation 1, pid (\d+)\) killed by SIGKILL", out)
    assert m and int(m.group(1)) == pids[0], ("the forked replacement's death was not seen as it was", pids, tail)
    fin = lines(out, "FINISHED")
    assert [r for r, _ in fin] == [1] and fin[0][1]["inc"] == "2", tail
    assert_nothing_left(marks)


def test_server_killed_replacement_starts_fresh(launcher, tmp_path):
    # The server is SIGKILLed once the job trains; replica 1 is killed
    # later: its replacement starts as a new process and heals; the
    # supervisor starts the server again; nothing is left at the end.
    p, marks = start(launcher, tmp_path, "plain", 14, inject=["kill:rank=1:after-steps=8"],
                     extra={"FT_PACE_S": "0.3"})
    buf = b""
    killed = []
    deadline = time.monotonic() + 150
    os.set_blocking(p.stdout.fileno(), False)
    while not killed and time.monotonic() < deadline and p.poll() is None:
        chunk = p.stdout.read()
        if chunk:
            buf += chunk
        if b"RANK 0: COMMIT step=2 ok=True" in buf:
            for pid in server_pids(marks):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)
    os.set_blocking(p.stdout.fileno(), True)
    code, rest = finish(p)
    out = buf.decode(errors="replace") + rest
    tail = out[-8000:]
    assert killed, ("no fork server found to kill", tail)
    check_job(code, out, 14, died={1}, deaths=1)
    assert 1 not in forked(out), ("rank 1 was forked from a server that was killed", tail)
    assert "fork server died; starting it again" in out, tail
    assert out.count("fork server started") >= 2, ("the server was not started again", tail)
    assert_nothing_left(marks)


def test_job_killed_with_forked_replacement_running(launcher, tmp_path):
    # gorun is SIGKILLed while a forked replacement trains: the supervisor
    # (its client gone) kills every rank, the server and the replacement.
    p, marks = start(launcher, tmp_path, "plain", 400, inject=["kill:rank=1:after-steps=3"],
                     extra={"FT_PACE_S": "0.05"})
    buf = b""
    deadline = time.monotonic() + 150
    os.set_blocking(p.stdout.fileno(), False)
    while time.monotonic() < deadline and p.poll() is None:
        chunk = p.stdout.read()
        if chunk:
            buf += chunk
        out = buf.decode(errors="replace")
        if forked(out).get(1) and re.search(r"RANK 1: QUORUM .*healed=True", out):
            break
        time.sleep(0.05)
    out = buf.decode(errors="replace")
    assert forked(out).get(1), ("no forked replacement ran", out[-8000:])
    rpid = forked(out)[1][0]
    assert rpid in left_behind(marks), "the forked replacement is not running"
    assert server_pids(marks), "the fork server is not running"
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    assert_nothing_left(marks)


def test_cuda_initialised_server_is_refused(launcher, tmp_path):
    # A preloaded module leaves torch's CUDA state initialised (here by
    # torch's own flag, as _lazy_init sets it: this machine has no GPU):
    # the server refuses to serve, saying why, and the replacement starts
    # as a new process and heals.
    p, marks = start(launcher, tmp_path, "plain", 10, inject=["kill:rank=1:after-steps=4"],
                     extra={"GORUN_FT_FORK_PRELOAD": "torch,ft_cudastate"})
    code, out = finish(p)
    tail = out[-8000:]
    check_job(code, out, 10, died={1}, deaths=1)
    assert "this process has initialised CUDA" in out, tail
    assert "fork server off" in out, tail
    assert not forked(out), ("a replacement was forked from a CUDA-initialised server", tail)
    assert_nothing_left(marks)


@pytest.mark.parametrize("argv,want", [
    (["python", "-O", "x.py"], "the interpreter option -O is not reproduced"),
    (["python", "-c", "pass"], "the interpreter option -c is not reproduced"),
    (["python", "-m"], "-m without a module"),
    (["python"], "no script to run"),
    (["python", "-u"], "no script to run"),
])
def test_command_lines_the_server_refuses(argv, want):
    with pytest.raises(_forkserver.Refused, match=re.escape(want)):
        _forkserver.command_line(argv)


def test_command_lines_the_server_runs():
    assert _forkserver.command_line(["python", "-u", "t.py", "-O", "a"]) == ("path", "t.py", ["-O", "a"], {"-u"})
    assert _forkserver.command_line(["python", "-B", "-m", "pkg.mod", "x"]) == ("module", "pkg.mod", ["x"], {"-B"})
