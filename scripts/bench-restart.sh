#!/usr/bin/env bash
# Kill-and-restart: the same torch gloo program (bench/restart/gloo_restart.py)
# under `gorun --max-restarts 1` and `torchrun --max_restarts 1`, run
# alternately so both see the same load. Rank 2 SIGKILLs itself 1 s after
# its group formed; the time measured is from that kill to the first
# all-reduce of the restarted world (rank 0's "first-step restart=1" line):
# detection, teardown, relaunch, python+torch import, rendezvous, one step.
# gorun's own part, kill → world gone, comes from its --report.
# Prints medians and the ratio gorun/torchrun.
#
# Usage: scripts/bench-restart.sh [RUNS]   (default 5; `make bench-restart`
# builds bin/gorun first). NP sets the rank count (default 4);
# TORCH_MONITOR torchrun's --monitor_interval (default: torchrun's own, 5 s).
# PYTHON: the python both run (default the project's venv, made when missing;
# scripts/bench-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
np=${NP:-4}
gorun=bin/gorun
prog=bench/restart/gloo_restart.py
# Rank 2 is the one that kills itself: with fewer ranks nothing would die.
[ "$np" -ge 3 ] 2>/dev/null || { echo "bench-restart: NP=$np: want at least 3 ranks (rank 2 kills itself)" >&2; exit 2; }
[ -x "$gorun" ] || { echo "bench-restart: $gorun missing; run make build" >&2; exit 1; }
source scripts/bench-python.sh
bench_python bench-restart
py=$PY
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mon=()
[ -n "${TORCH_MONITOR:-}" ] && mon=(--monitor_interval "$TORCH_MONITOR")

# gap prints kill → first step of the restarted world from a run's output.
gap() {
  awk '/kill t=/ {sub(/.*kill t=/, ""); k = $1}
       /first-step restart=1 t=/ {sub(/.*first-step restart=1 t=/, ""); f = $1}
       END { if (k == "" || f == "") exit 1; printf "%.3f\n", f - k }' "$1"
}

for i in $(seq "$runs"); do
  "$gorun" -np "$np" --max-restarts 1 --report "$tmp/report.json" "$py" "$prog" >"$tmp/g.out" 2>&1 ||
    { cat "$tmp/g.out" >&2; echo "bench-restart: gorun run failed" >&2; exit 1; }
  gap "$tmp/g.out" >>"$tmp/gorun" || { cat "$tmp/g.out" >&2; exit 1; }
  # The kill is the rank's own, so the report has no fault; world 0's end
  # minus the kill's time is gorun's detection and teardown.
  "$py" - "$tmp/report.json" "$tmp/g.out" >>"$tmp/gone" <<'PY'
import json, re, sys, datetime
rep = json.load(open(sys.argv[1]))
start = datetime.datetime.fromisoformat(rep["start"][:26].rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()
kill = float(re.search(r"kill t=([0-9.]+)", open(sys.argv[2]).read()).group(1))
print(f"{start + rep['worlds'][0]['ended_at_s'] - kill:.3f}")
PY
  # Ranks' stdout through torchrun's tee, so the output reads as gorun's.
  "$py" -m torch.distributed.run --standalone --nproc_per_node "$np" --max_restarts 1 "${mon[@]}" \
    --redirects 1 --tee 1 "$prog" >"$tmp/t.out" 2>&1 ||
    { cat "$tmp/t.out" >&2; echo "bench-restart: torchrun run failed" >&2; exit 1; }
  gap "$tmp/t.out" >>"$tmp/torch" || { cat "$tmp/t.out" >&2; exit 1; }
done

median() { sort -n "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
g=$(median "$tmp/gorun"); t=$(median "$tmp/torch"); d=$(median "$tmp/gone")
echo "kill -> first step of the restarted world, $np ranks, median of $runs (s):"
echo "  gorun    $g   (runs: $(tr '\n' ' ' <"$tmp/gorun"))"
echo "  torchrun $t   (runs: $(tr '\n' ' ' <"$tmp/torch"); monitor_interval ${TORCH_MONITOR:-default 5s})"
awk -v g="$g" -v t="$t" 'BEGIN {printf "  ratio gorun/torchrun %.2f\n", g / t}'
echo "gorun kill -> world gone (every rank and descendant reaped): median $d s (runs: $(tr '\n' ' ' <"$tmp/gone"))"
