#!/usr/bin/env bash
# Installs torchft 0.2.0 (PyPI) into the project's venv, for the
# fault-tolerance anchor (make bench-ft-torch). Optional: nothing in
# `make test` needs it.
#
# torchft 0.2.0 asks for torch>=2.7 and OpenTelemetry; the venv's torch
# (scripts/install-torch.sh's pin) satisfies it, so pip keeps it. The script
# checks that torch is the same before and after, and refuses to go on if
# pip would change it (--no-deps then installs torchft alone).
#
#   scripts/install-torchft.sh           install if missing; prints the venv's python
#   scripts/install-torchft.sh --check   exit 0 if torchft 0.2.0 is there; installs nothing
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHFT_VERSION=0.2.0
py=$(bash scripts/install-torch.sh)

have() {
  "$py" - "$TORCHFT_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import torchft  # noqa: F401
sys.exit(0 if version("torchft") == sys.argv[1] else 1)
PY
}

case "${1:-}" in
  --check) have; exit $? ;;
  "") ;;
  *) echo "install-torchft: unknown argument $1 (want --check or nothing)" >&2; exit 2 ;;
esac
if have; then
  echo "$py"
  exit 0
fi
torch_before=$("$py" -c 'import torch; print(torch.__version__)')
plan=$("$py" -m pip install --disable-pip-version-check --dry-run "torchft==$TORCHFT_VERSION" 2>&1 | sed -n 's/^Would install //p')
if echo "$plan" | tr ' ' '\n' | grep -q '^torch-'; then
  echo "install-torchft: pip would replace torch $torch_before ($plan); installing torchft without its dependencies" >&2
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps "torchft==$TORCHFT_VERSION" >&2
else
  "$py" -m pip install --quiet --disable-pip-version-check "torchft==$TORCHFT_VERSION" >&2
fi
torch_after=$("$py" -c 'import torch; print(torch.__version__)')
if [ "$torch_before" != "$torch_after" ]; then
  echo "install-torchft: torch changed from $torch_before to $torch_after: rerun scripts/install-torch.sh" >&2
  exit 1
fi
have || { echo "install-torchft: torchft $TORCHFT_VERSION is still not importable" >&2; exit 1; }
echo "install-torchft: torchft $TORCHFT_VERSION installed (torch $torch_after kept)" >&2
echo "$py"
