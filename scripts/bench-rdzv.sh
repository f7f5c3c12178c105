#!/usr/bin/env bash
# Formation benchmark: start N ranks, form the world, one barrier,
# leave — `gorun -np N bin/rdzvbarrier` against `mpirun -np N` of the same
# thing in MPI (bench/mpi/barrier.c: MPI_Init + MPI_Barrier + MPI_Finalize).
# Runs alternate (gorun, mpirun, gorun, ...) so both see the same machine
# load; prints each median and the ratio. Goal: gorun ≤ 0.5 × mpirun
# (anchor here: Open MPI 4.1, 16 ranks, 0.81 s median).
#
#   scripts/bench-rdzv.sh [-n RANKS] [-r RUNS]
#
# Needs Go and, for the MPI side, Open MPI (installed with apt when running
# as root and missing; skipped with a message otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

np=16
runs=11
while getopts "n:r:" o; do
  case $o in
    n) np=$OPTARG ;;
    r) runs=$OPTARG ;;
    *) echo "usage: $0 [-n RANKS] [-r RUNS]" >&2; exit 2 ;;
  esac
done

mkdir -p bin
go build -o bin/ ./cmd/gorun ./examples/rdzvbarrier

have_mpi=1
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "bench-rdzv: installing openmpi-bin libopenmpi-dev" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
  else
    echo "bench-rdzv: Open MPI missing and not root: measuring gorun only" >&2
    have_mpi=0
  fi
fi
if [ $have_mpi -eq 1 ]; then
  mpicc -O2 -o bin/mpibarrier bench/mpi/barrier.c
fi

# elapsed prints the wall time of one command in seconds, failing loudly if it fails.
elapsed() {
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$@" >/dev/null 2>/tmp/bench-rdzv.err; then
    echo "bench-rdzv: failed: $*" >&2
    cat /tmp/bench-rdzv.err >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}'
}

median() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.3f", m}'; }

mpi_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
g=() m=()
# One warm-up of each (page cache, first exec), not counted.
bin/gorun -np "$np" bin/rdzvbarrier -q >/dev/null
[ $have_mpi -eq 1 ] && "${mpi_env[@]}" mpirun --oversubscribe --allow-run-as-root -np "$np" bin/mpibarrier >/dev/null
for ((i = 0; i < runs; i++)); do
  g+=("$(elapsed bin/gorun -np "$np" bin/rdzvbarrier -q)")
  if [ $have_mpi -eq 1 ]; then
    m+=("$(elapsed "${mpi_env[@]}" mpirun --oversubscribe --allow-run-as-root -np "$np" bin/mpibarrier)")
  fi
done

gm=$(printf '%s\n' "${g[@]}" | median)
printf 'formation + 1 barrier, %d ranks, %d runs each (median, seconds)\n' "$np" "$runs"
printf '  gorun  -np %-3d bin/rdzvbarrier : %s   (runs: %s)\n' "$np" "$gm" "$(printf '%.3f ' "${g[@]}")"
if [ $have_mpi -eq 1 ]; then
  mm=$(printf '%s\n' "${m[@]}" | median)
  printf '  mpirun -np %-3d bin/mpibarrier  : %s   (runs: %s)\n' "$np" "$mm" "$(printf '%.3f ' "${m[@]}")"
  printf '  ratio gorun/mpirun            : %.2f   (goal <= 0.50; anchor mpirun 0.81 s)\n' "$(awk -v a="$gm" -v b="$mm" 'BEGIN {print a / b}')"
fi
