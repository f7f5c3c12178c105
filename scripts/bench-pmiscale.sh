#!/usr/bin/env bash
# A real MPICH program's start-up (MPI_Init, one MPI_Barrier,
# MPI_Finalize) over HOSTS simulated hosts of PER ranks on this machine
# (bench/pmiscale): the gets that reach gorun (round trips) and the bytes
# gorun sends the hosts, with batched answers (each get brings its host's
# barrier batch) and with one key per answer, run interleaved
# (batch, fetch, fetch, batch). Needs Debian's mpich (mpicc.mpich).
#
#   HOSTS=32 PER=4 scripts/bench-pmiscale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${HOSTS:-32}
PER=${PER:-4}
if ! command -v mpicc.mpich >/dev/null; then
	echo "bench-pmiscale: mpicc.mpich not found (Debian mpich, libmpich-dev)" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicc.mpich -O1 -o "$tmp/mpiprog" tests/mpi/testdata/mpiprog.c
go build -o "$tmp/pmiscale" ./bench/pmiscale
"$tmp/pmiscale" -prog "$tmp/mpiprog" -hosts "$HOSTS" -per "$PER" -mode batch,fetch,fetch,batch barrier | tee "$tmp/rows"
awk '$2=="batch" {b+=$3; bb+=$6; n++} $2=="fetch" {f+=$3; fb+=$6; m++}
	END {if (n && m && f && fb) printf "batch/fetch: gets %.2f, bytes to the busiest host %.2f\n", (b/n)/(f/m), (bb/n)/(fb/m)}' "$tmp/rows"
