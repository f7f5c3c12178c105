#!/usr/bin/env bash
# bench-gpu.sh: all-reduce on GPUs, gorun's nccl/ next to torch.distributed's
# NCCL backend, measured in one run on this machine, with ratios and a plot.
#
#   scripts/bench-gpu.sh [OUT_DIR]        (default: bench-results/gpu)
#
# NOT YET RUN ON A GPU: written in a session without one (the GPU figures of
# issue #13 are still to be taken). It needs a GPU machine with a CUDA build of
# PyTorch; PY (default python3) must import torch with CUDA. Both sides use the
# same libnccl.so.2, the one torch's wheel bundles (nvidia.nccl), unless
# GORUN_NCCL_LIBRARY names another.
#
# Runs NP (default: the GPU count) ranks, -b 8 -e 1G -f 2 (override with
# SWEEP="..."), in ROUNDS (3) interleaved rounds whose fastest time per size is
# kept:
#   [1] gorun -np NP gorun bench allreduce --device cuda
#   [2] gorun -np NP python bench/torch_allreduce.py --backend nccl
# then `gorun bench report` prints busbw per size with the ratio gorun/torch.
# With one GPU an all-reduce moves no bytes between ranks (busbw is 0 by
# nccl-tests' factor 2(n-1)/n); compare the time column, which is then the
# per-call cost of each side.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results/gpu}
SWEEP=${SWEEP:--b 8 -e 1G -f 2}
ROUNDS=${ROUNDS:-3}
PY=${PY:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
	echo "bench-gpu: $PY has no CUDA torch (or no GPU is visible)" >&2
	exit 1
fi
NP=${NP:-$("$PY" -c 'import torch; print(torch.cuda.device_count())')}
if [ -z "${GORUN_NCCL_LIBRARY:-}" ]; then
	lib=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
	if [ -n "$lib" ] && [ -e "$lib" ]; then
		export GORUN_NCCL_LIBRARY=$lib
	fi
fi
echo "bench-gpu: NCCL ${GORUN_NCCL_LIBRARY:-libnccl.so.2 on the loader path}, $NP rank(s)" >&2

go build -o "$OUT/gorun" ./cmd/gorun
GORUN=$OUT/gorun

run() { # label file command...
	local label=$1 file=$2
	shift 2
	echo "bench-gpu: $label" >&2
	if ! "$@" >"$OUT/$file"; then
		echo "bench-gpu: $label failed (output in $OUT/$file)" >&2
		return 1
	fi
}

files=()
for round in $(seq "$ROUNDS"); do
	# shellcheck disable=SC2086 # SWEEP is a list of flags
	{
		run "gorun nccl ($round/$ROUNDS)" gorun.$round.txt "$GORUN" -np "$NP" -x GORUN_NCCL_LIBRARY "$GORUN" bench allreduce $SWEEP --device cuda --json "$OUT/gorun.$round.json"
		run "torch nccl ($round/$ROUNDS)" torch.$round.txt "$GORUN" -np "$NP" "$PY" bench/torch_allreduce.py --backend nccl $SWEEP
	}
	files+=("gorun-nccl=$OUT/gorun.$round.json" "torch-nccl=$OUT/torch.$round.txt")
done

{
	echo "# all-reduce on GPUs, $NP ranks, sweep $SWEEP, best of $ROUNDS interleaved rounds"
	nvidia-smi -L 2>/dev/null | sed 's/^/# /' || true
	"$GORUN" bench report --plot "$OUT/allreduce.png" --ratio 1/2 "${files[@]}"
} | tee "$OUT/compare.txt"
echo "bench-gpu: results in $OUT/ (compare.txt, allreduce.png, *.txt, *.json)" >&2
