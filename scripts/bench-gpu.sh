#!/usr/bin/env bash
# bench-gpu.sh: all-reduce on GPUs, gorun's nccl/ next to torch.distributed's
# NCCL backend, measured in one run on this machine, with ratios and a plot.
#
#   scripts/bench-gpu.sh [--standin] [OUT_DIR]   (default: bench-results/gpu)
#
# One command on a GPU machine with a CUDA build of PyTorch (PY, default
# $PYTHON or the project's venv python, whose PyPI torch is a CUDA build,
# must import torch with CUDA): it builds gorun, checks the
# device-side kernel's PTX with ptxas when the CUDA toolkit is installed,
# and runs, in ROUNDS (3) interleaved rounds whose fastest time per size is
# kept, NP (default: the GPU count) ranks over the sweep -b 8 -e 1G -f 2
# (override with SWEEP="..."):
#   [1] gorun -np NP gorun bench allreduce --device cuda
#   [2] gorun -np NP python bench/torch_allreduce.py --backend nccl
# then `gorun bench report` prints busbw per size with the ratio gorun/torch
# (goal >= 0.95) and the time per call with the microseconds gorun adds
# (goal <= 5). Both sides use the same libnccl.so.2, the one torch's wheel
# bundles (nvidia.nccl), unless GORUN_NCCL_LIBRARY names another. With one
# GPU an all-reduce moves no bytes between ranks (busbw is 0 by nccl-tests'
# factor 2(n-1)/n); compare the time columns, which are then each side's
# per-call cost.
#
# --standin checks the pipeline on a machine without a GPU: it builds the
# stand-in libcuda.so.1 and libnccl.so.2 the tests use (host memory, no
# GPU) and runs the same steps with torch's CPU gloo backend standing in
# for torch's NCCL (the project's venv python, on the CPU). Its figures say
# nothing about GPUs: it proves the script, the builds, the device-side
# check and the report run, and nothing more.
#
# As of this writing the script has run only with --standin: no GPU was
# lent to the sessions that wrote it, so no GPU figure exists yet.
set -euo pipefail
cd "$(dirname "$0")/.."
STANDIN=0
if [ "${1:-}" = "--standin" ]; then
	STANDIN=1
	shift
fi
OUT=${1:-bench-results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The device-side #wrong check is PTX that the driver compiles at run time;
# ptxas (CUDA toolkit) assembles it here, ahead of any GPU, when present.
go run ./nccl/nccltest/standins -ptx "$OUT/count_wrong.ptx" "$OUT/standin" >/dev/null
if command -v ptxas >/dev/null; then
	ptxas -arch=sm_50 "$OUT/count_wrong.ptx" -o "$OUT/count_wrong.cubin"
	echo "bench-gpu: ptxas assembled the count-wrong PTX ($OUT/count_wrong.cubin)" >&2
else
	echo "bench-gpu: no ptxas on PATH: the count-wrong PTX ($OUT/count_wrong.ptx) was not assembled" >&2
fi

if [ "$STANDIN" = 1 ]; then
	SWEEP=${SWEEP:--b 8 -e 1M -f 4}
	ROUNDS=${ROUNDS:-1}
	[ -n "${PY:-}" ] || { source scripts/bench-python.sh; bench_python bench-gpu; }
	NP=${NP:-2}
	TORCH_BACKEND=gloo
	export LD_LIBRARY_PATH="$OUT/standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export STANDIN_CUDA_DEVICES=$NP GORUN_NCCL_LIBRARY="$OUT/standin/libnccl.so.2"
	echo "bench-gpu: --standin: stand-in NCCL and driver (no GPU), torch gloo on the CPU: a pipeline check, not a measurement" >&2
else
	SWEEP=${SWEEP:--b 8 -e 1G -f 2}
	ROUNDS=${ROUNDS:-3}
	[ -n "${PY:-}" ] || { source scripts/bench-python.sh; bench_python bench-gpu; }
	TORCH_BACKEND=nccl
	if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
		echo "bench-gpu: $PY has no CUDA torch (or no GPU is visible); --standin checks the pipeline without one" >&2
		exit 1
	fi
	NP=${NP:-$("$PY" -c 'import torch; print(torch.cuda.device_count())')}
	if [ -z "${GORUN_NCCL_LIBRARY:-}" ]; then
		lib=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
		if [ -n "$lib" ] && [ -e "$lib" ]; then
			export GORUN_NCCL_LIBRARY=$lib
		fi
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
		run "torch $TORCH_BACKEND ($round/$ROUNDS)" torch.$round.txt "$GORUN" -np "$NP" "$PY" bench/torch_allreduce.py --backend "$TORCH_BACKEND" $SWEEP
	}
	files+=("gorun-nccl=$OUT/gorun.$round.json" "torch-$TORCH_BACKEND=$OUT/torch.$round.txt")
done

{
	if [ "$STANDIN" = 1 ]; then
		echo "# --standin: stand-in NCCL on host memory vs torch gloo on the CPU; a pipeline check, NOT a GPU measurement"
	fi
	echo "# all-reduce on GPUs, $NP ranks, sweep $SWEEP, best of $ROUNDS interleaved rounds"
	nvidia-smi -L 2>/dev/null | sed 's/^/# /' || true
	"$GORUN" bench report --plot "$OUT/allreduce.png" --ratio 1/2 "${files[@]}"
} | tee "$OUT/compare.txt"
echo "bench-gpu: results in $OUT/ (compare.txt, allreduce.png, *.txt, *.json)" >&2
