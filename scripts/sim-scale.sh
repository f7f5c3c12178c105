#!/usr/bin/env bash
# The scale simulation (bench/simscale): measure the model's costs from the
# real code on this machine (rendezvous.Join in one process, sockets between
# two processes, process starts, gorun's resident memory at several -np),
# run the calibration shapes both
# for real and in the model, then print the HOSTS×PER table against gorun's
# targets. Run it under flock /tmp/gorun-bench.lock (make sim-scale does).
#
# As root it also calibrates against real gorun jobs over namespace hosts
# (tests/testhosts set "sim": a network namespace, veth and sshd per host):
# NETNS_SHAPES, each ROUNDS jobs, beside the in-process calibration. The
# set is brought up first and taken down on every way out (NETNS=0 skips
# it; not root, it is skipped with a line saying so).
#
# There it also measures the CPU gorun's own processes spend on a rank's
# death, from DEATH_SHAPE jobs (else those costs are kept from the costs
# file). COSTS_IN=FILE measures only the wake-up excess (and the death
# costs, as root) and keeps FILE's other costs, instead of measuring all.
#
#   HOSTS=1000 PER=8 ROUNDS=3 CALIBRATE=4x4,8x4,16x4,32x4 NETNS_SHAPES=4x2,8x2,16x2,32x2 NETNS_SET=sim DEATH_SHAPE=8x2 scripts/sim-scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${HOSTS:-1000}
PER=${PER:-8}
ROUNDS=${ROUNDS:-3}
CALIBRATE=${CALIBRATE-4x4,8x4,16x4,32x4} # empty: no in-process calibration
NETNS=${NETNS:-1}
NETNS_SHAPES=${NETNS_SHAPES:-4x2,8x2,16x2,32x2}
netns_set=${NETNS_SET:-sim}
DEATH_SHAPE=${DEATH_SHAPE:-8x2}
tmp=$(mktemp -d)
pids=()
netns_up=""
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	# The costs are written once measured: kept even if a later step fails.
	if [[ -n "${COSTS_OUT:-}" && -f "$tmp/costs.json" ]]; then cp "$tmp/costs.json" "$COSTS_OUT"; fi
	if [[ -n $netns_up ]]; then tests/testhosts/netns-down.sh "$netns_set" || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT
# A signal ends the script through exit, so that the EXIT trap takes the
# hosts down.
trap 'exit 130' INT
trap 'exit 143' TERM HUP
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
netns_args=()
if [[ $NETNS == 0 ]]; then
	echo "sim-scale: namespace calibration skipped (NETNS=0)"
elif [[ $(id -u) != 0 ]]; then
	echo "sim-scale: namespace calibration skipped: it needs root (network namespaces, sshd per host); the in-process calibration runs alone"
else
	max_hosts=0
	for s in ${NETNS_SHAPES//,/ }; do max_hosts=$((${s%x*} > max_hosts ? ${s%x*} : max_hosts)); done
	netns_up=1
	tests/testhosts/netns-up.sh "$max_hosts" "$netns_set" --owner $$ >"$tmp/netns.env"
	state=$(sed -n 's/^STATE=//p' "$tmp/netns.env")
	netns_args=(-netns "$state/env" -netns-shapes "$NETNS_SHAPES" -netns-rounds "$ROUNDS" -measure-death "$DEATH_SHAPE")
fi
measure=(-measure -rss "$rss")
if [[ -n "${COSTS_IN:-}" ]]; then measure=(-costs "$COSTS_IN" -measure-wake); fi
"$tmp/simscale" "${measure[@]}" -gorun "$tmp/gorun" -rounds "$ROUNDS" -calibrate "$CALIBRATE" \
	-hosts "$HOSTS" -per "$PER" -costs-out "$tmp/costs.json" "${netns_args[@]}" "$@"
