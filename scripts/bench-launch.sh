#!/usr/bin/env bash
# Launch time: `gorun -np 16 /bin/true` against `mpirun --oversubscribe -np 16
# /bin/true` (Debian's openmpi-bin), run alternately in one go so both see
# the same machine load; prints each median and the ratio gorun/mpirun.
# Anchor measured on this machine kind: mpirun 0.12 s median. Goal: ratio
# at most 0.5.
#
# Usage: scripts/bench-launch.sh [RUNS]   (default 20; `make bench-launch`
# builds bin/gorun first). NP overrides the rank count.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-20}
np=${NP:-16}
gorun=bin/gorun
[ -x "$gorun" ] || { echo "bench-launch: $gorun missing; run make build" >&2; exit 1; }

if ! command -v mpirun >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bench-launch: installing openmpi-bin" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends openmpi-bin >/dev/null
  else
    echo "bench-launch: mpirun missing and not root; install openmpi-bin to compare" >&2
  fi
fi

mpi_flags=(--oversubscribe -np "$np")
[ "$(id -u)" -eq 0 ] && mpi_flags=(--allow-run-as-root "${mpi_flags[@]}")

# elapsed prints the wall time of one run in seconds; the command must
# succeed, a failing launcher would otherwise look fast.
elapsed() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>&1 || { echo "bench-launch: failed: $*" >&2; exit 1; }
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f\n", (b - a) / 1e9}'
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }

# Warm the page cache for both binaries so the first sample is not an
# outlier.
"$gorun" -np "$np" /bin/true >/dev/null 2>&1 || true
have_mpi=0
if command -v mpirun >/dev/null 2>&1; then
  have_mpi=1
  mpirun "${mpi_flags[@]}" /bin/true >/dev/null 2>&1 || true
fi

g=() m=()
for ((i = 0; i < runs; i++)); do
  g+=("$(elapsed "$gorun" -np "$np" /bin/true)")
  [ $have_mpi -eq 1 ] && m+=("$(elapsed mpirun "${mpi_flags[@]}" /bin/true)")
done

gmed=$(printf '%s\n' "${g[@]}" | median)
printf 'launch %d x /bin/true, %d runs each, alternating\n' "$np" "$runs"
printf '  gorun   median %.4f s  (min %.4f, max %.4f)\n' "$gmed" \
  "$(printf '%s\n' "${g[@]}" | sort -n | head -1)" "$(printf '%s\n' "${g[@]}" | sort -n | tail -1)"
if [ $have_mpi -eq 1 ]; then
  mmed=$(printf '%s\n' "${m[@]}" | median)
  printf '  mpirun  median %.4f s  (min %.4f, max %.4f)\n' "$mmed" \
    "$(printf '%s\n' "${m[@]}" | sort -n | head -1)" "$(printf '%s\n' "${m[@]}" | sort -n | tail -1)"
  printf '  ratio gorun/mpirun %.3f  (goal <= 0.5; anchor mpirun 0.12 s)\n' "$(awk -v g="$gmed" -v m="$mmed" 'BEGIN {print g / m}')"
else
  echo "  mpirun  not available; no ratio"
fi
