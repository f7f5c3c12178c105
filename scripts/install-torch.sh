#!/usr/bin/env bash
# Makes the project's Python environment: a venv at
# ${GORUN_VENV:-$HOME/.cache/gorun/venv} ($XDG_CACHE_HOME for ~/.cache) holding torch (pinned below), pytest,
# numpy and what torch's own test helpers import (expecttest). The Python
# tests, `make python` and the torch benchmarks run its interpreter.
#
# Idempotent: when the venv exists and already holds the pinned torch and the
# rest, it does nothing (CI on a machine that has it reuses it). Otherwise it
# creates the venv (with the python3 on PATH, or $GORUN_VENV_PYTHON) and
# installs the missing pieces from PyPI: PyPI's Linux torch is a CUDA build
# that also runs on the CPU, about 5.4 GB with its CUDA libraries (about a
# minute at 60 MB/s).
#
# Concurrent runs (two checkouts' `make test`) take turns on a lock next to
# the venv, so the second finds the first's work done.
#
#   scripts/install-torch.sh           install if needed; prints the venv's python
#   scripts/install-torch.sh --check   exit 0 if the venv is complete, 1 if not; installs nothing
set -euo pipefail

# torch 2.15.0: the newest release that installs here (Python 3.11, Linux).
# torch 1.13 (Debian's python3-torch) is no longer supported by the backend.
TORCH_VERSION=2.15.0
PACKAGES=("torch==$TORCH_VERSION" pytest numpy expecttest)

gorun_cache=${XDG_CACHE_HOME:-$HOME/.cache}/gorun
venv=${GORUN_VENV:-$gorun_cache/venv}
py=$venv/bin/python

# The default venv sits in gorun's per-user cache directory, which the
# launcher also keeps its private state in (the preload cache) and so wants
# owned by this user with mode 0700 (launcher/privdir); a directory that
# is group- or world-accessible makes it fall back to $TMPDIR. Make it (or
# keep it) private before anything else.
private_cache() {
  [ -n "${GORUN_VENV:-}" ] && return 0
  mkdir -p -m 0700 "$gorun_cache"
  if [ -O "$gorun_cache" ] && [ "$(stat -c %a "$gorun_cache")" != 700 ]; then
    echo "install-torch: $gorun_cache had mode $(stat -c %a "$gorun_cache"); making it 0700 (gorun keeps private state there)" >&2
    chmod 0700 "$gorun_cache"
  fi
}

complete() {
  [ -x "$py" ] && "$py" - "$TORCH_VERSION" <<'EOF' 2>/dev/null
import sys
import expecttest, numpy, pytest, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
EOF
}

case "${1:-}" in
  --check) complete; exit $? ;;
  "") ;;
  *) echo "install-torch: unknown argument $1 (want --check or nothing)" >&2; exit 2 ;;
esac

private_cache
if complete; then
  echo "$py"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if complete; then # another run finished it while this one waited
  echo "$py"
  exit 0
fi
if [ ! -x "$py" ]; then
  base=${GORUN_VENV_PYTHON:-python3}
  if ! "$base" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "install-torch: $base cannot make a venv (Debian: apt-get install python3-venv; scripts/install-test-deps.sh does)" >&2
    exit 1
  fi
  echo "install-torch: creating $venv with $("$base" -c 'import sys; print(sys.executable, sys.version.split()[0])')" >&2
  "$base" -m venv "$venv"
fi
have=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
echo "install-torch: installing ${PACKAGES[*]} into $venv (torch there: $have); torch is a download of about 5 GB" >&2
start=$(date +%s)
"$py" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
if ! complete; then
  echo "install-torch: $venv still lacks torch $TORCH_VERSION, pytest, numpy or expecttest after pip install" >&2
  exit 1
fi
echo "install-torch: done in $(($(date +%s) - start)) s: $("$py" -c 'import torch; print("torch", torch.__version__)')" >&2
echo "$py"
