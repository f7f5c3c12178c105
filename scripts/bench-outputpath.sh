#!/usr/bin/env bash
# What the launcher's output path costs a job, for this tree's gorun and,
# in the same run, for gorun built from git revision BASE (default main),
# Open MPI's mpirun and MPICH's hydra mpiexec (whichever is installed):
#
#   - throughput: one rank writes 100 MB of 100-byte lines (`cat` of a
#     file) to stdout, the launcher's stdout is /dev/null; wall seconds of
#     the whole launch, and MB/s;
#   - a line's latency: one rank prints its clock (ns) 200 times, 5 ms
#     apart; a reader of the launcher's stdout takes each line's arrival
#     minus the clock it carries; median and 90th percentile in µs;
#   - start-up: `-np 2 /bin/true`, wall seconds.
#
# ROUNDS runs of each, alternating launchers, medians.
#
#   ROUNDS=5 [BASE=main] [MB=100] scripts/bench-outputpath.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
BASE=${BASE:-main}
MB=${MB:-100}
tmp=$(mktemp -d)
cleanup() {
	[[ -d "$tmp/base-src" ]] && git worktree remove --force "$tmp/base-src"
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/gorun" ./cmd/gorun
git worktree add -q --detach "$tmp/base-src" "$BASE"
(cd "$tmp/base-src" && go build -o "$tmp/base" ./cmd/gorun)
git worktree remove --force "$tmp/base-src"
launchers=(gorun base)
command -v mpirun.openmpi >/dev/null && launchers+=(openmpi)
command -v mpiexec.hydra >/dev/null && launchers+=(hydra)

# run LAUNCHER NP CMD...: CMD under LAUNCHER with NP ranks.
run() {
	local l=$1 np=$2
	shift 2
	case $l in
	gorun | base) "$tmp/$l" -np "$np" --oversubscribe "$@" ;;
	openmpi) OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun.openmpi --oversubscribe -np "$np" "$@" ;;
	hydra) mpiexec.hydra -np "$np" "$@" ;;
	esac
}

# wall CMD...: seconds CMD took; it must succeed.
wall() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null 2>&1 || { echo "bench-outputpath: failed: $*" >&2; exit 1; }
	t1=$(date +%s%N)
	awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", (b - a) / 1e9}'
}

line=$(printf 'x%.0s' $(seq 99))
{ yes "$line" || true; } | head -c "${MB}M" >"$tmp/data" # yes ends on SIGPIPE

cat >"$tmp/lat.py" <<'PY'
import sys, time
d = []
for l in sys.stdin:
    now = time.time_ns()
    l = l.strip()
    if l.isdigit():
        d.append((now - int(l)) / 1000)
d.sort()
print("%.0f %.0f %d" % (d[len(d) // 2], d[len(d) * 9 // 10], len(d)) if d else "- - 0")
PY
ticker='i=0; while [ $i -lt 200 ]; do date +%s%N; sleep 0.005; i=$((i+1)); done'

printf '%-8s %-6s %10s %10s %10s %10s %8s\n' launcher round out_s MB_per_s lat_p50_us lat_p90_us start_s
for ((r = 1; r <= ROUNDS; r++)); do
	for l in "${launchers[@]}"; do
		t=$(wall run "$l" 1 cat "$tmp/data")
		read -r p50 p90 n < <(run "$l" 1 sh -c "$ticker" 2>/dev/null | python3 "$tmp/lat.py")
		s=$(wall run "$l" 2 /bin/true)
		printf '%-8s %-6s %10s %10s %10s %10s %8s\n' "$l" "$r" "$t" "$(awk -v t="$t" -v mb="$MB" 'BEGIN{printf "%.0f", mb/t}')" "$p50" "$p90" "$s" | tee -a "$tmp/rows"
	done
done
echo
echo "medians over $ROUNDS rounds (load1 $(cut -d' ' -f1 /proc/loadavg)):"
printf '%-8s %10s %10s %10s %10s %8s\n' launcher out_s MB_per_s lat_p50_us lat_p90_us start_s
for l in "${launchers[@]}"; do
	row=$(printf '%-8s' "$l")
	for c in 3 4 5 6 7; do
		row+=$(awk -v l="$l" -v c="$c" '$1==l && $c!="-" {print $c}' "$tmp/rows" | sort -g |
			awk '{v[NR]=$1} END {if (NR) printf " %10s", v[int((NR+1)/2)]; else printf " %10s", "-"}')
	done
	echo "$row"
done
