#!/usr/bin/env bash
# bench-torch.sh: torch.distributed all-reduce bus bandwidth with the gorun
# backend next to gloo, and gorun's native `gorun bench` in the same run,
# with ratios; then a DDP training step on both backends.
#
#   scripts/bench-torch.sh [OUT_DIR]        (default: bench-results/torch, ignored by git)
#
# For NPS (default "2 4") ranks, in ROUNDS (default 3) interleaved rounds
# whose fastest time per size is kept (sweep -b 8 -e 64M -f 4, i.e. 8 B to
# 32 MiB by factors of 4; SWEEP='-b 16 -e 64M -f 4' ends at 64 MiB):
#   [1] gorun -np N python3 bench/torch_allreduce.py --backend gloo
#   [2] gorun -np N python3 bench/torch_allreduce.py --backend gorun
#   [3] gorun -np N gorun bench allreduce          (native, the same runtime)
# `gorun bench report` prints busbw per size with the ratios torch-gorun/gloo
# (goal: >= 2 at >= 64 KiB, >= 10 at 8 B) and torch-gorun/native (the cost
# of the Python/C boundary, with rows of 40 calls; goal: >= 0.9 at >= 1 MiB).
# Rows that short swing up to 2x at >= 1 MiB on a crowded host, so the
# boundary part then measures that goal alone: native and torch-gorun in
# BOUNDARY_ROUNDS (default 6) interleaved rounds in alternating order, both
# in place (torch's all-reduce is), 1-4 MiB in rows of 300 calls and
# 8-32 MiB in rows of 60 (1000 and 200 on 2 ranks, whose calls take a
# third of the time), medians and the median of the per-round ratios.
# During each run bench/copybound/placewatch measures the round trip of a
# cache line between the two CPUs every 250 ms, which says where the VM
# keeps them (on the 2-core reference VM about 50-120 ns "near" or 300 ns
# "far", flipping every few seconds under load; corelat's one reading on
# the idle host before a run did not predict it, notes/torch-backend.md):
# the table is printed for all rounds and for the rounds whose both runs
# spent at least three quarters of their probes near, or far.
# Then examples/torch/ddp.py times a DDP step with each backend (medians over
# ROUNDS interleaved rounds, wall and CPU per rank, with the ratio). First,
# bench/torch_overhead.py prints the per-call cost of each layer on one rank.
# Every program runs as a user would start it, with no extra flags
# (TORCH_GORUN_FLAGS and GLOO_FLAGS add some, e.g. --session shared).
# PARTS (default "overhead allreduce ddp") picks the parts to run, so that
# each can be run on its own on a shared machine.
# Needs python3-torch for /usr/bin/python3 (scripts/install-test-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-results/torch}
SWEEP=${SWEEP:--b 8 -e 64M -f 4}
NPS=${NPS:-2 4}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:--w 5 -n 40}
PY=/usr/bin/python3 # Debian's python, the one with python3-torch
TORCH_GORUN_FLAGS=${TORCH_GORUN_FLAGS-}
PARTS=${PARTS:-overhead allreduce boundary ddp}
BOUNDARY_ROUNDS=${BOUNDARY_ROUNDS:-6}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
GLOO_FLAGS=${GLOO_FLAGS-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if ! "$PY" -c 'import torch' 2>/dev/null; then
	echo "bench-torch: $PY has no torch (install python3-torch)" >&2
	exit 1
fi
make --no-print-directory build lib >/dev/null
GORUN=bin/gorun
# This checkout's package and library, whatever `make python` installed.
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} GORUN_LIB=$PWD/bin/libgorun.so OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore

run() { # label file command...
	local label=$1 file=$2
	shift 2
	echo "bench-torch: $label" >&2
	if ! "$@" >"$OUT/$file"; then
		echo "bench-torch: $label failed (output in $OUT/$file)" >&2
		return 1
	fi
}
# getconf, not nproc: nproc obeys the OMP_NUM_THREADS=1 exported above.
load() { echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"; }

# The per-call cost of each layer on one rank (torch's floor for a Python
# backend, the library call, the backend's sync and async paths, gloo).
if part overhead; then
	"$GORUN" -np 1 "$PY" bench/torch_overhead.py | tee "$OUT/overhead.txt"
fi

part allreduce && for np in $NPS; do
	before=$(load)
	files=()
	for round in $(seq "$ROUNDS"); do
		# shellcheck disable=SC2086 # SWEEP and ITERS are lists of flags
		{
			run "np $np gloo ($round/$ROUNDS)" gloo.$np.$round.txt "$GORUN" -np "$np" $GLOO_FLAGS "$PY" bench/torch_allreduce.py --backend gloo $SWEEP $ITERS
			run "np $np torch-gorun ($round/$ROUNDS)" torch-gorun.$np.$round.txt "$GORUN" -np "$np" $TORCH_GORUN_FLAGS "$PY" bench/torch_allreduce.py --backend gorun $SWEEP $ITERS
			run "np $np native ($round/$ROUNDS)" native.$np.$round.txt "$GORUN" -np "$np" "$GORUN" bench allreduce $SWEEP $ITERS --json "$OUT/native.$np.$round.json"
		}
		files+=("gloo=$OUT/gloo.$np.$round.txt" "torch-gorun=$OUT/torch-gorun.$np.$round.txt" "native=$OUT/native.$np.$round.json")
	done
	{
		echo "# torch all-reduce, $np ranks, sweep $SWEEP, best of $ROUNDS interleaved rounds; gorun flags: gloo '$GLOO_FLAGS', torch-gorun '$TORCH_GORUN_FLAGS'"
		echo "$before (before)"
		echo "$(load) (after)"
		"$GORUN" bench report --plot "$OUT/allreduce.$np.png" --ratio 2/1 --ratio 2/3 "${files[@]}"
		# The same rounds, by median: one run's best is one quiet moment,
		# the median what a run usually gets.
		"$PY" - "$OUT" "$np" "$ROUNDS" <<'PYEOF'
import statistics, sys
out, np_, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def times(path):  # size -> the faster placement's time (us), from the nccl-tests table
    t = {}
    for line in open(path):
        f = line.split()
        if line.startswith("#") or len(f) < 13 or not f[0].isdigit():
            continue
        t[int(f[0])] = min(float(f[5]), float(f[9]))
    return t
med = {}
for lab in ("gloo", "torch-gorun", "native"):
    per = [times("%s/%s.%s.%d.txt" % (out, lab, np_, r)) for r in range(1, rounds + 1)]
    med[lab] = {s: statistics.median(p[s] for p in per if s in p) for s in per[0]}
print("# medians of %d rounds (us per call, the faster placement); busbw ratios are time ratios" % rounds)
print("# %10s  %10s  %12s  %10s  %16s  %18s" % ("size", "gloo", "torch-gorun", "native", "torch-gorun/gloo", "torch-gorun/native"))
for s in sorted(med["torch-gorun"]):
    g, t, n = med["gloo"].get(s), med["torch-gorun"][s], med["native"].get(s)
    print("  %10d  %10.1f  %12.1f  %10.1f  %16.2f  %18.2f" % (s, g or 0, t, n or 0, g / t if g else 0, n / t if n else 0))
PYEOF
	} | tee "$OUT/compare.$np.txt"
done

# The boundary at >= 1 MiB with rows long enough to mean something.
part boundary && cc -O2 -Wall -pthread -o "$OUT/placewatch" bench/copybound/placewatch.c
part boundary && for np in $NPS; do
	before=$(load)
	: >"$OUT/boundary.placement.$np.txt"
	for round in $(seq "$BOUNDARY_ROUNDS"); do
		order="native torch-gorun"
		[ $((round % 2)) = 0 ] && order="torch-gorun native"
		for side in $order; do
			for half in a b; do
				# Rows of a few hundred ms: 2 ranks take a third of 4's time.
				sweep="-b 1M -e 4M -f 2 -n $((np > 2 ? 300 : 1000)) -w 20"
				[ "$half" = b ] && sweep="-b 8M -e 32M -f 2 -n $((np > 2 ? 60 : 200)) -w 5"
				f=boundary.$side$half.$np.$round.txt
				"$OUT/placewatch" >"$OUT/placewatch.out" &
				watch=$! rc=0
				# shellcheck disable=SC2086 # sweep and the flags are lists of flags
				if [ "$side" = native ]; then
					run "boundary np $np native $half ($round/$BOUNDARY_ROUNDS)" "$f" "$GORUN" -np "$np" "$GORUN" bench allreduce $sweep || rc=1
				else
					run "boundary np $np torch-gorun $half ($round/$BOUNDARY_ROUNDS)" "$f" "$GORUN" -np "$np" $TORCH_GORUN_FLAGS "$PY" bench/torch_allreduce.py --backend gorun $sweep || rc=1
				fi
				kill -TERM "$watch"
				wait "$watch"
				echo "$side$half $round $(cat "$OUT/placewatch.out")" >>"$OUT/boundary.placement.$np.txt"
				[ "$rc" = 0 ] || exit 1
			done
		done
	done
	{
		echo "# the Python/C boundary, $np ranks, $BOUNDARY_ROUNDS interleaved rounds, in place; gorun flags: torch-gorun '$TORCH_GORUN_FLAGS'"
		echo "$before (before)"
		echo "$(load) (after)"
		"$PY" - "$OUT" "$np" "$BOUNDARY_ROUNDS" <<'PYEOF'
import statistics, sys
out, np_, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def times(path):  # size -> in-place time (us), from the nccl-tests table
    t = {}
    for line in open(path):
        f = line.split()
        if line.startswith("#") or len(f) < 13 or not f[0].isdigit():
            continue
        t[int(f[0])] = float(f[9])
    return t
farshare = {}  # (side+half, round) -> the share of placewatch's probes during the run that were far
for line in open("%s/boundary.placement.%s.txt" % (out, np_)):
    f = line.split()  # side+half round probes N far F median-ns M
    farshare[(f[0], int(f[1]))] = int(f[5]) / max(1, int(f[3]))
def place(half, r):  # "near", "far" or "mixed" for both runs of a half-round
    fs = [farshare[(side + half, r)] for side in ("native", "torch-gorun")]
    return "near" if max(fs) <= 0.25 else "far" if min(fs) >= 0.75 else "mixed"
rows = {}  # size -> [(placement, native us, torch-gorun us)]
for r in range(1, rounds + 1):
    for half in "ab":
        nat = times("%s/boundary.native%s.%s.%d.txt" % (out, half, np_, r))
        tor = times("%s/boundary.torch-gorun%s.%s.%d.txt" % (out, half, np_, r))
        for s in nat:
            rows.setdefault(s, []).append((place(half, r), nat[s], tor[s]))
print("# us per call: medians of the rounds; native/torch-gorun is the busbw ratio (goal >= 0.9)")
print("# placement: placewatch's probes during each run (near: both runs at most a quarter far; far: both at least three quarters); ratio medians per placement")
print("# %10s  %10s  %12s  %18s  %22s  %-18s  %-18s  %s" % ("size", "native", "torch-gorun", "native/torch-gorun",
      "median of round ratios", "near: rounds, med", "far: rounds, med", "round ratios"))
for s in sorted(rows):
    n = statistics.median(x[1] for x in rows[s])
    t = statistics.median(x[2] for x in rows[s])
    rs = [x[1] / x[2] for x in rows[s]]
    by = []
    for pl in ("near", "far"):
        q = [x[1] / x[2] for x in rows[s] if x[0] == pl]
        by.append("%2d, %.2f" % (len(q), statistics.median(q)) if q else " 0, -")
    print("  %10d  %10.1f  %12.1f  %18.2f  %22.2f  %-18s  %-18s  %s" % (s, n, t, n / t, statistics.median(rs), by[0], by[1],
          " ".join("%.2f" % x for x in rs)))
PYEOF
	} | tee "$OUT/boundary.$np.txt"
done

# DDP: ROUNDS interleaved rounds per rank count, medians across rounds of
# each run's median step (wall) and CPU per step per rank (every thread).
part ddp || exit 0
DDP_STEPS=${DDP_STEPS:-40}
: >"$OUT/ddp.runs.txt"
for round in $(seq "$ROUNDS"); do
	for np in $NPS; do
		for b in gloo gorun; do
			echo "bench-torch: DDP np $np $b ($round/$ROUNDS)" >&2
			flags=$GLOO_FLAGS
			[ "$b" = gorun ] && flags=$TORCH_GORUN_FLAGS
			# shellcheck disable=SC2086 # flags is a list
			"$GORUN" -np "$np" $flags "$PY" examples/torch/ddp.py --backend "$b" --width 1024 --steps "$DDP_STEPS" |
				grep '^backend' >>"$OUT/ddp.runs.txt"
		done
	done
done
{
	echo "# DDP step (examples/torch/ddp.py --width 1024 --steps $DDP_STEPS), $ROUNDS interleaved rounds"
	echo "$(load)"
	"$PY" - "$OUT/ddp.runs.txt" <<'PYEOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"backend (\w+) ranks (\d+): median step ([\d.]+) ms, cpu ([\d.]+) ms", line)
    if m:
        runs.setdefault((int(m[2]), m[1]), []).append((float(m[3]), float(m[4])))
print("# %5s  %-24s  %-24s  %s" % ("ranks", "gloo step ms (cpu/rank)", "gorun step ms (cpu/rank)",
                                   "gloo/gorun step (>1: gorun faster)"))
for np in sorted({k[0] for k in runs}):
    med = {}
    for b in ("gloo", "gorun"):
        r = runs.get((np, b), [])
        med[b] = (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)) if r else (float("nan"),) * 2
    print("  %5d  %8.1f (%6.1f)         %8.1f (%6.1f)         %.2f   (all: gloo %s | gorun %s)" % (
        np, *med["gloo"], *med["gorun"], med["gloo"][0] / med["gorun"][0],
        " ".join("%.0f" % x[0] for x in runs.get((np, "gloo"), [])),
        " ".join("%.0f" % x[0] for x in runs.get((np, "gorun"), []))))
PYEOF
	echo "# The machine may be shared: rerun before trusting one number."
} | tee "$OUT/ddp.txt"
echo "bench-torch: results in $OUT/" >&2
