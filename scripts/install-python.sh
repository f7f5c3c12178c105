#!/usr/bin/env bash
# Makes the checkout's python/ importable by $PYTHON (default /usr/bin/python3,
# Debian's, the one with python3-torch) through a .pth file — an editable
# install without pip: edits in python/ take effect at once, and removing
# the file undoes it. As root the file goes to the interpreter's site
# directory, otherwise to the user's.
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}
dir=$(cd "$(dirname "$0")/../python" && pwd)
if [ "$(id -u)" -eq 0 ]; then
  site=$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')
else
  site=$("$PYTHON" -m site --user-site)
fi
mkdir -p "$site"
echo "$dir" >"$site/gorun-checkout.pth"
echo "install-python: $site/gorun-checkout.pth -> $dir"
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "install-python: warning: $PYTHON has no torch; the backend needs it (Debian: python3-torch)" >&2
  exit 0
fi
"$PYTHON" -c 'import gorun, sys; print("gorun package:", gorun.__file__, "library:", gorun.library_path(), "python:", sys.executable)' 
