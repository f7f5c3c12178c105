# Sourced, never run, by the benchmark scripts, from the repository root:
# the project's Python for a benchmark.
#
#   bench_python NAME        sets PY to $PYTHON if set, else to the project
#                            venv's python (scripts/install-torch.sh makes the
#                            venv when it is missing, as `make venv` does), and
#                            exits with a message naming NAME when that
#                            python cannot import torch.distributed.
#   bench_python NAME stdlib for a script that needs only the standard
#                            library: $PYTHON, else the venv's python when the
#                            venv is there, else python3 on PATH (no install).
bench_python() {
  local name=$1 need=${2:-torch} venv_py
  venv_py=${GORUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gorun/venv}/bin/python
  if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
  elif [ "$need" = stdlib ]; then
    PY=python3
    [ -x "$venv_py" ] && PY=$venv_py
    return 0
  else
    PY=$(bash scripts/install-torch.sh) || {
      echo "$name: scripts/install-torch.sh could not make the project's venv (make venv; or set PYTHON to a python with torch 2.x)" >&2
      exit 1
    }
  fi
  if [ "$need" = torch ] && ! "$PY" -c 'import torch.distributed' 2>/dev/null; then
    echo "$name: $PY cannot import torch.distributed: run make venv (scripts/install-torch.sh), or set PYTHON to a python with torch 2.x" >&2
    exit 1
  fi
  return 0
}
