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


class Job:
    """A started job whose output is read as it comes (watch)."""

    def __init__(self, launcher, tmp_path, case, steps, extra=None, inject=(), timeout=150):
        env = {"FT_HOLD": "1"}
        env.update(extra or {})
        self.p, self.marks = start(launcher, tmp_path, case, steps, inject=inject, extra=env, timeout=timeout)
        self.buf = b""
        os.set_blocking(self.p.stdout.fileno(), False)

    @property
    def out(self):
        return self.buf.decode(errors="replace")

    def watch(self, *wants, within=90):
        """Reads output until every regexp of wants has matched (or the
        job ended, or within seconds passed: a failure naming what was
        missing); returns the last match of each."""
        deadline = time.monotonic() + within
        while True:
            chunk = self.p.stdout.read()
            if chunk:
                self.buf += chunk
            got = [list(re.finditer(w, self.out, re.M)) for w in wants]
            if all(got):
                return [g[-1] for g in got]
            if self.p.poll() is not None or time.monotonic() > deadline:
                missing = [w for w, g in zip(wants, got) if not g]
                pytest.fail("the job never said %s\n%s" % (missing, self.out[-8000:]))
            time.sleep(0.05)

    def kill_held_rank(self, *also):
        """Once replica 1's first process holds after step FT_AT (and every
        regexp of also matched), SIGKILLs it; returns its pid."""
        m = self.watch(r"rank started pid=(\d+) rank=1\b", r"^RANK 1: HOLDING", *also)
        pid = int(m[0].group(1))
        os.kill(pid, signal.SIGKILL)
        return pid

    def finish(self, timeout=180):
        os.set_blocking(self.p.stdout.fileno(), True)
        rest, _ = self.p.communicate(timeout=timeout)
        self.buf += rest
        return self.p.returncode, self.out


def test_forked_replacement_heals_and_is_owned(launcher, tmp_path):
    # Replica 1 is killed once the server is ready; its replacement is
    # forked from the server and heals. Then (lastdie) that forked
    # replacement dies by SIGKILL after its last step: gorun must see that
    # exit as it is and replace it (by a fork again), and the late
    # replacement finds the job finished.
    job = Job(launcher, tmp_path, "plain,lastdie", 12)
    job.kill_held_rank(r"fork server ready")
    code, out = job.finish()
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
    # The server is stopped with the job, not swept up as a stray.
    assert "left processes running" not in out, tail
    assert_nothing_left(job.marks)


def test_server_killed_replacement_starts_fresh(launcher, tmp_path):
    # The server is SIGKILLed once ready, then replica 1: its replacement
    # starts as a new process (the server, started again, is importing)
    # and heals; nothing is left at the end.
    job = Job(launcher, tmp_path, "plain", 10)
    job.watch(r"fork server ready", r"^RANK 1: HOLDING")
    servers = server_pids(job.marks)
    assert servers, ("no fork server found to kill", job.out[-8000:])
    for pid in servers:
        os.kill(pid, signal.SIGKILL)
    job.kill_held_rank(r"fork server lost; starting it again")
    code, out = job.finish()
    tail = out[-8000:]
    check_job(code, out, 10, died={1}, deaths=1)
    assert 1 not in forked(out), ("rank 1 was forked from a server that was killed", tail)
    assert out.count("fork server started") >= 2, ("the server was not started again", tail)
    assert_nothing_left(job.marks)


def test_job_killed_with_forked_replacement_running(launcher, tmp_path):
    # A forked replacement is killed by gorun's --inject at its step 12,
    # which the supervisor learns from the replacement's own step reports
    # (its collateral descriptor); the next forked one heals. Then gorun
    # is SIGKILLed while it trains: the supervisor (its client gone) kills
    # every rank, the server and the replacement.
    job = Job(launcher, tmp_path, "plain", 100000, extra={"FT_PACE_S": "0.05"},
              inject=["kill:rank=1:after-steps=12"])
    rank0 = int(job.watch(r"rank started pid=(\d+) rank=0\b")[0].group(1))
    job.kill_held_rank(r"fork server ready")
    m = job.watch(r"fault injected .*pid=(\d+) rank=1 .*spec=kill")
    first = forked(job.out)[1][0]
    assert int(m[0].group(1)) == first, ("the injected kill did not reach the forked replacement", job.out[-8000:])
    job.watch(r"(?s)fault injected .*replacement forked pid=\d+ rank=1.*RANK 1: QUORUM [^\n]*healed=True")
    rpid = forked(job.out)[1][-1]
    assert rpid != first, ("the second replacement was not forked", job.out[-8000:])
    assert rpid in left_behind(job.marks), "the forked replacement is not running"
    with open("/proc/%d/stat" % rpid) as f:
        sid = int(f.read().rsplit(")", 1)[1].split()[3])
    # Its own session (and so process group), as every rank has: gorun's
    # signals to the rank's group reach it and nothing else.
    assert sid == rpid, ("the forked replacement is not a session leader", rpid, sid)
    # In the job's cgroup, as the ranks gorun exec'd are.
    with open("/proc/%d/cgroup" % rpid) as f, open("/proc/%d/cgroup" % rank0) as g:
        assert f.read() == g.read(), "the forked replacement is in another cgroup than rank 0"
    assert server_pids(job.marks), "the fork server is not running"
    job.p.send_signal(signal.SIGKILL)
    job.finish(timeout=30)
    assert_nothing_left(job.marks)


@pytest.mark.parametrize("how", ["cancel", "supervisor"])
def test_forked_replacement_gone_when_job_ends_otherwise(launcher, tmp_path, how):
    # The job ends while a forked replacement trains: cancelled (SIGTERM
    # to gorun: the teardown), or its supervisor SIGKILLed (the replacement's
    # parent-death signal, gorun's cgroup kill). Nothing is left.
    job = Job(launcher, tmp_path, "plain", 100000, extra={"FT_PACE_S": "0.05"})
    job.kill_held_rank(r"fork server ready")
    job.watch(r"replacement forked pid=\d+ rank=1", r"^RANK 1: QUORUM [^\n]*healed=True")
    rpid = forked(job.out)[1][0]
    assert rpid in left_behind(job.marks), "the forked replacement is not running"
    if how == "cancel":
        job.p.send_signal(signal.SIGTERM)
    else:
        with open("/proc/%d/stat" % rpid) as f:
            sup = int(f.read().rsplit(")", 1)[1].split()[1])  # its parent: the supervisor
        with open("/proc/%d/cmdline" % sup, "rb") as f:
            assert f.read().split(b"\0")[0] == launcher.gorun.encode(), "the replacement's parent is not gorun's supervisor"
        os.kill(sup, signal.SIGKILL)
    job.finish(timeout=60)
    assert_nothing_left(job.marks)


def test_cuda_initialised_server_is_refused(launcher, tmp_path):
    # A preloaded module leaves torch's CUDA state initialised (here by
    # torch's own flag, as its lazy initialisation sets it: this machine
    # has no GPU): the server refuses to serve, saying why, and the
    # replacement starts as a new process and heals.
    job = Job(launcher, tmp_path, "plain", 10, extra={"GORUN_FT_FORK_PRELOAD": "torch,ft_cudastate"})
    job.kill_held_rank(r"fork server off")
    code, out = job.finish()
    tail = out[-8000:]
    check_job(code, out, 10, died={1}, deaths=1)
    assert "this process has initialised CUDA" in out, tail
    assert not forked(out), ("a replacement was forked from a CUDA-initialised server", tail)
    assert_nothing_left(job.marks)


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
