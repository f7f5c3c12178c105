#!/usr/bin/env bash
# The fault-detection promises, measured: a rank SIGKILLed mid all-reduce
# -> every survivor's error (goal <= 2 s, with and without gorun), and a rank
# SIGSTOPped -> every survivor's error naming it (goal <= 10 s; the lease is
# 4 s). Modes: gorun (host leaders), flat (GORUN_RDZV_FLAT=1), direct
# (torch-style environment, no gorun), hosts (4 namespace hosts, one rank
# each, over ssh; root). bench/detect does the work; see its doc.
#
# Usage: scripts/bench-detect.sh [RUNS]  (default 5; medians; hold
# /tmp/gorun-bench.lock: `make bench-detect` does both).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
gorun=$PWD/bin/gorun
[ -x "$gorun" ] || { echo "bench-detect: bin/gorun missing; run make build" >&2; exit 1; }
tmp=$(mktemp -d)
set_name=bdt$$
set_name=${set_name:0:8}
cleanup() {
  tests/testhosts/netns-down.sh "$set_name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/detect" ./bench/detect

modes=gorun,flat,direct
hostargs=()
if [ "$(id -u)" = 0 ] && tests/testhosts/netns-up.sh 4 "$set_name" --owner $$ >"$tmp/env" 2>"$tmp/netns.err"; then
  SSH_CONFIG=$(sed -n 's/^SSH_CONFIG=//p' "$tmp/env")
  read -r -a hosts <<<"$(sed -n 's/^HOSTS=//p' "$tmp/env")"
  printf '%s slots=1\n' "${hosts[@]:0:4}" >"$tmp/hf"
  modes=$modes,hosts
  hostargs=(-hostfile "$tmp/hf" -launch-agent "ssh -F $SSH_CONFIG")
else
  echo "bench-detect: no namespace hosts (need root; $(tail -1 "$tmp/netns.err" 2>/dev/null)); this host only" >&2
fi
for sig in KILL STOP; do
  "$tmp/detect" -runs "$runs" -np 4 -signal "$sig" -modes "$modes" -gorun "$gorun" "${hostargs[@]}"
done
echo "goals: SIGKILL -> every survivor's error <= 2 s (with and without gorun); SIGSTOP named <= 10 s"
