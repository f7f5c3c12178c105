#!/usr/bin/env bash
# MPI start-up under gorun's PMI server against MPICH's own launcher: an
# MPICH program that runs MPI_Init, one MPI_Barrier and MPI_Finalize
# (tests/mpi/testdata/mpiprog.c, mode "barrier"), started
#
#   locally:      gorun -np 16 PROG        vs  mpiexec.hydra -np 16 PROG
#   across hosts: gorun -hostfile H PROG   vs  mpiexec.hydra -f H PROG
#                 (4 namespace hosts × 4 ranks, tests/testhosts, same sshd
#                 and ssh config for both)
#
# alternately in one go, so both see the same load; prints each median and
# the ratio gorun/hydra. Goals: at most 0.5 locally, at most 1
# across hosts. Every run must exit 0 and print nothing unexpected: a failing
# launcher would otherwise look fast.
#
# Locally a third launcher runs in every round: scripts/pmifloor.c, the
# least any launcher can do (every rank forked before any runs, released
# at once, PMI answered from memory by one thread, the topology shared as
# gorun shares it). floor/hydra is the best ratio a launcher can reach on
# this machine; gorun/floor is what gorun's own work costs.
#
# Then WAIT_RUNS more rounds (default 5, 0 skips them) run every launcher
# with scripts/pmiwait.c preloaded into the ranks and print the median,
# over runs, of the PMI barrier waits summed over the job's barriers: for
# each barrier, from the last rank's barrier_in to the last rank's
# barrier_out, as the ranks see it. It is the launcher's share of the time
# inside MPI_Init and MPI_Finalize. These rounds are not in the timings
# above.
#
# Usage: scripts/bench-mpi.sh [RUNS]   (default 10; `make bench-mpi` builds
# bin/gorun first). NP overrides 16; HOSTS and SLOTS override 4 and 4;
# GORUN names another gorun binary; WAIT_RUNS sets the PMI wait rounds;
# BASE_GORUN adds a third launcher to
# every round, another gorun build (say main's), with the ratio gorun/base,
# so that a change is compared under the same load;
# LOCAL_ONLY=1 skips the hosts (which need root).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-10}
np=${NP:-16}
nhosts=${HOSTS:-4}
slots=${SLOTS:-4}
gorun=${GORUN:-$PWD/bin/gorun}
base=${BASE_GORUN:-}
[ -z "$base" ] || [ -x "$base" ] || { echo "bench-mpi: BASE_GORUN $base is not executable" >&2; exit 1; }
[ -x "$gorun" ] || { echo "bench-mpi: $gorun missing; run make build" >&2; exit 1; }
for tool in mpicc.mpich mpiexec.hydra; do
  command -v "$tool" >/dev/null || { echo "bench-mpi: $tool missing; install Debian's mpich and libmpich-dev (scripts/install-test-deps.sh)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/gorun-bench-mpi.XXXXXX)
set_name=""
cleanup() {
  [ -z "$set_name" ] || bash tests/testhosts/netns-down.sh "$set_name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
prog=$work/mpi_barrier
mpicc.mpich -O2 -o "$prog" tests/mpi/testdata/mpiprog.c
floor=$work/pmifloor
if ! cc -O2 -o "$floor" scripts/pmifloor.c -lhwloc 2>"$work/cc.err"; then
  echo "bench-mpi: cannot build scripts/pmifloor.c (libhwloc-dev?); no floor row:" >&2
  cat "$work/cc.err" >&2
  floor=""
fi
waitlib=$work/pmiwait.so
wait_runs=${WAIT_RUNS:-5}
if [ "$wait_runs" -gt 0 ] && ! cc -O2 -shared -fPIC -o "$waitlib" scripts/pmiwait.c -ldl 2>"$work/cc.err"; then
  echo "bench-mpi: cannot build scripts/pmiwait.c; no PMI wait rounds:" >&2
  cat "$work/cc.err" >&2
  wait_runs=0
fi
mkdir -p "$work/wait"

# elapsed times one run. A run whose MPI_Init failed in UCX with "No such
# device" is run again (at most twice, said on stderr): UCX lists the
# network interfaces while it starts, and on a machine where other jobs
# create and delete network namespaces (the test hosts) an interface can
# vanish between the listing and its opening, under either launcher.
elapsed() {
  local t0 t1 try
  for try in 1 2 3; do
    t0=$(date +%s%N)
    if "$@" >"$work/out" 2>"$work/err"; then
      break
    fi
    if [ "$try" -lt 3 ] && grep -q 'init_worker No such device' "$work/err"; then
      echo "bench-mpi: UCX lost a network device while starting (another job's namespaces?); running again: $*" >&2
      continue
    fi
    echo "bench-mpi: failed: $*" >&2
    cat "$work/err" >&2
    exit 1
  done
  t1=$(date +%s%N)
  [ ! -s "$work/out" ] || { echo "bench-mpi: unexpected output from $*:" >&2; cat "$work/out" >&2; exit 1; }
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f\n", (b - a) / 1e9}'
}
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }
stats() { printf 'median %.4f s  (min %.4f, max %.4f)' "$(median <<<"$1")" "$(sort -n <<<"$1" | head -1)" "$(sort -n <<<"$1" | tail -1)"; }
# base_line prints the base build's median and both ratios (after a loop
# that filled b).
base_line() {
  [ -n "$base" ] || return 0
  local bs
  bs=$(printf '%s\n' "${b[@]}")
  printf '  base %s  %s\n' "$base" "$(stats "$bs")"
  printf '  ratio base/hydra      %s; gorun/base %s\n' "$(ratio "$bs" "$hs")" "$(ratio "$gs" "$bs")"
}
ratio() { awk -v g="$(median <<<"$1")" -v m="$(median <<<"$2")" 'BEGIN {printf "%.3f", g / m}'; }
# waitsum prints, for the ranks' records in $work/wait (pmiwait.c), the
# PMI barrier waits summed over barriers in ms, and empties the directory.
# A run whose records are missing or uneven (a rank that saw fewer
# barriers) fails the benchmark rather than print a wrong sum.
waitsum() {
  local f out
  out=$(for f in "$work"/wait/*; do
    [ -e "$f" ] || continue
    awk '$1 == "i" {print "I", i++, $2} $1 == "o" {print "O", o++, $2}' "$f"
  done | awk -v want="$1" '
    $1 == "I" { if ($3 > li[$2]) li[$2] = $3; ni[$2]++ }
    $1 == "O" { if ($3 > lo[$2]) lo[$2] = $3; no[$2]++ }
    END {
      for (k = 0; k in li; k++) {
        if (ni[k] != want || no[k] != want) { printf "barrier %d: %d ranks in, %d out, want %d\n", k, ni[k], no[k], want; exit 1 }
        s += lo[k] - li[k]
      }
      if (k == 0) { print "no PMI barrier recorded"; exit 1 }
      printf "%.1f %d\n", s * 1000, k
    }') || { echo "bench-mpi: PMI wait records: $out" >&2; exit 1; }
  rm -f "$work"/wait/*
  echo "$out"
}
# wait_rounds runs one PMI wait round per launcher, WAIT_RUNS times, and
# prints the medians. Arguments: the rank count, then NAME=FUNCTION pairs,
# each function running one launcher with pmiwait.c preloaded.
wait_rounds() {
  local n=$1 i pair name ms nb out
  shift
  declare -A sums counts
  for ((i = 0; i < wait_runs; i++)); do
    for pair in "$@"; do
      name=${pair%%=*}
      elapsed "${pair#*=}" >/dev/null
      out=$(waitsum "$n") || exit 1
      read -r ms nb <<<"$out"
      sums[$name]+="$ms"$'\n'
      counts[$name]=$nb
    done
  done
  for pair in "$@"; do
    name=${pair%%=*}
    printf '  PMI barrier waits, %-6s median %6.1f ms summed over %d barriers (%d runs)\n' "$name" "$(median <<<"${sums[$name]}")" "${counts[$name]}" "$wait_runs"
  done
}

# Local: the same binary, the same rank count.
gl=("$gorun" -np "$np" "$prog" barrier)
hl=(mpiexec.hydra -np "$np" "$prog" barrier)
fl=("$floor" "$np" "$prog" barrier)
"${gl[@]}" >/dev/null 2>&1 || true
[ -z "$base" ] || "$base" "${gl[@]:1}" >/dev/null 2>&1 || true
"${hl[@]}" >/dev/null 2>&1 || true
[ -z "$floor" ] || "${fl[@]}" >/dev/null 2>&1 || true
g=() h=() b=() f=()
for ((i = 0; i < runs; i++)); do
  g+=("$(elapsed "${gl[@]}")")
  h+=("$(elapsed "${hl[@]}")")
  [ -z "$base" ] || b+=("$(elapsed "$base" "${gl[@]:1}")")
  [ -z "$floor" ] || f+=("$(elapsed "${fl[@]}")")
done
gs=$(printf '%s\n' "${g[@]}") hs=$(printf '%s\n' "${h[@]}")
printf 'MPI_Init + MPI_Barrier + MPI_Finalize, %d ranks on this machine, %d runs each, alternating\n' "$np" "$runs"
printf '  gorun -np %d          %s\n' "$np" "$(stats "$gs")"
printf '  mpiexec.hydra -np %d  %s\n' "$np" "$(stats "$hs")"
printf '  ratio gorun/hydra     %s  (goal <= 0.5)\n' "$(ratio "$gs" "$hs")"
base_line
if [ -n "$floor" ]; then
  fs=$(printf '%s\n' "${f[@]}")
  printf '  pmifloor %d (ideal)   %s\n' "$np" "$(stats "$fs")"
  printf '  ratio floor/hydra     %s  (the best any launcher reaches here); gorun/floor %s\n' "$(ratio "$fs" "$hs")" "$(ratio "$gs" "$fs")"
fi
wait_env=(LD_PRELOAD="$waitlib" PMIWAIT_DIR="$work/wait")
wait_gorun_local() { "$gorun" -np "$np" -x "${wait_env[0]}" -x "${wait_env[1]}" "$prog" barrier; }
wait_hydra_local() { mpiexec.hydra -np "$np" -genv LD_PRELOAD "$waitlib" -genv PMIWAIT_DIR "$work/wait" "$prog" barrier; }
wait_floor_local() { env "${wait_env[@]}" "${fl[@]}"; }
if [ "$wait_runs" -gt 0 ]; then
  if [ -n "$floor" ]; then
    wait_rounds "$np" gorun=wait_gorun_local hydra=wait_hydra_local floor=wait_floor_local
  else
    wait_rounds "$np" gorun=wait_gorun_local hydra=wait_hydra_local
  fi
fi

if [ "${LOCAL_ONLY:-0}" = 1 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "bench-mpi: across hosts needs root (network namespaces, sshd); skipped" >&2
  exit 0
fi
set_name=gm$$
set_name=${set_name:0:8}
env_out=$(bash tests/testhosts/netns-up.sh "$nhosts" "$set_name" --owner $$)
ssh_config=$(sed -n 's/^SSH_CONFIG=//p' <<<"$env_out")
state=$(sed -n 's/^STATE=//p' <<<"$env_out")
bridge_addr=$(sed -n 's/^BRIDGE_ADDR=//p' <<<"$env_out")
sed "s/\$/ slots=$slots/" "$state/hostfile" >"$work/hosts.gorun"
sed "s/\$/:$slots/" "$state/hostfile" >"$work/hosts.hydra"
# Hydra's -launcher-exec takes a program, not a command line. Both sides
# get the curve25519 key exchange gorun asks OpenSSH 9 for by default, so
# the ssh work is equal and only the launchers differ.
fast_kex="-o KexAlgorithms=^curve25519-sha256,curve25519-sha256@libssh.org"
printf '#!/bin/sh\nexec ssh -F %s %s "$@"\n' "$ssh_config" "$fast_kex" >"$work/ssh"
chmod +x "$work/ssh"
gm=("$gorun" --launch-agent "ssh -F $ssh_config" -hostfile "$work/hosts.gorun" "$prog" barrier)
# -localhost: Hydra's proxies on the hosts connect back to this address
# (the hosts' bridge), not to this machine's hostname, which they cannot
# resolve to a reachable address.
hm=(mpiexec.hydra -localhost "$bridge_addr" -launcher ssh -launcher-exec "$work/ssh" -f "$work/hosts.hydra"
  -np $((nhosts * slots)) "$prog" barrier)
"${gm[@]}" >/dev/null 2>&1 || true
[ -z "$base" ] || "$base" "${gm[@]:1}" >/dev/null 2>&1 || true
"${hm[@]}" >/dev/null 2>&1 || true
g=() h=() b=()
for ((i = 0; i < runs; i++)); do
  g+=("$(elapsed "${gm[@]}")")
  h+=("$(elapsed "${hm[@]}")")
  [ -z "$base" ] || b+=("$(elapsed "$base" "${gm[@]:1}")")
done
gs=$(printf '%s\n' "${g[@]}") hs=$(printf '%s\n' "${h[@]}")
printf 'the same, %d namespace hosts x %d ranks over ssh, %d runs each, alternating\n' "$nhosts" "$slots" "$runs"
printf '  gorun -hostfile       %s\n' "$(stats "$gs")"
printf '  mpiexec.hydra -f      %s\n' "$(stats "$hs")"
printf '  ratio gorun/hydra     %s  (goal <= 1)\n' "$(ratio "$gs" "$hs")"
base_line
if [ "$wait_runs" -gt 0 ]; then
  wait_gorun_hosts() { "${gm[@]:0:5}" -x "${wait_env[0]}" -x "${wait_env[1]}" "${gm[@]:5}"; }
  wait_hydra_hosts() { "${hm[@]:0:11}" -genv LD_PRELOAD "$waitlib" -genv PMIWAIT_DIR "$work/wait" "${hm[@]:11}"; }
  wait_rounds $((nhosts * slots)) gorun=wait_gorun_hosts hydra=wait_hydra_hosts
fi
