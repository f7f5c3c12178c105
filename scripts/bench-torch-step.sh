#!/usr/bin/env bash
# make bench-torch-step: one training step of a GPT-like model on CPU, at 2
# and 4 ranks: gorun.torch ddp vs torch DDP over gloo, gorun.torch fsdp vs
# torch FSDP2 (fully_shard) over gloo; paired, rotated rounds, medians and
# per-round ratios, exposed communication, peak gathered parameters, and
# the Perfetto trace of rank 0 (open it at https://ui.perfetto.dev).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-${GORUN_VENV:-$HOME/.cache/gorun/venv}/bin/python}
ROUNDS=${ROUNDS:-7}
STEPS=${STEPS:-8}
NPS=${NPS:-"2 4"}
VARIANTS=${VARIANTS:-}  # a comma-separated subset (scripts/bench_torch_step.py --help)
# EXTRA: NAME=JSON of distribute() options, an A/B variant (more: newline-separated)
extra=()
while IFS= read -r e; do [ -n "$e" ] && extra+=(--extra "$e"); done <<<"${EXTRA:-}"
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "bench-torch-step: $PYTHON lacks torch (PYTHON=... to choose another)"; exit 1
fi
out=${OUT:-bench-results/torch-step}
mkdir -p "$out"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" GORUN_LIB="$PWD/bin/libgorun.so" GORUN_BIN="$PWD/bin/gorun"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONWARNINGS=ignore
for np in $NPS; do
  echo "== $np ranks =="
  mkdir -p "$out/np$np"
  bin/gorun -np "$np" --timeout 900s "$PYTHON" scripts/bench_torch_step.py \
    --rounds "$ROUNDS" --steps "$STEPS" --variants "$VARIANTS" ${extra[@]+"${extra[@]}"} --trace-dir "$out/np$np" | grep -v '^\[rank'
done
