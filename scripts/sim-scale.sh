#!/usr/bin/env bash
# The scale simulation (bench/simscale): measure the model's costs from the
# real code on this machine (rendezvous.Join in one process, process starts,
# gorun's resident memory at several -np), run the calibration shapes both
# for real and in the model, then print the HOSTS×PER table against gorun's
# targets. Run it under flock /tmp/gorun-bench.lock (make sim-scale does).
#
#   HOSTS=1000 PER=8 ROUNDS=3 CALIBRATE=4x4,8x4,16x4,32x4 scripts/sim-scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${HOSTS:-1000}
PER=${PER:-8}
ROUNDS=${ROUNDS:-3}
CALIBRATE=${CALIBRATE:-4x4,8x4,16x4,32x4}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/gorun" ./cmd/gorun
go build -o "$tmp/simscale" ./bench/simscale
# gorun's resident memory (launcher and its in-process local agent) with
# np ranks of `sleep`, read while the ranks run.
rss=""
for np in 8 64 256; do
	"$tmp/gorun" -np "$np" --oversubscribe sleep 4 &
	pid=$!
	pids+=("$pid")
	sleep 3
	kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
	wait "$pid"
	pids=()
	rss="${rss:+$rss,}$np:$kb"
done
"$tmp/simscale" -measure -gorun "$tmp/gorun" -rss "$rss" -rounds "$ROUNDS" -calibrate "$CALIBRATE" \
	-hosts "$HOSTS" -per "$PER" -costs-out "$tmp/costs.json" "$@"
if [[ -n "${COSTS_OUT:-}" ]]; then cp "$tmp/costs.json" "$COSTS_OUT"; fi
