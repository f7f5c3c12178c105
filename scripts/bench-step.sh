#!/usr/bin/env bash
# Step-runtime benchmarks over real processes, printed side
# by side with their goals. Both go through the path a program takes: the
# step written as a stepgraph.Graph, the bucketing passes the trainer runs
# (block, then overlap-preserving), and overlap's GraphRunner.
#
#   synthetic  a transformer-shaped step of L blocks: per block a forward
#              parameter all-gather (placed PREFETCH blocks ahead in the
#              graph) and a backward gradient reduce-scatter, compute
#              modelled as a timed sleep sized to RATIO × the measured
#              communication time. Overlapped step vs ideal max(compute,
#              comm) and vs the serial sum; goal: exposed communication
#              ≤ 10% of communication time when compute ≥ communication.
#   bucketing  200 gradient tensors of 40 KB all-reduced per step: the graph
#              as written (one collective per tensor) vs the graph after the
#              bucketing passes, per cap (0: the cost model's) with the
#              gradients in the program's own buffers (packed and scattered:
#              "copies") and living in the buckets (GraphRunner.View, DDP's
#              gradient_as_bucket_view: "views", nothing copied). The cost
#              model is measured first (α per extra back-to-back call, bus
#              bandwidth, copy rate); with copies, a tensor whose copies
#              cost more than α is not bucketed at all. Goal ≥ 3× where
#              per-call latency allows; a reference runs the same traffic
#              straight on the communicator and prints that bound.
#
# Every figure is the median over ITERS steps of the slowest rank; the
# variants of one measurement run alternately, so load from other processes
# on a shared machine hits them alike.
#
# Measured on the graph path (2 cores shared with seven other agents, load
# 8.6-13, ITERS=15, defaults otherwise; one run, figures swing by tens of
# percent at this load), exposed share of comm / overlapped native step vs
# ideal / vs serial:
#   np 2 shm  3.6%  1.30× ideal (grouped 1.17×)  0.83× serial
#   np 2 tcp  6.5%  1.13× ideal                  0.65× serial
#   np 4 shm  7.2%  1.09× ideal                  0.73× serial
#   np 4 tcp  2.5%  1.07× ideal                  0.70× serial
# bucketing, per-tensor vs bucketed (cost-model cap / 25 MB cap):
#   np 2 shm 3.56× / 4.45×, tcp 2.01× / 2.53×; np 4 shm 4.22× / 9.94×,
#   tcp 2.28× / 2.80× — the executor-free reference gives 5.35×, 3.01×,
#   16.5×, 2.40×: on TCP the per-call latency bounds the gain below 3×.
#
# Under load (9-20, figures swing 2×; bounds from the same runs): np 2
# shm bucketing bound 0.5-3.4× (quiet: 1.22-1.24×); views 1.05-2.50×,
# copies (the cost model leaves 40 KB gradients alone) 0.65-1.50×; the
# np 2 shm synthetic step 1.01× ideal, exposed 1.0% (notes/step-path.md).
#
# Each synthetic run also prints the schedule bound (the graph
# run on a clock with every compute and every collective at its time
# alone, so the dependencies' cost counts) and the bound the cores allow
# (the job's CPU time per step, computing alone plus communicating alone,
# over its cores; and each rank's own over its own cores) and the
# overlapped step against it, next to the goal max(P, C).
# COMPUTE=cpu replaces the sleeps by fixed arithmetic (a CPU trainer's
# compute, which shares the cores with communication); MIN_PROCS=0 runs
# with GOMAXPROCS as gorun sets it (1), the runtime without MinProcs
# (overlap.Config.MinProcs, notes/step-path.md).
#
# Quiet (4 rounds, medians; notes/step-path.md): × ideal /
# exposed % of C: np 2 shm 1.105 / 2.95 %, np 2 tcp 1.155 / 5.05 %, np 4 shm
# 1.062 / 3.75 %, np 4 tcp 1.081 / 4.05 %. np 2 ranks (one core each) now
# overlap every run: the executors widen GOMAXPROCS when the compute blocks
# (overlap/procs.go); before, a run overlapped or not (exposed 3-114 %)
# depending on the runtime monitor's polling period. Each run prints
# GOMAXPROCS after the steps.
#
# The compute is sized from C measured under the loop's own
# conditions: a first guess of C, then a short pass of the loop's steps
# (communication alone, compute alone, serial, native, grouped) whose
# communication alone gives the C that RATIO multiplies. Before, C came
# from a cold start with one P, and the overlapped steps then widened a
# one-CPU rank to two Ps (see above), under which communication alone
# takes 25-40 % longer (np 2, 1 MiB shards: shm 4.6 → 6.0 ms, tcp 7.3 →
# 9.8 ms): P came out 1.05-1.25 × the loop's C instead of RATIO ×. Each
# run prints both Cs. The bucketing cost model's copy rate is measured as
# the executor copies (members from their own buffers, packed and
# scattered, caches cold): 4-29 GB/s here (np 2 and 4), against 38-48 GB/s for the
# hot 8 MB copy used before. Quiet, 6 rounds, medians: × ideal / exposed
# np 2 shm 1.075 / 2.4 %, np 2 tcp 1.096 / 3.7 %, np 4 shm 1.060 / 3.5 %,
# np 4 tcp 1.062 / 3.6 %; views bucket × one fused call 1.029, 1.041,
# 1.080, 1.045 (the views variant binds its slots, GraphRunner.Bind).
#
# Usage: scripts/bench-step.sh [NP...]   (default: 2 4)
#   ITERS=15 BLOCKS=16 SHARD=1048576 RATIO=1.5 CAPS=0,25000000 PREFETCH=2 \
#   COMPUTE=sleep MIN_PROCS=2 TRANSPORTS="shm tcp" scripts/bench-step.sh 4
# (tcp forces TCP loopback between ranks of one host, the inter-host path.)
set -euo pipefail
cd "$(dirname "$0")/.."

nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(2 4)
iters=${ITERS:-15}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

go build -o "$tmp/" ./cmd/gorun ./overlap/internal/stepbench

args=(--iters "$iters" --blocks "${BLOCKS:-16}" --shard "${SHARD:-1048576}" --ratio "${RATIO:-1.5}" --caps "${CAPS:-0,25000000}" --prefetch "${PREFETCH:-2}" --compute "${COMPUTE:-sleep}" --min-procs "${MIN_PROCS:-2}")
read -r -a transports <<<"${TRANSPORTS:-shm tcp}"

echo "# bench-step: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for np in "${nps[@]}"; do
  for tr in "${transports[@]}"; do
    extra=()
    [ "$tr" = tcp ] && extra=(--tcp)
    echo
    echo "## -np $np, $tr"
    "$tmp/gorun" -np "$np" "$tmp/stepbench" "${args[@]}" "${extra[@]}"
  done
done
