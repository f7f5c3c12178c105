"""`pip install ./python` (a wheel, not the editable install `make python`
makes) carries every module of the package, gorun.torch included."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import PYDIR

pytest.importorskip("setuptools")


def test_the_wheel_holds_every_module_of_the_package(tmp_path):
    # Built from a copy, so that setuptools' build/ and egg-info never land
    # in the checkout; no build isolation, so it works offline.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(PYDIR, "pyproject.toml"), src)
    shutil.copy(os.path.join(PYDIR, "README.md"), src)
    shutil.copytree(os.path.join(PYDIR, "gorun"), src / "gorun",
                    ignore=shutil.ignore_patterns("__pycache__", "libgorun.so"))
    out = tmp_path / "wheel"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-3000:]
    wheels = list(out.glob("gorun-*.whl"))
    assert len(wheels) == 1, wheels
    held = set(zipfile.ZipFile(wheels[0]).namelist())
    want = set()
    for d, dirs, files in os.walk(src / "gorun"):
        rel = os.path.relpath(d, src)
        want.update(os.path.join(rel, f) for f in files if f.endswith(".py"))
    assert "gorun/torch/__init__.py" in want, sorted(want)
    missing = sorted(want - held)
    assert not missing, "the wheel lacks %s" % missing


def test_a_library_older_than_the_package_is_named(tmp_path):
    # A libgorun.so that lacks a function the package calls (built from an
    # older gorun) is refused with the function's name and what to do, not
    # with ctypes' AttributeError from deep inside the first call.
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    c = tmp_path / "old.c"
    c.write_text("int gorun_abi_version(void) { return 1; }\n")
    so = tmp_path / "libgorun.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(c)], check=True)
    env = dict(os.environ, GORUN_LIB=str(so), PYTHONPATH=PYDIR)
    p = subprocess.run([sys.executable, "-c", "from gorun import _lib; _lib.lib()"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode(errors="replace")
    assert p.returncode != 0, out
    assert "GorunError" in out and str(so) in out and "has no gorun_" in out and "make lib" in out, out
    assert "AttributeError" not in out, out
