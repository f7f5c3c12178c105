#!/usr/bin/env bash
# netns-down.sh [SET | --all | --stale]
#
# Removes a namespace set made by netns-up.sh (SET defaults to gr): its sshd
# daemons, every process still running inside its namespaces (a test's
# leftovers), the namespaces (their veths go with them), the bridge, the
# /etc/hosts lines marked "# gorun-testhosts:SET" and the state directory.
# --all removes every set this machine knows of (state directories and
# /etc/hosts markers); --stale only sets whose recorded owner process is gone.
# Idempotent: removing what is already gone succeeds.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"

usage() { echo "usage: $0 [SET | --all | --stale]" >&2; exit 2; }
[ $# -le 1 ] || usage
mode=${1:-gr}
case $mode in
--all | --stale) ;;
-*) usage ;;
*) [[ $mode =~ ^[a-z][a-z0-9]{0,7}$ ]] || usage ;;
esac
require_root
take_lock

down_set() {
	local set=$1 state=$BASE/$1 ns pid
	for ns in $(ip netns list | awk '{print $1}' | grep -E "^$set-h[0-9]+\$" || true); do
		stop_pidfile "$state/$ns/sshd.pid" "$state/$ns/sshd_config"
		# Anything else still in the namespace belongs to a test of this set.
		for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
			kill -KILL "$pid" 2>/dev/null || true
		done
		ip netns del "$ns" 2>/dev/null || true
	done
	ip link del "$set-br" 2>/dev/null || true
	hosts_set "gorun-testhosts:$set"
	rm -rf "${state:?}"
	log "set $set removed"
}

# sets_known lists the sets with a state directory or /etc/hosts lines.
sets_known() {
	{
		for d in "$BASE"/*/subnet_index; do [ -e "$d" ] && basename "$(dirname "$d")"; done
		grep -oE ' # gorun-testhosts:[a-z][a-z0-9]*$' /etc/hosts | sed 's/.*://' || true
	} | sort -u
}

case $mode in
--all)
	for s in $(sets_known); do down_set "$s"; done
	;;
--stale)
	for s in $(sets_known); do
		# A set without an owner file was made by hand: only --all or its
		# name removes it. One owned from another PID namespace cannot be
		# judged from here. owner and ns are reset for every set, so that
		# one set's owner never stands for the next one's missing file.
		owner="" ns=""
		[ -r "$BASE/$s/owner" ] || continue
		read -r owner ns <"$BASE/$s/owner" || true
		[ -n "$owner" ] || continue
		[ "${ns:-$(pidns)}" = "$(pidns)" ] || continue
		[ -d "/proc/$owner" ] || down_set "$s"
	done
	;;
*)
	down_set "$mode"
	;;
esac
exit 0
