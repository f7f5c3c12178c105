#!/usr/bin/env bash
# `gorun plan` on FSDP-shaped step graphs of about 10k, 30k and 100k nodes
# (stepgraph's planning benchmark input: blocks of 48 nodes with
# per-parameter all-gathers and reduce-scatters), the real command on a real
# file, with the default passes (block, then overlap-preserving bucketing)
# and with all four (reshard, chunk, blocks, overlap). The goal: all four on
# 100k nodes in at most 3 s.
#
# Each figure is the median of RUNS runs, as wall time and as CPU time (user
# + system, which a busy machine inflates less). With ANCHOR set to a git
# revision (e.g. ANCHOR=main), gorun built from that revision runs the same
# files in the same loop, turn about, and the ratio anchor/current is
# printed. The whole run holds /tmp/gorun-bench.lock so that benchmarks do
# not overlap. The machine may be shared: rerun a figure that swings.
#
# Usage: scripts/bench-plan.sh        (RUNS=3, SIZES="208 625 2083" blocks, ANCHOR unset)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
sizes=${SIZES:-"208 625 2083"}
anchor=${ANCHOR:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
exec 9>/tmp/gorun-bench.lock
flock 9

go build -o "$tmp/gorun" ./cmd/gorun
bins=(current)
if [[ -n "$anchor" ]]; then
  rev=$(git rev-parse --verify "$anchor^{commit}")
  mkdir "$tmp/anchor"
  git archive "$rev" | tar -x -C "$tmp/anchor"
  (cd "$tmp/anchor" && go build -o "$tmp/gorun-anchor" ./cmd/gorun)
  bins=(anchor current)
  echo "anchor: $anchor = ${rev:0:12}"
fi
echo "current: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+changes')"
bin() { if [[ $1 == anchor ]]; then echo "$tmp/gorun-anchor"; else echo "$tmp/gorun"; fi; }

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# one BIN PASSES FILE: "wall cpu" of one run.
one() {
  local TIMEFORMAT='%R %U %S' t
  t=$({ time "$1" plan --passes "$2" "$3" >/dev/null; } 2>&1)
  awk '{printf "%.3f %.3f\n", $1, $2 + $3}' <<<"$t"
}

printf '%-8s %-28s' nodes passes
for b in "${bins[@]}"; do printf ' %22s' "$b wall / cpu (s)"; done
[[ -n "$anchor" ]] && printf ' %22s' "anchor/current wall, cpu"
echo
for blocks in $sizes; do
  f="$tmp/step-$blocks.json"
  GORUN_STEP_BLOCKS=$blocks GORUN_WRITE_STEP="$f" go test -count=1 -run '^TestWriteTransformerStep$' ./stepgraph >/dev/null
  nodes=$(grep -c '"kind":' "$f")
  for passes in blocks,overlap reshard,chunk,blocks,overlap; do
    declare -A wall=() cpu=()
    for _ in $(seq "$runs"); do
      for b in "${bins[@]}"; do
        read -r w c < <(one "$(bin "$b")" "$passes" "$f")
        wall[$b]+="$w "
        cpu[$b]+="$c "
      done
    done
    printf '%-8s %-28s' "$nodes" "$passes"
    for b in "${bins[@]}"; do
      mw=$(tr ' ' '\n' <<<"${wall[$b]}" | grep . | median)
      mc=$(tr ' ' '\n' <<<"${cpu[$b]}" | grep . | median)
      printf ' %10s / %9s' "$mw" "$mc"
      eval "w_$b=$mw c_$b=$mc"
    done
    if [[ -n "$anchor" ]]; then
      awk -v aw="$w_anchor" -v cw="$w_current" -v ac="$c_anchor" -v cc="$c_current" \
        'BEGIN {printf " %12.1f×, %6.1f×", aw / cw, ac / cc}'
    fi
    echo
    unset wall cpu
  done
done
echo "medians of $runs runs; goal: reshard,chunk,blocks,overlap on ~100k nodes in at most 3 s"
