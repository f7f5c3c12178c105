#!/usr/bin/env bash
# bench-compare.sh: all-reduce bus bandwidth of gorun next to Open MPI and
# torch gloo, measured in one run on this machine, with ratios and a plot.
#
#   scripts/bench-compare.sh [OUT_DIR]        (default: bench-results/, ignored by git)
#
# Runs, 2 ranks, -b 8 -e 64M -f 4 (override with SWEEP="...", NP=...), in
# ROUNDS (3) interleaved rounds whose fastest time per size is kept:
#   [1] gorun -np 2 gorun bench allreduce --transport tcp
#   [2] gorun -np 2 gorun bench allreduce --transport shm
#   [3] mpirun -np 2 bench/mpi/allreduce   (btl self,vader: shared memory)
#   [4] mpirun -np 2 bench/mpi/allreduce   (btl self,tcp over loopback)
#   [5] gorun -np 2 PYTHON bench/torch_allreduce.py    (torch gloo, TCP)
# then `gorun bench report` prints busbw per size with the ratios
# gorun-tcp/MPI-tcp, gorun-shm/MPI-shm, gorun-tcp/gloo, gorun-shm/gloo and
# draws OUT_DIR/allreduce.png. As root, installs Debian's openmpi-bin and
# libopenmpi-dev when missing. PYTHON is the project's venv python unless
# set (scripts/bench-python.sh; the venv is made when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results}
SWEEP=${SWEEP:--b 8 -e 64M -f 4}
NP=${NP:-2}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # absolute: ranks and mpirun may start elsewhere

need=()
for p in openmpi-bin libopenmpi-dev; do
	dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
	if [ "$(id -u)" = 0 ]; then
		echo "bench-compare: installing ${need[*]}" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	else
		echo "bench-compare: missing ${need[*]} (run as root to install them)" >&2
		exit 1
	fi
fi

go build -o "$OUT/gorun" ./cmd/gorun
mpicc -O2 -Wall -o "$OUT/mpi_allreduce" bench/mpi/allreduce.c
GORUN=$OUT/gorun
source scripts/bench-python.sh
bench_python bench-compare
# No --oversubscribe unless needed: it makes Open MPI yield while polling,
# which is not how its bandwidth anchors were measured.
MPIRUN=(mpirun -np "$NP")
[ "$NP" -gt "$(nproc)" ] && MPIRUN+=(--oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

run() { # label file command...
	local label=$1 file=$2
	shift 2
	echo "bench-compare: $label" >&2
	if ! "$@" >"$OUT/$file"; then
		echo "bench-compare: $label failed (output in $OUT/$file)" >&2
		return 1
	fi
}

load() { echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"; }
LOAD_BEFORE=$(load)
files=()
# Rounds interleave the five series, so a burst of other work on the shared
# machine hits all of them; the report keeps each series' fastest round.
for round in $(seq "$ROUNDS"); do
	# shellcheck disable=SC2086 # SWEEP is a list of flags
	{
		run "gorun tcp ($round/$ROUNDS)" gorun-tcp.$round.txt "$GORUN" -np "$NP" "$GORUN" bench allreduce $SWEEP --transport tcp --json "$OUT/gorun-tcp.$round.json"
		run "gorun shm ($round/$ROUNDS)" gorun-shm.$round.txt "$GORUN" -np "$NP" "$GORUN" bench allreduce $SWEEP --transport shm --json "$OUT/gorun-shm.$round.json"
		run "Open MPI shm ($round/$ROUNDS)" mpi-shm.$round.txt "${MPIRUN[@]}" --mca btl self,vader "$OUT/mpi_allreduce" $SWEEP
		run "Open MPI tcp ($round/$ROUNDS)" mpi-tcp.$round.txt "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo "$OUT/mpi_allreduce" $SWEEP
		run "torch gloo ($round/$ROUNDS)" gloo.$round.txt "$GORUN" -np "$NP" -x OMP_NUM_THREADS=1 "$PY" bench/torch_allreduce.py $SWEEP
	}
	files+=("gorun-tcp=$OUT/gorun-tcp.$round.json" "gorun-shm=$OUT/gorun-shm.$round.json"
		"mpi-shm=$OUT/mpi-shm.$round.txt" "mpi-tcp=$OUT/mpi-tcp.$round.txt" "gloo=$OUT/gloo.$round.txt")
done

{
	echo "# all-reduce, $NP ranks, sweep $SWEEP, best of $ROUNDS interleaved rounds"
	echo "$LOAD_BEFORE (before)"
	echo "$(load) (after)"
	"$GORUN" bench report --plot "$OUT/allreduce.png" \
		--ratio 1/4 --ratio 2/3 --ratio 1/5 --ratio 2/5 "${files[@]}"
} | tee "$OUT/compare.txt"
cat <<'ANCHORS'
#
# Anchors (DESIGN.md, 2 ranks, this kind of machine): Open MPI shm 4.7 GB/s at 2M,
# 1.2-1.3 GB/s at >= 32M; Open MPI TCP 0.7-1.0 GB/s at >= 8M, 19 us at 8 B;
# gloo 0.6-0.8 GB/s at >= 8M, > 1 ms at 8 B. The machine is shared: rerun
# before trusting one number.
ANCHORS
echo "bench-compare: results in $OUT/ (compare.txt, allreduce.png, *.txt, *.json)" >&2
