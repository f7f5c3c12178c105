#!/usr/bin/env bash
# Restart time of the Go trainer under gorun: kill -> first step of the new
# world, on one host and across 4 namespace hosts (tests/testhosts; root).
#
# Each run: `gorun --max-restarts 1 --inject SPEC bin/trainer --checkpoint DIR
# --checkpoint-every 5 ...`; the fault fires once the target has reported
# step 20 (after-steps), gorun stops the world and starts a new one, whose
# trainer resumes from the checkpoint of step 20. The time measured is from
# the injection (gorun's --report; for kill-host, when gorun asked, since the
# host's agent dies before it answers) to the timestamp of rank 0's first
# step line in the new world (--timestamp-output): detection, teardown,
# relaunch (ssh to every host across hosts), rendezvous, resume, one step.
#
# Scenarios (the goals: <= 2 s on one host, <= 5 s on 4 hosts):
#   1host-kill      -np 4 on this host, kill:rank=1
#   4hosts-kill     4 hosts x 1 slot, kill:rank=1
#   4hosts-killhost 5 hosts x 1 slot, --max-np 4 --min-np 2: kill-host of the
#                   second host; the spare (fifth) host takes its place
#
# Usage: scripts/bench-restart-trainer.sh [RUNS]  (default 5; medians; hold
# /tmp/gorun-bench.lock: `make bench-restart-trainer` does both).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
bench=bench-restart-trainer set_prefix=brs
. scripts/trainer-bench-lib.sh

hosts=()
if [ "$(id -u)" = 0 ] && tests/testhosts/netns-up.sh 5 "$set_name" --owner $$ >"$tmp/env" 2>"$tmp/netns.err"; then
  SSH_CONFIG=$(sed -n 's/^SSH_CONFIG=//p' "$tmp/env")
  read -r -a hosts <<<"$(sed -n 's/^HOSTS=//p' "$tmp/env")"
else
  echo "bench-restart-trainer: no namespace hosts (need root; $(tail -1 "$tmp/netns.err" 2>/dev/null)); one host only" >&2
fi

trainer_args=(--model small --batch 8 --steps 60 --deterministic --checkpoint-every 5)

# gap prints injection -> first step of world 1 and injection -> world 0
# gone, from a run's report and timestamped, tagged output.
gap() {
  "$py" - "$1" "$2" <<'PY'
import json, re, sys, datetime
def ts(s):
    return datetime.datetime.fromisoformat(s[:26].rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()
rep = json.load(open(sys.argv[1]))
start = ts(rep["start"])
f = rep["faults"][0]
inj = f.get("injected_at_s") or f["sent_at_s"]
assert rep["restarts"] == 1 and rep["outcome"] == "succeeded", rep["outcome"]
resumed = False
for line in open(sys.argv[2]):
    m = re.match(r"\[0(?:,[^\]]*)?\] (\S+) (.*)", line)
    if not m:
        continue
    if m.group(2).startswith("resumed from step"):
        resumed = True
    elif resumed and m.group(2).startswith("step "):
        print(f"{ts(m.group(1)) - start - inj:.3f} {rep['worlds'][0]['ended_at_s'] - inj:.3f}")
        break
else:
    sys.exit("no first step after a resume")
PY
}

# scenario NAME GORUN-ARGS... runs it $runs times and prints its medians.
scenario() {
  local name=$1
  shift
  : >"$tmp/$name"
  for i in $(seq "$runs"); do
    rm -rf "$tmp/ck"
    if ! "$gorun" --timestamp-output --tag-output --max-restarts 1 --report "$tmp/r.json" "$@" \
      "$trainer" "${trainer_args[@]}" --checkpoint "$tmp/ck" >"$tmp/out" 2>&1; then
      cat "$tmp/out" >&2
      echo "bench-restart-trainer: $name run $i failed" >&2
      exit 1
    fi
    gap "$tmp/r.json" "$tmp/out" >>"$tmp/$name" || { cat "$tmp/out" >&2; exit 1; }
  done
  "$py" - "$name" "$tmp/$name" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[2])]
first = [r[0] for r in rows]
gone = [r[1] for r in rows]
print(f"  {sys.argv[1]:<16} kill -> first step {statistics.median(first):6.3f} s   (runs: {' '.join(f'{x:.3f}' for x in first)})"
      f"   kill -> world gone {statistics.median(gone):.3f} s")
PY
}

echo "kill -> first step of the new world (Go trainer, resumed from its checkpoint), median of $runs (s):"
scenario 1host-kill -np 4 --inject kill:rank=1:after-steps=20
if [ ${#hosts[@]} -ge 5 ]; then
  agent=(--launch-agent "ssh -F $SSH_CONFIG")
  printf '%s slots=1\n' "${hosts[@]:0:4}" >"$tmp/hf4"
  printf '%s slots=1\n' "${hosts[@]:0:5}" >"$tmp/hf5"
  scenario 4hosts-kill "${agent[@]}" -hostfile "$tmp/hf4" -np 4 --inject kill:rank=1:after-steps=20
  scenario 4hosts-killhost "${agent[@]}" -hostfile "$tmp/hf5" --max-np 4 --min-np 2 --inject "kill-host:host=${hosts[1]}:after-steps=20"
fi
echo "goals: <= 2 s on one host, <= 5 s on 4 hosts (the machine is shared: noisy)"
