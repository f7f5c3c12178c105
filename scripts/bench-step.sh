#!/usr/bin/env bash
# Step-runtime benchmarks over real processes (issue 6), printed side by side
# with their goals:
#
#   synthetic  a transformer-shaped step of L blocks: per block a forward
#              parameter all-gather (prefetched one block ahead) and a
#              backward gradient reduce-scatter, compute modelled as a timed
#              sleep sized to RATIO × the measured communication time.
#              Overlapped step vs ideal max(compute, comm) and vs the serial
#              sum; goal: exposed communication ≤ 10% of communication time
#              when compute ≥ communication.
#   bucketing  200 gradient tensors of 40 KB all-reduced per step, one
#              collective per tensor vs bucketed; goal ≥ 3×.
#
# Every figure is the median over ITERS steps of the slowest rank; the
# variants of one measurement run alternately, so load from other processes
# on a shared machine hits them alike.
#
# Usage: scripts/bench-step.sh [NP...]   (default: 2 4)
#   ITERS=15 BLOCKS=16 SHARD=1048576 RATIO=1.5 CAPS=0,25000000 PREFETCH=2 \
#   TRANSPORTS="shm tcp" scripts/bench-step.sh 4
# (tcp forces TCP loopback between ranks of one host, the inter-host path.)
set -euo pipefail
cd "$(dirname "$0")/.."

nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(2 4)
iters=${ITERS:-15}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

go build -o "$tmp/" ./cmd/gorun ./overlap/internal/stepbench

args=(--iters "$iters" --blocks "${BLOCKS:-16}" --shard "${SHARD:-1048576}" --ratio "${RATIO:-1.5}" --caps "${CAPS:-0,25000000}" --prefetch "${PREFETCH:-2}")
read -r -a transports <<<"${TRANSPORTS:-shm tcp}"

echo "# bench-step: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for np in "${nps[@]}"; do
  for tr in "${transports[@]}"; do
    extra=()
    [ "$tr" = tcp ] && extra=(--tcp)
    echo
    echo "## -np $np, $tr"
    "$tmp/gorun" -np "$np" "$tmp/stepbench" "${args[@]}" "${extra[@]}"
  done
done
