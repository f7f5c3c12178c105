#!/usr/bin/env bash
# bench-torch.sh: torch.distributed all-reduce bus bandwidth with the gorun
# backend next to gloo, and gorun's native `gorun bench` in the same run,
# with ratios; then a DDP training step on both backends.
#
#   scripts/bench-torch.sh [OUT_DIR]        (default: bench-results/torch, ignored by git)
#
# For NPS (default "2 4") ranks, in ROUNDS (default 3) interleaved rounds
# whose fastest time per size is kept (sweep -b 8 -e 64M -f 4, i.e. 8 B to
# 32 MiB by factors of 4; SWEEP='-b 16 -e 64M -f 4' ends at 64 MiB):
#   [1] gorun -np N python3 bench/torch_allreduce.py --backend gloo
#   [2] gorun -np N python3 bench/torch_allreduce.py --backend gorun
#   [3] gorun -np N gorun bench allreduce          (native, the same runtime)
# `gorun bench report` prints busbw per size with the ratios torch-gorun/gloo
# (goal: >= 2 at >= 64 KiB, >= 10 at 8 B) and torch-gorun/native (the cost
# of the Python/C boundary, with rows of 40 calls; goal: >= 0.9 at >= 1 MiB).
# Rows that short swing up to 2x at >= 1 MiB on a crowded host, so the
# boundary part then measures that goal alone: native and torch-gorun in
# BOUNDARY_ROUNDS (default 6) interleaved rounds in alternating order, both
# in place (torch's all-reduce is), 1-4 MiB in rows of 300 calls and
# 8-32 MiB in rows of 60 (1000 and 200 on 2 ranks, whose calls take a
# third of the time), medians and the median of the per-round ratios.
# During each run bench/copybound/placewatch measures the round trip of a
# cache line between the two CPUs every 250 ms, which says where the VM
# keeps them (on the 2-core reference VM about 50-120 ns "near" or 300 ns
# "far", flipping every few seconds under load; corelat's one reading on
# the idle host before a run did not predict it, notes/torch-backend.md):
# the table is printed for all rounds and for the rounds whose both runs
# spent at least three quarters of their probes near, or far.
# Then bench/torch_fused.py times 64 x 1 KiB all-reduced as one
# all_reduce_coalesced and as 64 async all_reduces then waits, against one
# 64 KiB all_reduce (goal: within 2x), on gorun and on gloo (FUSED_ROUNDS
# rotated rounds, default 9, of FUSED_STEPS steps, default 100; medians;
# FUSED_BACKENDS="gorun" leaves gloo's long rows out).
# Then examples/torch/ddp.py times a DDP step with each backend (medians over
# ROUNDS interleaved rounds, wall and CPU per rank, with the ratio). First,
# bench/torch_overhead.py prints the per-call cost of each layer on one rank.
# Every program runs as a user would start it, with no extra flags
# (TORCH_GORUN_FLAGS and GLOO_FLAGS add some, e.g. --session shared).
# PARTS (default "overhead allreduce ddp") picks the parts to run, so that
# each can be run on its own on a shared machine.
# Runs the project's Python (PYTHON, default the venv scripts/install-torch.sh
# makes and `make venv` names; scripts/bench-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results/torch}
SWEEP=${SWEEP:--b 8 -e 64M -f 4}
NPS=${NPS:-2 4}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:--w 5 -n 40}
TORCH_GORUN_FLAGS=${TORCH_GORUN_FLAGS-}
PARTS=${PARTS:-overhead allreduce boundary fused ddp}
BOUNDARY_ROUNDS=${BOUNDARY_ROUNDS:-6}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
GLOO_FLAGS=${GLOO_FLAGS-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

source scripts/bench-python.sh
bench_python bench-torch
echo "bench-torch: $PY, torch $("$PY" -c 'import torch; print(torch.__version__)')" >&2
make --no-print-directory build lib >/dev/null
GORUN=bin/gorun
# This checkout's package and library, whatever `make python` installed.
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} GORUN_LIB=$PWD/bin/libgorun.so OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore

run() { # label file command...
	local label=$1 file=$2
	shift 2
	echo "bench-torch: $label" >&2
	if ! "$@" >"$OUT/$file"; then
		echo "bench-torch: $label failed (output in $OUT/$file)" >&2
		return 1
	fi
}
# getconf, not nproc: nproc obeys the OMP_NUM_THREADS=1 exported above.
load() { echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"; }

# The per-call cost of each layer on one rank (torch's floor for a Python
# backend, the library call, the backend's sync and async paths, gloo).
if part overhead; then
	"$GORUN" -np 1 "$PY" bench/torch_overhead.py | tee "$OUT/overhead.txt"
fi

part allreduce && for np in $NPS; do
	before=$(load)
	files=()
	for round in $(seq "$ROUNDS"); do
		# shellcheck disable=SC2086 # SWEEP and ITERS are lists of flags
		{
			run "np $np gloo ($round/$ROUNDS)" gloo.$np.$round.txt "$GORUN" -np "$np" $GLOO_FLAGS "$PY" bench/torch_allreduce.py --backend gloo $SWEEP $ITERS
			run "np $np torch-gorun ($round/$ROUNDS)" torch-gorun.$np.$round.txt "$GORUN" -np "$np" $TORCH_GORUN_FLAGS "$PY" bench/torch_allreduce.py --backend gorun $SWEEP $ITERS
			run "np $np native ($round/$ROUNDS)" native.$np.$round.txt "$GORUN" -np "$np" "$GORUN" bench allreduce $SWEEP $ITERS --json "$OUT/native.$np.$round.json"
		}
		files+=("gloo=$OUT/gloo.$np.$round.txt" "torch-gorun=$OUT/torch-gorun.$np.$round.txt" "native=$OUT/native.$np.$round.json")
	done
	{
		echo "# torch all-reduce, $np ranks, sweep $SWEEP, best of $ROUNDS interleaved rounds; gorun flags: gloo '$GLOO_FLAGS', torch-gorun '$TORCH_GORUN_FLAGS'"
		echo "$before (before)"
		echo "$(load) (after)"
		"$GORUN" bench report --plot "$OUT/allreduce.$np.png" --ratio 2/1 --ratio 2/3 "${files[@]}"
		# The same rounds, by median: one run's best is one quiet moment,
		# the median what a run usually gets.
		"$PY" scripts/bench_torch_tables.py medians "$OUT" "$np" "$ROUNDS"
	} | tee "$OUT/compare.$np.txt"
done

# The boundary at >= 1 MiB with rows long enough to mean something.
part boundary && cc -O2 -Wall -pthread -o "$OUT/placewatch" bench/copybound/placewatch.c
part boundary && for np in $NPS; do
	before=$(load)
	: >"$OUT/boundary.placement.$np.txt"
	for round in $(seq "$BOUNDARY_ROUNDS"); do
		order="native torch-gorun"
		[ $((round % 2)) = 0 ] && order="torch-gorun native"
		for side in $order; do
			for half in a b; do
				# Rows of a few hundred ms: 2 ranks take a third of 4's time.
				sweep="-b 1M -e 4M -f 2 -n $((np > 2 ? 300 : 1000)) -w 20"
				[ "$half" = b ] && sweep="-b 8M -e 32M -f 2 -n $((np > 2 ? 60 : 200)) -w 5"
				f=boundary.$side$half.$np.$round.txt
				"$OUT/placewatch" >"$OUT/placewatch.out" &
				watch=$! rc=0
				# shellcheck disable=SC2086 # sweep and the flags are lists of flags
				if [ "$side" = native ]; then
					run "boundary np $np native $half ($round/$BOUNDARY_ROUNDS)" "$f" "$GORUN" -np "$np" "$GORUN" bench allreduce $sweep || rc=1
				else
					run "boundary np $np torch-gorun $half ($round/$BOUNDARY_ROUNDS)" "$f" "$GORUN" -np "$np" $TORCH_GORUN_FLAGS "$PY" bench/torch_allreduce.py --backend gorun $sweep || rc=1
				fi
				kill -TERM "$watch"
				wait "$watch"
				echo "$side$half $round $(cat "$OUT/placewatch.out")" >>"$OUT/boundary.placement.$np.txt"
				[ "$rc" = 0 ] || exit 1
			done
		done
	done
	{
		echo "# the Python/C boundary, $np ranks, $BOUNDARY_ROUNDS interleaved rounds, in place; gorun flags: torch-gorun '$TORCH_GORUN_FLAGS'"
		echo "$before (before)"
		echo "$(load) (after)"
		"$PY" scripts/bench_torch_tables.py boundary "$OUT" "$np" "$BOUNDARY_ROUNDS"
	} | tee "$OUT/boundary.$np.txt"
done

# Many small all-reduces against one large one (fusion through torch).
part fused && for np in $NPS; do
	before=$(load)
	for b in ${FUSED_BACKENDS:-gorun gloo}; do
		flags=$GLOO_FLAGS
		[ "$b" = gorun ] && flags=$TORCH_GORUN_FLAGS
		# shellcheck disable=SC2086 # flags is a list
		run "fused np $np $b" fused.$b.$np.txt "$GORUN" -np "$np" $flags "$PY" bench/torch_fused.py --backend "$b" \
			--rounds "${FUSED_ROUNDS:-9}" --steps "${FUSED_STEPS:-100}"
	done
	{
		echo "# 64 x 1 KiB vs one 64 KiB all_reduce, $np ranks; gorun flags: gloo '$GLOO_FLAGS', torch-gorun '$TORCH_GORUN_FLAGS'"
		echo "$before (before)"
		echo "$(load) (after)"
		for b in ${FUSED_BACKENDS:-gorun gloo}; do cat "$OUT/fused.$b.$np.txt"; done
	} | tee "$OUT/fused.$np.txt"
done

# DDP: ROUNDS interleaved rounds per rank count, medians across rounds of
# each run's median step (wall) and CPU per step per rank (every thread).
part ddp || exit 0
DDP_STEPS=${DDP_STEPS:-40}
: >"$OUT/ddp.runs.txt"
for round in $(seq "$ROUNDS"); do
	for np in $NPS; do
		for b in gloo gorun; do
			echo "bench-torch: DDP np $np $b ($round/$ROUNDS)" >&2
			flags=$GLOO_FLAGS
			[ "$b" = gorun ] && flags=$TORCH_GORUN_FLAGS
			# shellcheck disable=SC2086 # flags is a list
			"$GORUN" -np "$np" $flags "$PY" examples/torch/ddp.py --backend "$b" --width 1024 --steps "$DDP_STEPS" |
				grep '^backend' >>"$OUT/ddp.runs.txt"
		done
	done
done
{
	echo "# DDP step (examples/torch/ddp.py --width 1024 --steps $DDP_STEPS), $ROUNDS interleaved rounds"
	echo "$(load)"
	"$PY" scripts/bench_torch_tables.py ddp "$OUT/ddp.runs.txt"
	echo "# The machine may be shared: rerun before trusting one number."
} | tee "$OUT/ddp.txt"
echo "bench-torch: results in $OUT/" >&2
