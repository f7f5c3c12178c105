"""gorun's fork server for fault-tolerant Python ranks (internal).

A replacement rank under ``gorun --fault-tolerant`` spends most of its
start in Python importing torch (and the torch._dynamo that the first
optimizer imports): seconds, against a fraction of a second for the join
and the heal. With ``GORUN_FT_FORK_SERVER=1`` in the ranks' environment,
gorun's per-host supervisor starts this module once per host, in the
ranks' interpreter, environment and directory; it imports the modules of
GORUN_FT_FORK_PRELOAD (torch, torch._dynamo and gorun.ft by default) and
waits. When a rank dies, the supervisor asks it for the replacement: this
process forks it, with the rank's argv, environment, directory and
descriptors (received over the control socket, SCM_RIGHTS), and the child
runs the rank's script as ``python SCRIPT ARGS`` would.

Ownership stays with the supervisor, as for any rank: the child is forked
twice (server -> intermediate -> child) and the intermediate exits at
once, so the child is orphaned to the supervisor, a child subreaper, which
reaps it and sees its exit status directly. The child waits for the
supervisor's "go" (a byte on a pipe whose write end only the supervisor
holds) before it does anything: the supervisor sends it once it has
recorded the child's pid; if the supervisor dies or gives up first, the
pipe ends empty and the child exits without running the script. The child
then takes its own session, sets its parent-death signal to SIGKILL and
checks that its parent is the supervisor.

Refused, with an error the supervisor logs before it starts the
replacement afresh instead: a server that has initialised CUDA (a forked
child cannot use the CUDA context), or loaded libgorun (Go's runtime does
not survive fork), and a command line this module cannot reproduce (an
interpreter option other than -u or -B).

The protocol, one datagram per message on a SOCK_SEQPACKET socket (fd
GORUN_FT_FORK_FD): the server first sends {"ready": true, "pid": P,
"preloaded": [...]} or {"error": E, "fatal": true}; then for each request
{"argv": [...], "env": ["K=V", ...], "dir": D, "fds": [N0, N1, ...]} with
descriptors attached (the child's descriptor N_i is the i-th attached
one; the last attached one is the "go" pipe's read end) it answers
{"pid": CHILD} or {"error": E, "fatal": bool}.
"""

import atexit
import ctypes
import fcntl
import gc
import importlib
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback

FD_ENV = "GORUN_FT_FORK_FD"
PRELOAD_ENV = "GORUN_FT_FORK_PRELOAD"
FORKED_AT_ENV = "GORUN_FT_FORKED_AT"
DEFAULT_PRELOAD = "torch,torch._dynamo,gorun.ft"
MAX_MSG = 1 << 20
MAX_FDS = 16
_PR_SET_PDEATHSIG = 1


class Refused(Exception):
    """A request this server will not fork; fatal when no later request
    could be served either."""

    def __init__(self, why, fatal=False):
        super().__init__(why)
        self.fatal = fatal


def refusal():
    """Why this process must not fork a rank now, or None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return ("gorun fork server: this process has initialised CUDA (a module of %s=%s did); a forked "
                "child cannot use the parent's CUDA context, so the server refuses to fork replacements"
                % (PRELOAD_ENV, os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD)))
    lib = sys.modules.get("gorun._lib")
    if lib is not None and lib._pid is not None:
        return ("gorun fork server: this process has loaded libgorun (a module of %s=%s did); Go's runtime "
                "does not survive fork, so the server refuses to fork replacements"
                % (PRELOAD_ENV, os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD)))
    return None


def command_line(argv):
    """What the child runs, from the rank's argv (interpreter first):
    ("path", SCRIPT, ARGS, flags) or ("module", MOD, ARGS, flags)."""
    flags, i = set(), 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        a = argv[i]
        if a == "-m":
            if i + 1 >= len(argv):
                raise Refused("gorun fork server: argv %r: -m without a module" % (argv,))
            return "module", argv[i + 1], argv[i + 2:], flags
        if a in ("-u", "-B"):
            flags.add(a)
            i += 1
            continue
        raise Refused("gorun fork server: argv %r: the interpreter option %s is not reproduced in a fork "
                      "(only -u, -B and -m are)" % (argv, a))
    if i >= len(argv) or argv[i] == "-":
        raise Refused("gorun fork server: argv %r: no script to run" % (argv,))
    return "path", argv[i], argv[i + 1:], flags


def main():
    fd = int(os.environ.pop(FD_ENV))
    sock = socket.socket(fileno=fd)
    sup = os.getppid()
    names = [m.strip() for m in os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD).split(",") if m.strip()]
    try:
        for name in names:
            importlib.import_module(name)
        why = refusal()
    except BaseException as e:  # noqa: BLE001 (the supervisor gets the reason)
        why = "gorun fork server: preloading %s: %s: %s" % (",".join(names), type(e).__name__, e)
    if why:
        send(sock, {"error": why, "fatal": True})
        return 1
    # Objects made so far are the parent's: keep the collector from
    # touching them in the children (fewer copied pages after the fork).
    gc.freeze()
    send(sock, {"ready": True, "pid": os.getpid(), "preloaded": names})
    while True:
        reap_intermediates()
        try:
            msg, fds, _, _ = socket.recv_fds(sock, MAX_MSG, MAX_FDS)
        except OSError:
            return 0
        if not msg:
            return 0  # the supervisor closed its end: the job is over
        try:
            send(sock, {"pid": serve(json.loads(msg), fds, sock, sup)})
        except Refused as e:
            send(sock, {"error": str(e), "fatal": e.fatal})
        except Exception as e:  # noqa: BLE001
            send(sock, {"error": "gorun fork server: %s: %s" % (type(e).__name__, e), "fatal": False})
        finally:
            for f in fds:
                os.close(f)


def send(sock, obj):
    sock.send(json.dumps(obj).encode())


def serve(req, fds, sock, sup):
    """Forks the child of one request (twice, so that it is orphaned to the
    supervisor) and returns its pid."""
    why = refusal()
    if why:
        raise Refused(why, fatal=True)
    targets = req["fds"]
    if len(fds) != len(targets) + 1:
        raise Refused("gorun fork server: %d descriptors for %d targets and the go pipe" % (len(fds), len(targets)))
    cmd = command_line(req["argv"])
    # The replacement's "process start", for whoever times it
    # (FORKED_AT_ENV): the moment the server began making it, before both
    # forks, which under load are not free.
    req["forked_at"] = time.time()
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:  # the intermediate: fork the child, tell its pid, leave
        try:
            os.close(r)
            me = os.getpid()  # before the fork: the child may run only after this process is gone
            child = os.fork()
            if child == 0:
                os.close(w)
                run_child(req, cmd, fds, sock, sup, me)  # never returns
            os.write(w, b"%d\n" % child)
        finally:
            os._exit(0)
    os.close(w)
    # The pid line, not the pipe's end: the intermediate's exit (tearing
    # down a copy of this process's address space) is not waited for here
    # but reaped later (reap_intermediates); the child waits for it.
    _intermediates.append(mid)
    try:
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    if not data.endswith(b"\n"):
        raise Refused("gorun fork server: the intermediate process ended before it forked the replacement")
    return int(data)


_intermediates = []


def reap_intermediates():
    """Reaps the intermediate processes that have exited."""
    for pid in list(_intermediates):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _intermediates.remove(pid)


def run_child(req, cmd, fds, sock, sup, mid):
    """The replacement (mid: the intermediate process that forked it): wait
    for the supervisor's go, become the rank, run its script, exit as
    Python would. Never returns. mid comes from the intermediate itself:
    asked here with getppid, it would be the supervisor's pid whenever the
    intermediate had already exited, and the wait for its exit below would
    never end."""
    code = 1
    try:
        sock.close()
        go = fds[-1]
        if os.read(go, 1) != b"g":
            os._exit(1)  # the supervisor did not take this child: run nothing
        while os.getppid() == mid:
            time.sleep(0.0005)  # the intermediate is still exiting
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != sup:
            os._exit(1)  # the supervisor died before the death signal was set
        place_fds(fds[:-1], req["fds"])
        os.chdir(req["dir"])
        os.environ.clear()
        for kv in req["env"]:
            k, _, v = kv.partition("=")
            os.environ[k] = v
        os.environ[FORKED_AT_ENV] = repr(req["forked_at"])
        code = run(cmd)
    except BaseException:  # noqa: BLE001 (set-up failed: say why, as a crashed start would)
        traceback.print_exc()
    os._exit(code)


def place_fds(fds, targets):
    """Moves the received descriptors to the numbers the rank expects and
    closes every other one (an exec'd rank holds exactly these)."""
    top = max(targets) + 1
    high = [fcntl.fcntl(f, fcntl.F_DUPFD, top) for f in fds]  # out of the way of the targets
    for f in fds:
        os.close(f)
    for h, t in zip(high, targets):
        os.dup2(h, t, inheritable=True)
    os.closerange(top, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)


def run(cmd):
    """Runs the rank's script or module as __main__ and returns its exit
    code as the interpreter would give it."""
    import runpy

    kind, target, args, flags = cmd
    if "-u" in flags or os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)
    if "-B" in flags or os.environ.get("PYTHONDONTWRITEBYTECODE"):
        sys.dont_write_bytecode = True
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        if kind == "path":
            sys.argv = [target] + args
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = [target] + args
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = exit_code(e)
    except KeyboardInterrupt:
        finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # exit as Python does: by SIGINT
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    finish()
    return code


def exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def finish():
    """What the interpreter does at exit: wait for non-daemon threads, run
    the atexit functions, flush the standard streams."""
    try:
        threading._shutdown()
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__main__":
    sys.exit(main())
