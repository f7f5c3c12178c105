#!/usr/bin/env bash
# Installs the checkout's Python package (python/, with python/pyproject.toml)
# into $PYTHON (default: the project venv's, see scripts/install-torch.sh) as
# an editable pip install: edits in python/ take effect at once, and the
# library is the libgorun.so that `make python` copies into python/gorun.
# Nothing goes into a machine-wide site directory.
#
#   scripts/install-python.sh              install (make python)
#   scripts/install-python.sh --uninstall  pip-uninstall gorun from $PYTHON if it is this
#                                          checkout's, and remove python/gorun/libgorun.so
#                                          (make uninstall-python; make clean runs it)
#
# Nothing in the repository needs the install: the tests, benchmarks and
# examples put this checkout's python/ first on the path themselves.
set -euo pipefail
PYTHON=${PYTHON:-${GORUN_VENV:-$HOME/.cache/gorun/venv}/bin/python}
dir=$(cd "$(dirname "$0")/../python" && pwd)

# Where $PYTHON's gorun comes from, as pip records it ("" if not installed).
installed_from() {
  "$PYTHON" -m pip show gorun 2>/dev/null | sed -n 's/^Editable project location: //p'
}

if [ "${1:-}" = "--uninstall" ]; then
  if command -v "$PYTHON" >/dev/null && [ "$(installed_from)" = "$dir" ]; then
    "$PYTHON" -m pip uninstall --quiet --yes gorun
    echo "install-python: uninstalled gorun ($dir) from $PYTHON"
  fi
  rm -f "$dir/gorun/libgorun.so"
  exit 0
fi
if [ -n "${1:-}" ]; then
  echo "install-python: unknown argument $1 (want --uninstall or nothing)" >&2
  exit 2
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "install-python: $PYTHON has no torch; the backend needs torch 2.x (make venv makes the project's venv)" >&2
  exit 1
fi
# No build isolation: setuptools comes with the venv, so this works offline.
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-build-isolation --editable "$dir"
rm -rf "$dir/gorun.egg-info" "$dir/build"
echo "install-python: gorun ($dir) installed into $PYTHON (undo: make uninstall-python)"
(cd / && "$PYTHON" -c 'import gorun, sys, torch; print("gorun package:", gorun.__file__, "library:", gorun.library_path(), "torch:", torch.__version__, "python:", sys.executable)')
