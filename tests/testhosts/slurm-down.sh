#!/usr/bin/env bash
# slurm-down.sh [--owner PID[.N]]
#
# Stops the test cluster of slurm-up.sh. With --owner it only drops that
# owner's registration (and those of owners that have died) and stops the
# cluster when no owner is left; without it, it stops the cluster now.
# Stopping cancels every job, stops slurmd and slurmctld by their pid files,
# kills what is left of the jobs (slurmstepd and tasks carry this cluster's
# SLURM_CONF in their environment, which is how they are found), stops munged
# if slurm-up.sh started it, and removes the state directory.
# Idempotent: stopping a stopped cluster succeeds.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"

usage() { echo "usage: $0 [--owner PID[.N]]" >&2; exit 2; }
owner=""
case ${1:-} in
"") ;;
--owner) [ $# -eq 2 ] && [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage; owner=$2 ;;
*) usage ;;
esac
require_root
take_lock

state=$BASE/slurm
conf=$state/slurm.conf
[ -d "$state" ] || exit 0

if [ -n "$owner" ]; then
	rm -f "$state/owners/$owner"
	for f in "$state"/owners/*; do
		[ -e "$f" ] || continue
		o=$(basename "$f")
		o=${o%%.*}
		ns=$(cat "$f" 2>/dev/null || true)
		[[ $o =~ ^[0-9]+$ ]] && [ "${ns:-$(pidns)}" = "$(pidns)" ] && [ ! -d "/proc/$o" ] && rm -f "$f"
	done
	left=$(ls "$state/owners" 2>/dev/null | tr '\n' ' ')
	if [ -n "$left" ]; then
		log "slurm still used by: $left"
		exit 0
	fi
fi

export SLURM_CONF=$conf
if pid_alive "$state/slurmctld.pid" "slurmctld -f $conf"; then
	jobs=$(squeue -h -o %i 2>/dev/null || true)
	if [ -n "$jobs" ]; then
		# shellcheck disable=SC2086
		scancel $jobs 2>/dev/null || true
		for i in $(seq 50); do
			[ -z "$(squeue -h -o %i 2>/dev/null || true)" ] && break
			sleep 0.2
		done
	fi
fi
stop_pidfile "$state/slurmd.pid" "slurmd -f $conf"
stop_pidfile "$state/slurmctld.pid" "slurmctld -f $conf"

# Leftovers of jobs: any process whose environment names this cluster's
# configuration, except this script and its callers.
skip=" $$ $PPID "
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	case $skip in *" $pid "*) continue ;; esac
	if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$conf"; then
		# Never the process tree this script runs in.
		a=$PPID anc=0
		while [ "$a" -gt 1 ] && [ "$anc" -lt 32 ]; do
			[ "$a" = "$pid" ] && break
			a=$(awk '{print $4}' "/proc/$a/stat" 2>/dev/null || echo 1)
			anc=$((anc + 1))
		done
		[ "$a" = "$pid" ] && continue
		kill -KILL "$pid" 2>/dev/null || true
	fi
done

if [ -s "$state/munged_started" ]; then
	stop_pidfile "$(cat "$state/munged_started")" munged
fi
rm -rf "${state:?}"
log "slurm stopped"
