#!/usr/bin/env bash
# The elastic-restart figures, from gorun's own --report (medians of RUNS):
#
#   frozen-before-init  -np 4 on this host, the Go trainer; rank 2 is
#                       SIGSTOPped as the world starts (--inject
#                       stop:rank=2:at=0s), before it joins: time from the
#                       stop to gorun's verdict (time_to_detect; the
#                       supervisor's state-T check, lease 4 s + 1 s), and
#                       with --max-restarts 1 the time to the restarted
#                       world's first step (time_to_recover).
#   grow-back           2 namespace hosts x 2 slots (root), -np 4 --min-np 2
#                       --max-restarts 2: the second host is killed whole at
#                       step 5 (world 1 runs 2 ranks), world 1's rank 1 at
#                       step 12; at that restart gorun asks the lost host
#                       again and world 2 runs 4 ranks: time from each kill
#                       to the next world's first step, the second including
#                       the question to the lost host (an agent start over
#                       ssh).
#
# Usage: scripts/bench-elastic.sh [RUNS]  (default 5; `make bench-elastic`
# holds /tmp/gorun-bench.lock).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
bench=bench-elastic set_prefix=bel
. scripts/trainer-bench-lib.sh

targs=(--model small --batch 8 --steps 40 --deterministic --checkpoint-every 3)

# field FILE PYEXPR appends PYEXPR (over the report `r`) to FILE.
field() {
  "$py" - "$tmp/r.json" "$2" >>"$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(eval(sys.argv[2]))
PY
}

median() {
  "$py" - "$1" "$2" <<'PY'
import statistics, sys
xs = [float(l) for l in open(sys.argv[2]) if l.strip()]
print(f"  {sys.argv[1]:<44} median {statistics.median(xs):6.3f} s   (runs: {' '.join(f'{x:.3f}' for x in xs)})")
PY
}

run() { # run NAME ARGS...: one gorun, which must end as the scenario says
  local name=$1
  shift
  rm -rf "$tmp/ck" "$tmp/r.json"
  "$gorun" --report "$tmp/r.json" "$@" >"$tmp/out" 2>&1 || true
  [ -s "$tmp/r.json" ] || { cat "$tmp/out" >&2; echo "bench-elastic: $name: no report" >&2; exit 1; }
}

: >"$tmp/det"; : >"$tmp/rec"
for i in $(seq "$runs"); do
  run frozen -np 4 --inject stop:rank=2:at=0s "$trainer" "${targs[@]}"
  field "$tmp/det" 'r["faults"][0]["time_to_detect_s"] if (r.get("cause") or {}).get("kind") == "frozen" and r["cause"]["rank"] == 2 else sys.exit("not named: " + r["outcome"])'
  run frozen-restart -np 4 --max-restarts 1 --inject stop:rank=2:at=0s "$trainer" "${targs[@]}" --checkpoint "$tmp/ck"
  field "$tmp/rec" 'r["faults"][0]["time_to_recover_s"] if r["outcome"] == "succeeded" else sys.exit(r["outcome"])'
done
echo "a rank frozen before it joined (one host, -np 4, Go trainer), $runs runs:"
median "stop -> gorun names it frozen" "$tmp/det"
median "stop -> first step of the restarted world" "$tmp/rec"

if [ "$(id -u)" = 0 ] && tests/testhosts/netns-up.sh 2 "$set_name" --owner $$ >"$tmp/env" 2>"$tmp/netns.err"; then
  SSH_CONFIG=$(sed -n 's/^SSH_CONFIG=//p' "$tmp/env")
  read -r -a hosts <<<"$(sed -n 's/^HOSTS=//p' "$tmp/env")"
  printf '%s slots=2\n' "${hosts[@]:0:2}" >"$tmp/hf"
  : >"$tmp/shrink"; : >"$tmp/grow"
  for i in $(seq "$runs"); do
    run grow --launch-agent "ssh -F $SSH_CONFIG" -hostfile "$tmp/hf" -np 4 --min-np 2 --max-restarts 2 \
      --inject "kill-host:host=${hosts[1]}:after-steps=5" --inject kill:rank=1:after-steps=12 \
      "$trainer" "${targs[@]}" --checkpoint "$tmp/ck"
    field "$tmp/shrink" 'r["faults"][0]["time_to_recover_s"] if [w["np"] for w in r["worlds"]] == [4, 2, 4] and r["outcome"] == "succeeded" else sys.exit(str([w["np"] for w in r["worlds"]]) + r["outcome"])'
    field "$tmp/grow" 'r["faults"][1]["time_to_recover_s"]'
  done
  echo "grow-back (2 namespace hosts x 2 slots, worlds of 4, 2, then 4 ranks), $runs runs:"
  median "kill-host -> first step of world 1 (2 ranks)" "$tmp/shrink"
  median "kill rank 1 -> first step of world 2 (4 ranks)" "$tmp/grow"
else
  echo "bench-elastic: no namespace hosts (need root; $(tail -1 "$tmp/netns.err" 2>/dev/null)); grow-back not measured" >&2
fi
echo "the machine is shared: noisy"
