#!/usr/bin/env bash
# bench-latency.sh: small and mid-size collectives over shared memory
# and over TCP, gorun next to Open MPI (btl vader, btl tcp) in one run,
# quiet and under load, medians over interleaved rounds.
#
#   scripts/bench-latency.sh [OUT_DIR]     (default bench-results/latency)
#
# For each TRANSPORT in $TRANSPORTS (default "shm tcp"), each NP in $NPS
# (default "2 4") and each LOAD in $LOADS (default "quiet hog"; hog = a
# busy loop pinned on every core for the run), ROUNDS (default 5) rounds,
# the loads taking turns within each round; each round at each load runs:
#   gorun -np NP gorun bench allreduce $SWEEP --transport T
#   mpirun -np NP bench/mpi/allreduce $SWEEP   (--mca btl self,vader | self,tcp)
#   on shm: the same two with $BIGSWEEP (large sizes), then for each of
#   its sizes bench/copybound -p NP -s SIZE     (the copy bound)
#   and, with 2 ranks, bench/copybound/pairbound -m direct -k -s SIZE (the floor)
#   gorun -np NP gorun bench barrier --transport T
#   mpirun -np NP bench/mpi/barrier_lat
# and prints, per size, the median out-of-place time (µs) and busbw
# (GB/s) of each, with the ratio gorun/MPI of the times (< 1: gorun
# faster). With quiet among the loads it then prints, for each other
# load, each side's median under that load over its own quiet median and
# gorun's ratio over MPI's (the goal under load: <= 1). Under the hog a
# row of 200 small calls lasts less than one scheduler tick, so it loses
# either nothing or a whole tick to the hog, and which rows do depends on
# how long the ranks have run since they last slept, not on the size:
# read the hog rows with many rounds, or with -n 3000 (notes/shm-latency.md).
# SWEEP defaults to "-b 8 -e 4M -f 2 -n 200 -w 50" (every power
# of two, 4 KiB included); the 8-byte row, the first of the sweep as a
# program's first calls are, is the latency figure. BIGSWEEP defaults to
# "-b 32M -e 64M -f 2 -n 10 -w 2" ("" skips it). Over TCP the sweep is
# the same and the goal is from 64 KiB up; Open MPI's TCP transport is
# told to use loopback (btl_tcp_if_include lo), as gorun does between
# ranks on one host with --transport tcp.
#
# The copy bound of a large all-reduce: every rank must at least read its
# S input bytes and write its S result bytes, which is what a memcpy of S
# bytes does; copybound times NP processes, bound one per CPU as the ranks
# are, each copying S bytes at the same time, and the slowest one's rate
# (S over its median copy time, GB/s) is the bound on busbw (for 2 ranks
# busbw = algbw = S over the all-reduce's time). The table prints it as
# "bound" and gorun's busbw over it as "g/bound". The peer's bytes cross
# between the cores on top of that, so no all-reduce reaches the bound
# where the caches do not hold the data.
#
# With 2 ranks the table also prints "floor": the busbw of the fastest
# 2-rank all-reduce this host allows, bench/copybound/pairbound's direct
# mode (both ranks' inputs and results in shared memory, each rank reduces
# its half reading the peer's input in place, then copies the peer's
# reduced half out of the peer's result: 2.5 S of memory traffic per rank
# against the copy's 2 S, and no copy through a segment, which no library
# can avoid with a user's private buffers), and gorun's busbw over it as
# "g/floor". Where the VM's two CPUs sit far apart the floor is 0.6-0.75
# of the bound (notes/shm-latency.md).
#
# Each round first runs bench/copybound/corelat (the round trip of a cache
# line between the first two CPUs, and the rate at which one reads a 1 MiB
# buffer the other just wrote), and each table's header lists it per
# round: on a virtual machine the two CPUs may sit on nearby or distant
# physical cores, and on the 2-core reference VM that alone moved gorun's
# 1 MiB all-reduce between 60 and 250 us from one minute to the next
# (notes/shm-latency.md).
#
# The machine may be shared: rerun a figure that swings, and read the hog
# rows against each side's own quiet rows.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results/latency}
NPS=${NPS:-2 4}
LOADS=${LOADS:-quiet hog}
TRANSPORTS=${TRANSPORTS:-shm tcp}
ROUNDS=${ROUNDS:-5}
SWEEP=${SWEEP:--b 8 -e 4M -f 2 -n 200 -w 50}
BIGSWEEP=${BIGSWEEP--b 32M -e 64M -f 2 -n 10 -w 2}
BITERS=${BITERS:-2000}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for p in openmpi-bin libopenmpi-dev; do
	dpkg -s "$p" >/dev/null 2>&1 || { echo "bench-latency: missing $p (scripts/install-test-deps.sh installs it)" >&2; exit 1; }
done
go build -o "$OUT/gorun" ./cmd/gorun
mpicc -O2 -Wall -o "$OUT/mpi_allreduce" bench/mpi/allreduce.c
mpicc -O2 -Wall -o "$OUT/mpi_barrier" bench/mpi/barrier_lat.c
cc -O2 -Wall -o "$OUT/copybound" bench/copybound/copybound.c
cc -O2 -Wall -o "$OUT/corelat" bench/copybound/corelat.c
cc -O3 -mavx2 -Wall -o "$OUT/pairbound" bench/copybound/pairbound.c
G=$OUT/gorun
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)

hogs=()
start_hogs() { for c in $(seq 0 $(($(nproc) - 1))); do taskset -c "$c" sh -c 'while :; do :; done' & hogs+=($!); done; }
stop_hogs() { if ((${#hogs[@]})); then kill "${hogs[@]}" 2>/dev/null || true; wait "${hogs[@]}" 2>/dev/null || true; hogs=(); fi; }
trap stop_hogs EXIT

# rows FILE: "size time busbw" of every data row (out-of-place columns).
rows() { awk '!/^#/ && NF >= 8 {print $1, $6, $8}' "$1"; }

# round TR NP LOAD: one round of every measurement at that load.
round() {
	local tr=$1 np=$2 load=$3 tag=$1.$2.$3 sweep size
	"$OUT/corelat" | awk '{printf " %s ns (%s GB/s)", $1, $2}' >>"$OUT/l.$tag"
	[ "$load" = hog ] && start_hogs
	for sweep in "$SWEEP" "$big"; do
		[ -n "$sweep" ] || continue
		# shellcheck disable=SC2086 # a sweep is a list of flags
		"$G" -np "$np" "${over[@]}" "$G" bench allreduce $sweep --transport "$tr" >"$OUT/run.txt" && rows "$OUT/run.txt" >>"$OUT/g.$tag"
		cp "$OUT/run.txt" "$OUT/sizes.txt"
		# shellcheck disable=SC2086
		"${MPIRUN[@]}" -np "$np" "${over[@]}" "$OUT/mpi_allreduce" $sweep >"$OUT/run.txt" 2>/dev/null && rows "$OUT/run.txt" >>"$OUT/m.$tag"
	done
	if [ -n "$big" ]; then
		# The bound of each large size, in the same round and load.
		for size in $(rows "$OUT/sizes.txt" | awk '{print $1}'); do
			"$OUT/copybound" -p "$np" -s "$size" -n 10 | awk '{print $1, $3}' >>"$OUT/c.$tag"
			if [ "$np" = 2 ]; then
				"$OUT/pairbound" -m direct -k -s "$size" -n 10 | awk '{print $1, $5}' >>"$OUT/p.$tag"
			fi
		done
	fi
	"$G" -np "$np" "${over[@]}" "$G" bench barrier -n "$BITERS" -w 100 --transport "$tr" >"$OUT/run.txt" && rows "$OUT/run.txt" | sed 's/^0 /barrier /' >>"$OUT/g.$tag"
	"${MPIRUN[@]}" -np "$np" "${over[@]}" "$OUT/mpi_barrier" -n "$BITERS" -w 100 >"$OUT/run.txt" 2>/dev/null && rows "$OUT/run.txt" | sed 's/^0 /barrier /' >>"$OUT/m.$tag"
	stop_hogs
}

# table TR NP LOAD: the medians of that load's rounds, gorun next to MPI.
table() {
	local tr=$1 np=$2 load=$3 tag=$1.$2.$3
	echo
	echo "## $tr, $np ranks, $load: median of $ROUNDS rounds (time µs, busbw GB/s; bound: copy bound busbw, floor: fastest 2-rank all-reduce, see above)"
	echo "# cross-core round trip, per round:$(cat "$OUT/l.$tag")"
	printf "%10s %10s %8s %10s %8s %10s %8s %8s %8s %8s\n" size gorun-us busbw mpi-us busbw gorun/mpi bound g/bound floor g/floor
	awk '
		# By name, not by order: awk never opens an empty file.
		FILENAME == ARGV[1] { f = 1 }
		FILENAME == ARGV[2] { f = 2 }
		FILENAME == ARGV[3] { c[$1] = c[$1] " " $2; next }
		FILENAME == ARGV[4] { fl[$1] = fl[$1] " " $2; next }
		{ k = $1; t[f, k] = t[f, k] " " $2; b[f, k] = b[f, k] " " $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
		function med(s,   a, m, i, j, x) { m = split(s, a, " "); for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x } return m ? (m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2) : "nan" }
		END {
			for (i = 1; i <= n; i++) {
				k = order[i]; gt = med(t[1, k]); mt = med(t[2, k]); gb = med(b[1, k])
				printf "%10s %10.2f %8.3f %10.2f %8.3f %10.2f", k, gt, gb, mt, med(b[2, k]), (mt > 0 ? gt / mt : 0)
				if (k in c) { cb = med(c[k]); printf " %8.3f %8.2f", cb, (cb > 0 ? gb / cb : 0) }
				if (k in fl) { fb = med(fl[k]); printf " %8.3f %8.2f", fb, (fb > 0 ? gb / fb : 0) }
				printf "\n"
			}
		}
	' "$OUT/g.$tag" "$OUT/m.$tag" "$OUT/c.$tag" "$OUT/p.$tag" | tee "$OUT/table.$tag.txt"
}

# under TR NP LOAD: the goal under load, side by side: each side's median
# time at LOAD over its own quiet median (from the tables above), and
# gorun's ratio over MPI's (<= 1: gorun degrades no more than MPI).
under() {
	echo
	echo "## $1, $2 ranks, $3 over quiet: each side's median time under $3 over its quiet median"
	printf "%10s %10s %10s %10s\n" size gorun mpi gorun/mpi
	awk '
		FILENAME == ARGV[1] { g[$1] = $2; m[$1] = $4; next }
		($1 in g) && g[$1] > 0 && m[$1] > 0 && $4 > 0 { gr = $2 / g[$1]; mr = $4 / m[$1]; printf "%10s %10.2f %10.2f %10.2f\n", $1, gr, mr, gr / mr }
	' "$OUT/table.$1.$2.quiet.txt" "$OUT/table.$1.$2.$3.txt" | tee "$OUT/under.$1.$2.$3.txt"
}

echo "# bench-latency: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $ROUNDS rounds, sweep: $SWEEP"
for tr in $TRANSPORTS; do
	case $tr in
	shm) MPIRUN=(mpirun "${ROOT[@]}" --mca btl self,vader) big=$BIGSWEEP ;;
	tcp) MPIRUN=(mpirun "${ROOT[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo) big="" ;;
	*) echo "bench-latency: unknown transport $tr (shm or tcp)" >&2; exit 2 ;;
	esac
for np in $NPS; do
	over=()
	[ "$np" -gt "$(nproc)" ] && over=(--oversubscribe)
	for load in $LOADS; do
		tag=$tr.$np.$load
		: >"$OUT/g.$tag" && : >"$OUT/m.$tag" && : >"$OUT/c.$tag" && : >"$OUT/p.$tag" && : >"$OUT/l.$tag"
	done
	# The loads take turns within each round, so that a load's figures and
	# the quiet ones they are read against come from the same minutes: the
	# VM's CPU placement, which moves mid sizes up to 3x, changes from one
	# minute to the next.
	for r in $(seq "$ROUNDS"); do
		for load in $LOADS; do
			round "$tr" "$np" "$load"
		done
	done
	for load in $LOADS; do
		table "$tr" "$np" "$load"
	done
	case " $LOADS " in *" quiet "*) for load in $LOADS; do [ "$load" = quiet ] || under "$tr" "$np" "$load"; done ;; esac
done
done
