#!/usr/bin/env bash
# slurm-up.sh [--owner PID]
#
# Starts a single-node SLURM cluster on this machine for tests: munged (when
# none answers yet), slurmctld and slurmd from Debian's slurm-wlm (installed
# when missing), configured in $GORUN_TESTHOSTS_DIR/slurm (default
# /tmp/gorun-testhosts/slurm). The node is this machine's short hostname at
# 127.0.0.1 with at least 16 CPUs declared (more than it has, so jobs with
# more tasks than cores run without --overcommit); its partition "debug"
# also oversubscribes (FORCE:8). Client commands need SLURM_CONF pointing at the
# printed path; without it they try DNS SRV records and fail.
#
# The daemons listen on 16817/16818, not SLURM's 6817/6818, so a real
# installation on the machine is left alone.
#
# Idempotent: a running cluster is reused. --owner PID[.N] registers a user
# of the cluster (N tells apart several users inside one process);
# slurm-down.sh --owner PID[.N] stops it only when no live owner is left
# (test binaries of several packages may share it). Without --owner the
# registration is "manual", removed only by a plain slurm-down.sh.
#
# Prints (and saves in STATE/env): SLURM_CONF STATE NODE CPUS PARTITION
# Exit codes: 0 ok, 1 failure, 2 usage, 3 this machine cannot.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"

usage() { echo "usage: $0 [--owner PID[.N]]" >&2; exit 2; }
owner=manual
case ${1:-} in
"") ;;
--owner) [ $# -eq 2 ] && [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage; owner=$2 ;;
*) usage ;;
esac

require_root
take_lock
ensure_pkgs slurmctld:slurm-wlm slurmd:slurm-wlm srun:slurm-client sinfo:slurm-client \
	munged:munge munge:munge runuser:util-linux

state=$BASE/slurm
conf=$state/slurm.conf
mkdir -p "$state/owners" "$state/ctld" "$state/spool"
pidns >"$state/owners/$owner" # see pidns in lib.sh

# munge: the key and directories the package normally prepares, then the
# daemon unless one already answers.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	if [ ! -s /etc/munge/munge.key ]; then
		mkdir -p /etc/munge
		if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key; else
			dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
	fi
	chown munge:munge /etc/munge/munge.key
	chmod 400 /etc/munge/munge.key
	for d in /run/munge /var/lib/munge /var/log/munge; do
		mkdir -p "$d"
		chown munge:munge "$d"
	done
	chmod 755 /run/munge
	log "starting munged"
	runuser -u munge -- /usr/sbin/munged 9>&-
	# Remember that this cluster started it, so slurm-down.sh stops it.
	echo /run/munge/munged.pid >"$state/munged_started"
	for i in $(seq 50); do
		munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
		sleep 0.1
	done
	munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
fi

node=$(hostname -s)
# The node claims at least 16 CPUs (config_overrides makes slurmd believe
# the config, not the hardware), so `srun -n 16` runs as it would on a real
# node without --overcommit; the partition oversubscribes on top of that.
cpus=$(nproc)
[ "$cpus" -ge 16 ] || cpus=16
cat >"$conf.new" <<EOF
# Single-node test cluster (gorun tests/testhosts/slurm-up.sh).
ClusterName=gorun-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
# No cgroups here: track tasks by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
# Short timers: a test cluster should react fast and forget jobs soon.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
Waittime=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
if ! cmp -s "$conf.new" "$conf"; then
	mv "$conf.new" "$conf"
	changed=1
else
	rm -f "$conf.new"
	changed=""
fi

export SLURM_CONF=$conf
# A changed configuration needs fresh daemons.
if [ -n "$changed" ]; then
	stop_pidfile "$state/slurmd.pid" "slurmd -f $conf"
	stop_pidfile "$state/slurmctld.pid" "slurmctld -f $conf"
fi
# The daemons get SLURM_CONF in their environment too; so do the
# slurmstepd processes and tasks they start, which lets slurm-down.sh find
# them.
if ! pid_alive "$state/slurmctld.pid" "slurmctld -f $conf"; then
	log "starting slurmctld"
	slurmctld -f "$conf" 9>&-
fi
if ! pid_alive "$state/slurmd.pid" "slurmd -f $conf"; then
	log "starting slurmd"
	slurmd -f "$conf" 9>&-
fi

# Ready when the node is idle (or already running jobs of another owner).
st=""
for i in $(seq 300); do
	st=$(sinfo -h -o %T -n "$node" 2>/dev/null | head -n 1 || true)
	case $st in idle | mixed | allocated) break ;; esac
	# A node that registered as down (e.g. after an unclean stop) resumes.
	case $st in down* | drain*) scontrol update nodename="$node" state=resume 2>/dev/null || true ;; esac
	sleep 0.2
done
case $st in idle | mixed | allocated) ;; *)
	die "node $node is ${st:-not registered} after 60 s; see $state/slurmctld.log and $state/slurmd.log" ;;
esac

cat >"$state/env" <<EOF
SLURM_CONF=$conf
STATE=$state
NODE=$node
CPUS=$cpus
PARTITION=debug
EOF
cat "$state/env"
log "slurm up: export SLURM_CONF=$conf"
