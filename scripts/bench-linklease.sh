#!/usr/bin/env bash
# bench-linklease.sh: what the data plane's link lease costs.
#
#   scripts/bench-linklease.sh [ROUNDS]      (default 7)
#
# 8-byte all-reduce latency, 2 ranks over TCP (the lease watches TCP links
# only), three settings interleaved round by round in one run:
#   before  gorun built from BEFORE (default: the commit before the lease,
#           7cda492^): TCP_USER_TIMEOUT 10 s, no watcher
#   off     this tree, GORUN_LINK_LEASE=off
#   on      this tree, the default 4 s lease (a watcher reading TCP_INFO
#           every 250 ms, keepalive after 1 s idle)
# Prints each round's average time per call (us, gorun bench's out-of-place
# column) and the medians, with the ratios on/before and on/off. The
# machine may be shared: run it under flock /tmp/gorun-bench.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
ITERS=${ITERS:-3000}
BEFORE=${BEFORE:-7cda492^}
d=$(mktemp -d)
trap 'git worktree remove --force "$d/src" >/dev/null 2>&1 || true; rm -rf "$d"' EXIT
git worktree add --detach "$d/src" "$BEFORE" >/dev/null 2>&1
(cd "$d/src" && go build -o "$d/before/" ./cmd/gorun)
go build -o "$d/now/" ./cmd/gorun
run() { # BIN [ENV...]
	local bin=$1
	shift
	env "$@" "$bin" -np 2 "$bin" bench allreduce -b 8 -e 8 -n "$ITERS" -w 200 --transport tcp 2>&1 |
		awk '$1 == 8 && $2 == 2 { print $6 }'
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
: >"$d/before.t"; : >"$d/off.t"; : >"$d/on.t"
for r in $(seq "$ROUNDS"); do
	a=$(run "$d/before/gorun")
	b=$(run "$d/now/gorun" GORUN_LINK_LEASE=off)
	c=$(run "$d/now/gorun")
	echo "$a" >>"$d/before.t"; echo "$b" >>"$d/off.t"; echo "$c" >>"$d/on.t"
	printf 'tcp round %d: before %s us  off %s us  on %s us\n' "$r" "$a" "$b" "$c"
done
a=$(median <"$d/before.t"); b=$(median <"$d/off.t"); c=$(median <"$d/on.t")
printf '\n%-4s %11s %11s %11s %10s %10s\n' "" "before(us)" "off(us)" "on(us)" "on/before" "on/off"
awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN { printf "%-4s %11.2f %11.2f %11.2f %10.3f %10.3f\n", "tcp", a, b, c, c / a, c / b }'
