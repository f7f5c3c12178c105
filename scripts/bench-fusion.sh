#!/usr/bin/env bash
# bench-fusion.sh: fusion on the fly, native, before and after, side by side.
#
#   scripts/bench-fusion.sh [OUT_DIR]     (default: bench-results/fusion)
#
# Builds bench/fusion twice: against this checkout, and against BEFORE
# (default main; a ref without fusion gives the "before" figures), then
# runs `gorun -np N` of each in ROUNDS (default 5) rounds, alternating
# which goes first. Each run prints the median over its blocks of every
# row (see bench/fusion/main.go); this prints, per build, the median over
# rounds, and the ratios: each 64 × 1 KiB row over the one 64 KiB
# all-reduce of the same build (goal: at most 2), and the lone 8-byte
# all-reduce after over before (goal: not above 1 beyond noise).
# NPS (default "2") sets the rank counts. Run it under
# flock /tmp/gorun-bench.lock on a shared machine (make bench-fusion does).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results/fusion}
BEFORE=${BEFORE:-main}
ROUNDS=${ROUNDS:-5}
NPS=${NPS:-2}
ARGS=${ARGS:--blocks 30 -per 40}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
GO=${GO:-go}
make --no-print-directory build >/dev/null
$GO build -o "$OUT/after" ./bench/fusion
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach "$tmp/src" "$BEFORE" >/dev/null 2>&1
mkdir -p "$tmp/src/bench/fusion"
cp bench/fusion/main.go "$tmp/src/bench/fusion/"
(cd "$tmp/src" && $GO build -o "$OUT/before" ./bench/fusion)
echo "# before: $BEFORE ($(git rev-parse --short "$BEFORE")), after: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' + uncommitted')"
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores; $ROUNDS rounds, bench/fusion $ARGS"
for np in $NPS; do
	: >"$OUT/np$np.txt"
	for round in $(seq "$ROUNDS"); do
		order="before after"
		[ $((round % 2)) -eq 0 ] && order="after before"
		for b in $order; do
			bin/gorun -np "$np" "$OUT/$b" $ARGS | sed "s/^row /$b /" >>"$OUT/np$np.txt"
		done
	done
	python3 - "$OUT/np$np.txt" "$np" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    build, name, us, _ = line.split()
    rows.setdefault((build, name), []).append(float(us))
med = {k: statistics.median(v) for k, v in rows.items()}
order = ["lone-8B", "single-64K", "async-64x1K", "burst-64x1K", "coalesced-64x1K"]
names = [n for n in order if ("after", n) in med]
print(f"\n{sys.argv[2]} ranks: median us per row iteration over rounds (min-max)")
print(f"{'row':<16}{'before':>22}{'after':>22}{'after/before':>14}")
def cell(build, n):
    v = rows.get((build, n))
    return f"{med[(build, n)]:>10.2f} ({min(v):.1f}-{max(v):.1f})" if v else f"{'-':>22}"
for n in names:
    ratio = f"{med[('after', n)]/med[('before', n)]:>14.2f}" if ("before", n) in med else f"{'-':>14}"
    print(f"{n:<16}{cell('before', n)}{cell('after', n)}{ratio}")
if "single-64K" in names:
    print("\n64 x 1 KiB over one 64 KiB all-reduce of the same build (goal <= 2):")
    for n in ["async-64x1K", "burst-64x1K", "coalesced-64x1K"]:
        if n in names:
            b = f"{med[('before', n)]/med[('before', 'single-64K')]:6.2f}" if ("before", n) in med else "     -"
            print(f"  {n:<16} before {b}   after {med[('after', n)]/med[('after', 'single-64K')]:6.2f}")
if "lone-8B" in names:
    print(f"\nlone 8 B all-reduce, after/before: {med[('after', 'lone-8B')]/med[('before', 'lone-8B')]:.3f}")
PY
done

# The token holder's own work on a lone 8-byte all-reduce, unfused path
# against the fused one, in one test binary over an echoing link (no peer,
# no wire: what stays when the wall-clock rows above drown in a busy
# host's noise): LONE_RUNS interleaved runs, medians and the median of the
# per-run ratios.
$GO test -c -o "$OUT/comm.test" ./comm
for i in $(seq "${LONE_RUNS:-10}"); do
	"$OUT/comm.test" -test.run '^$' -test.bench LonePath -test.cpu 1 -test.benchtime 300000x | awk '/^Benchmark/ {printf "%s ", $3} END {print ""}'
done | python3 -c '
import sys, statistics
rows = [list(map(float, l.split())) for l in sys.stdin if len(l.split()) == 2]
a, b = [r[0] for r in rows], [r[1] for r in rows]
print(f"\nlone 8 B all-reduce, token holder only (echo link), {len(rows)} runs: unfused path {statistics.median(a):.0f} ns, fused path {statistics.median(b):.0f} ns, fused/unfused {statistics.median([y / x for x, y in rows]):.3f}")'
