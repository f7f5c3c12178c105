# Sourced, never run, by the Go trainer's restart benchmarks
# (bench-elastic.sh, bench-restart-trainer.sh), from the repository root.
# The caller sets bench (its name, for messages) and set_prefix (three
# letters naming its namespace-host set). This checks bin/gorun and
# bin/trainer and makes $tmp and $set_name, which the EXIT trap removes,
# the namespace hosts with them.
# py reads the benchmarks' JSON reports: the standard library is enough, so
# $PYTHON, else the project's venv when there, else python3 (no install).
source scripts/bench-python.sh
bench_python "$bench" stdlib
py=$PY
gorun=$PWD/bin/gorun
trainer=$PWD/bin/trainer
[ -x "$gorun" ] && [ -x "$trainer" ] || { echo "$bench: bin/gorun or bin/trainer missing; run make build" >&2; exit 1; }
tmp=$(mktemp -d)
set_name=$set_prefix$$
set_name=${set_name:0:8}
cleanup() {
  tests/testhosts/netns-down.sh "$set_name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
