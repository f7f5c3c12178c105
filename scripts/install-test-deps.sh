#!/usr/bin/env bash
# Installs the Debian packages the test suite needs. Idempotent: packages
# already present are not touched, so a developer machine pays nothing.
# Not root: prints what is missing and carries on (tests that need a missing
# tool skip with a message that says which one).
set -euo pipefail

# Packages the tests use; keep this list in step with what tests look for:
# sshd and SLURM serve tests/testhosts (namespace hosts, single-node SLURM);
# MPICH (mpich, libmpich-dev, gcc for mpicc.mpich) serves tests/mpi and the
# MPI tests in tests/multihost, and Open MPI's compiler (libopenmpi-dev,
# openmpi-bin) the test that gorun refuses Open MPI programs, and python3-mpi4py
# (built for Open MPI) the one that refuses Open MPI loaded at run time; Slurm's PMI-2
# client (libpmi2-0-dev) the PMI-2 tests in tests/mpi; gcc and
# libc6-dev also build nccl's stand-in libnccl.so.2 and libcuda.so.1
# (nccl/nccltest), which the nccl, bench and cmd/gorun tests load.
# passwd (useradd, userdel) and util-linux (runuser) give tests/security its
# second user; python3 is the other user's squatter in rendezvous's
# TestAttachNameHeldByAnotherUser. python3-venv makes the project's Python
# venv, into which scripts/install-torch.sh puts torch 2.x and pytest from
# PyPI for the torch backend's suite (make test-python, python/tests);
# Debian's python3-torch (torch 1.13) is no longer supported. gcc builds libgorun.
# iptables blackholes and partitions the namespace hosts (tests/multihost).
pkgs=(iproute2 iptables procps util-linux openssh-server openssh-client slurm-wlm slurm-client munge
  gcc libc6-dev mpich libmpich-dev libhwloc-dev openmpi-bin libopenmpi-dev libpmi2-0-dev passwd python3 python3-mpi4py python3-venv)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-deps: not root; missing Debian packages: ${missing[*]} (tests needing them skip)" >&2
  exit 0
fi
echo "install-test-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
