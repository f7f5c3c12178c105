#!/usr/bin/env bash
# Makes the checkout's python/ importable by $PYTHON (default /usr/bin/python3,
# Debian's, the one with python3-torch) through a .pth file — an editable
# install without pip: edits in python/ take effect at once, and removing
# the file undoes it. As root the file goes to the interpreter's site
# directory (/usr/local/lib/python3.*/dist-packages on Debian), otherwise to
# the user's.
#
#   scripts/install-python.sh              install (make python)
#   scripts/install-python.sh --uninstall  remove the .pth file if it points at
#                                          this checkout, and python/gorun/libgorun.so
#                                          (make uninstall-python; make clean runs it)
#
# Nothing in the repository needs the .pth file: the tests, benchmarks and
# examples put this checkout's python/ first on the path themselves.
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}
dir=$(cd "$(dirname "$0")/../python" && pwd)
if [ "${1:-}" = "--uninstall" ] && ! command -v "$PYTHON" >/dev/null; then
  rm -f "$dir/gorun/libgorun.so" # no interpreter, so no .pth of ours to find (make clean must not fail)
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  site=$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')
else
  site=$("$PYTHON" -m site --user-site)
fi
pth=$site/gorun-checkout.pth

if [ "${1:-}" = "--uninstall" ]; then
  if [ -f "$pth" ]; then
    if [ "$(cat "$pth")" = "$dir" ]; then
      rm -f "$pth"
      echo "install-python: removed $pth"
    else
      echo "install-python: kept $pth: it points at $(cat "$pth"), not this checkout" >&2
    fi
  fi
  rm -f "$dir/gorun/libgorun.so"
  exit 0
fi
if [ -n "${1:-}" ]; then
  echo "install-python: unknown argument $1 (want --uninstall or nothing)" >&2
  exit 2
fi

mkdir -p "$site"
echo "$dir" >"$pth"
echo "install-python: $pth -> $dir (undo: make uninstall-python)"
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "install-python: warning: $PYTHON has no torch; the backend needs it (Debian: python3-torch)" >&2
  exit 0
fi
"$PYTHON" -c 'import gorun, sys; print("gorun package:", gorun.__file__, "library:", gorun.library_path(), "python:", sys.executable)'
