#!/usr/bin/env bash
# Multi-host launch time: 4 namespace hosts with their own sshd
# (tests/testhosts) × 4 ranks of /bin/true, `gorun -hostfile` against Open
# MPI's `mpirun --hostfile` over the same hosts and the same ssh config, run
# alternately in one go so both see the same load; prints each median and
# the ratio gorun/mpirun. Goal: ratio at most 0.5.
#
# Usage: scripts/bench-multihost.sh [RUNS]   (default 10; root; builds
# bin/gorun when missing). HOSTS and SLOTS override 4 and 4.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-10}
nhosts=${HOSTS:-4}
slots=${SLOTS:-4}
np=$((nhosts * slots))
[ "$(id -u)" -eq 0 ] || { echo "bench-multihost: needs root (network namespaces, sshd)" >&2; exit 3; }
gorun=$PWD/bin/gorun
if [ ! -x "$gorun" ]; then
  mkdir -p bin
  go build -o bin/ ./cmd/gorun
fi

if ! command -v mpirun >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "bench-multihost: installing openmpi-bin" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends openmpi-bin >/dev/null
fi

set_name=gb$$
set_name=${set_name:0:8}
env_out=$(bash tests/testhosts/netns-up.sh "$nhosts" "$set_name" --owner $$)
trap 'bash tests/testhosts/netns-down.sh "$set_name" >/dev/null 2>&1 || true' EXIT
ssh_config=$(sed -n 's/^SSH_CONFIG=//p' <<<"$env_out")
state=$(sed -n 's/^STATE=//p' <<<"$env_out")
hostfile=$state/bench-hostfile
sed "s/\$/ slots=$slots/" "$state/hostfile" >"$hostfile"

gorun_cmd=("$gorun" --launch-agent "ssh -F $ssh_config" -hostfile "$hostfile" /bin/true)
# gorun with ssh's own key exchange (OpenSSH 9's post-quantum hybrid), as
# it was before --ssh-kex fast became the default.
gorun_pq=("$gorun" --ssh-kex default --launch-agent "ssh -F $ssh_config" -hostfile "$hostfile" /bin/true)
# Open MPI: its orted on every host over the same ssh; TCP only, and no
# interface probing of the namespaces' loopback.
mpi_cmd=(mpirun --allow-run-as-root --hostfile "$hostfile" -np "$np"
  --mca plm_rsh_agent "ssh -F $ssh_config" --mca btl self,tcp --mca oob_tcp_if_include "$(sed -n 's/^SUBNET=//p' <<<"$env_out")"
  /bin/true)
# mpirun given the key exchange gorun picks, so the ssh work is equal on
# both sides and only the launchers differ.
fast_kex="-o KexAlgorithms=^curve25519-sha256,curve25519-sha256@libssh.org"
mpi_kex=(mpirun --allow-run-as-root --hostfile "$hostfile" -np "$np"
  --mca plm_rsh_agent "ssh -F $ssh_config $fast_kex" --mca btl self,tcp --mca oob_tcp_if_include "$(sed -n 's/^SUBNET=//p' <<<"$env_out")"
  /bin/true)
# The same two with ssh connection sharing (the second job onwards skips
# the ssh handshake): gorun's --ssh-multiplex, and the equivalent OpenSSH
# options handed to mpirun's ssh, so both sides get the same help.
mux_dir=$state/mux
mkdir -p "$mux_dir"
mux_opts="-o ControlMaster=auto -o ControlPath=$mux_dir/mpi-%C -o ControlPersist=120"
gorun_mux=("$gorun" --ssh-multiplex 120s --launch-agent "ssh -F $ssh_config" -hostfile "$hostfile" /bin/true)
mpi_mux=(mpirun --allow-run-as-root --hostfile "$hostfile" -np "$np"
  --mca plm_rsh_agent "ssh -F $ssh_config $mux_opts" --mca btl self,tcp --mca oob_tcp_if_include "$(sed -n 's/^SUBNET=//p' <<<"$env_out")"
  /bin/true)

elapsed() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>"$state/last-err" || { echo "bench-multihost: failed: $*" >&2; cat "$state/last-err" >&2; exit 1; }
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f\n", (b - a) / 1e9}'
}
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }
stats() { printf 'median %.4f s  (min %.4f, max %.4f)' "$(median <<<"$1")" "$(sort -n <<<"$1" | head -1)" "$(sort -n <<<"$1" | tail -1)"; }
ratio() { awk -v g="$(median <<<"$1")" -v m="$(median <<<"$2")" 'BEGIN {printf "%.3f", g / m}'; }

# Warm-up: page cache, sshd's first connection, the shared masters.
"${gorun_cmd[@]}" >/dev/null 2>&1 || true
"${gorun_mux[@]}" >/dev/null 2>&1 || true
have_mpi=0
if command -v mpirun >/dev/null 2>&1; then
  have_mpi=1
  "${mpi_cmd[@]}" >/dev/null 2>&1 || true
  "${mpi_mux[@]}" >/dev/null 2>&1 || true
  "${mpi_kex[@]}" >/dev/null 2>&1 || true
fi

g=() gp=() m=() mk=() gx=() mx=()
for ((i = 0; i < runs; i++)); do
  g+=("$(elapsed "${gorun_cmd[@]}")")
  gp+=("$(elapsed "${gorun_pq[@]}")")
  gx+=("$(elapsed "${gorun_mux[@]}")")
  if [ $have_mpi -eq 1 ]; then
    m+=("$(elapsed "${mpi_cmd[@]}")")
    mk+=("$(elapsed "${mpi_kex[@]}")")
    mx+=("$(elapsed "${mpi_mux[@]}")")
  fi
done
# The shared masters end with the hosts' sshd at teardown; end them now.
for s in "$mux_dir"/* /tmp/gorun-ssh-"$(id -u)"/*; do
  [ -S "$s" ] && ssh -o ControlPath="$s" -O exit x >/dev/null 2>&1 || true
done

gs=$(printf '%s\n' "${g[@]}") gps=$(printf '%s\n' "${gp[@]}") gxs=$(printf '%s\n' "${gx[@]}")
printf 'launch %d hosts x %d ranks of /bin/true over ssh, %d runs each, alternating\n' "$nhosts" "$slots" "$runs"
printf '  gorun                         %s\n' "$(stats "$gs")"
printf '  gorun --ssh-kex default       %s\n' "$(stats "$gps")"
printf '  gorun --ssh-multiplex         %s\n' "$(stats "$gxs")"
if [ $have_mpi -eq 1 ]; then
  ms=$(printf '%s\n' "${m[@]}") mks=$(printf '%s\n' "${mk[@]}") mxs=$(printf '%s\n' "${mx[@]}")
  printf '  mpirun                        %s\n' "$(stats "$ms")"
  printf '  mpirun, gorun'"'"'s key exchange  %s\n' "$(stats "$mks")"
  printf '  mpirun, ssh shared            %s\n' "$(stats "$mxs")"
  printf '  ratio gorun/mpirun, each as shipped          %s  (goal <= 0.5)\n' "$(ratio "$gs" "$ms")"
  printf '  ratio gorun/mpirun, same key exchange        %s\n' "$(ratio "$gs" "$mks")"
  printf '  ratio gorun --ssh-multiplex/mpirun           %s\n' "$(ratio "$gxs" "$ms")"
  printf '  ratio gorun/mpirun, both sharing ssh         %s\n' "$(ratio "$gxs" "$mxs")"
else
  echo "  mpirun  not available; no ratio"
fi
