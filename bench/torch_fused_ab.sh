#!/usr/bin/env bash
# The fused rows of bench/torch_fused.py for two versions of the backend
# and library, in alternating runs of one session: BASE (a git revision,
# default main) against the working tree. Each pair of runs swaps its
# order, so that a machine that gets busier slows both alike. Prints each
# run's table, prefixed with its version; compare the medians of the
# coalesced row over "one" within each run.
#
#   bench/torch_fused_ab.sh [BASE]        NPS="2 4" PAIRS=3 ARGS="--floor --rounds 7 --steps 30"
#
# Run under `flock /tmp/gorun-bench.lock` on a shared machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base=${1:-main}
py=${PYTHON:-/root/.cache/gorun/venv/bin/python}
nps=${NPS:-2 4}
pairs=${PAIRS:-3}
args=${ARGS:---floor --rounds 7 --steps 30}
tmp=$(mktemp -d)
cleanup() {
	git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
git -C "$root" worktree add --detach "$tmp/base" "$base" >/dev/null
(cd "$tmp/base" && CGO_ENABLED=1 go build -buildmode=c-shared -o "$tmp/base/bin/libgorun.so" ./libgorun)
[ -x "$root/bin/gorun" ] && [ -f "$root/bin/libgorun.so" ] || { echo "run make build lib first" >&2; exit 2; }
echo "# base $(git -C "$tmp/base" rev-parse --short HEAD) ($base) against the working tree at $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo +changes)"
run() { # name pythonpath lib np
	echo "## $1, $4 ranks"
	GORUN_LIB=$3 PYTHONPATH=$2 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore \
		"$root/bin/gorun" -np "$4" --timeout 600s "$py" "$root/bench/torch_fused.py" --backend gorun $args
}
for np in $nps; do
	for p in $(seq 1 "$pairs"); do
		if [ $((p % 2)) = 1 ]; then
			run base "$tmp/base/python" "$tmp/base/bin/libgorun.so" "$np"
			run new "$root/python" "$root/bin/libgorun.so" "$np"
		else
			run new "$root/python" "$root/bin/libgorun.so" "$np"
			run base "$tmp/base/python" "$tmp/base/bin/libgorun.so" "$np"
		fi
	done
done
