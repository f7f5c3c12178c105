#!/usr/bin/env bash
# `gorun plan` on a 10,000-node step graph (the goal: under 1 s),
# the real command on a real file: an FSDP-shaped step of 208 blocks with
# per-parameter all-gathers and reduce-scatters (stepgraph's planning
# benchmark input, 9,984 nodes), planned with the default passes (block,
# then overlap-preserving bucketing) and with all four passes.
#
# Prints the median wall time of RUNS runs of each and its ratio to the 1 s
# goal. The machine may be shared: rerun a figure that swings.
#
# Usage: scripts/bench-plan.sh        (RUNS=7 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-7}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/gorun" ./cmd/gorun
GORUN_WRITE_STEP="$tmp/step.json" go test -count=1 -run '^TestWriteTransformerStep$' ./stepgraph >/dev/null
nodes=$(grep -c '"kind":' "$tmp/step.json")
echo "graph: $nodes nodes, $(du -k "$tmp/step.json" | cut -f1) KiB of JSON"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for passes in blocks,overlap reshard,chunk,blocks,overlap; do
  for _ in $(seq "$runs"); do
    s=$(date +%s.%N)
    "$tmp/gorun" plan --passes "$passes" "$tmp/step.json" >/dev/null
    e=$(date +%s.%N)
    awk -v s="$s" -v e="$e" 'BEGIN {print e - s}'
  done | median | awk -v p="$passes" -v r="$runs" '{printf "gorun plan --passes %-26s median of %d: %.3f s  (%.2f× the 1 s goal)\n", p, r, $1, $1/1.0}'
done
