#!/usr/bin/env bash
# bench-netfault.sh: what the data-plane fault hook costs.
#
#   scripts/bench-netfault.sh [ROUNDS]      (default 7)
#
# 8-byte all-reduce latency, 2 ranks, shared memory and TCP, three builds
# or settings interleaved round by round:
#   nohook  gorun built with -tags gorun_nonetfault (no hook compiled in)
#   hook    the normal build, nothing armed (the hook decides once per link)
#   armed   the normal build with a fault armed that never fires
#           (GORUN_NETFAULT=delay:rank=0:ms=1:at=1000h): every frame carries
#           and checks its CRC-32C trailer through the fault wrapper
# Prints each round's average time per call (us, gorun bench's out-of-place
# column) and the medians, with the ratios hook/nohook and armed/nohook.
# The machine may be shared: run it under flock /tmp/gorun-bench.lock and
# read the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
ITERS=${ITERS:-3000}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
go build -o "$d/hook/" ./cmd/gorun
go build -tags gorun_nonetfault -o "$d/nohook/" ./cmd/gorun
run() { # BIN TRANSPORT [ENV...]
	local bin=$1 tr=$2
	shift 2
	env "$@" "$bin" -np 2 "$bin" bench allreduce -b 8 -e 8 -n "$ITERS" -w 200 --transport "$tr" 2>&1 |
		awk '$1 == 8 && $2 == 2 { print $6 }'
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for tr in shm tcp; do
	: >"$d/$tr.nohook"; : >"$d/$tr.hook"; : >"$d/$tr.armed"
	for r in $(seq "$ROUNDS"); do
		a=$(run "$d/nohook/gorun" "$tr")
		b=$(run "$d/hook/gorun" "$tr")
		c=$(run "$d/hook/gorun" "$tr" GORUN_NETFAULT=delay:rank=0:ms=1:at=1000h)
		echo "$a" >>"$d/$tr.nohook"; echo "$b" >>"$d/$tr.hook"; echo "$c" >>"$d/$tr.armed"
		printf '%s round %d: nohook %s us  hook %s us  armed %s us\n' "$tr" "$r" "$a" "$b" "$c"
	done
done
printf '\n%-4s %12s %12s %12s %12s %12s\n' "" "nohook(us)" "hook(us)" "armed(us)" "hook/nohook" "armed/nohook"
for tr in shm tcp; do
	a=$(median <"$d/$tr.nohook"); b=$(median <"$d/$tr.hook"); c=$(median <"$d/$tr.armed")
	awk -v t="$tr" -v a="$a" -v b="$b" -v c="$c" 'BEGIN { printf "%-4s %12.2f %12.2f %12.2f %12.3f %12.3f\n", t, a, b, c, b / a, c / a }'
done
