#!/usr/bin/env bash
# netns-up.sh N [SET] [--owner PID]
#
# Makes N "hosts" SET-h1..SET-hN (SET defaults to gr) out of Linux network
# namespaces on this machine, each with its own address and a real sshd:
#
#   SET-br        a bridge holding 198.18.X.1/24 on the launching host
#   SET-hK        a namespace with eth0 = 198.18.X.(10+K)/24 (veth vSET-hK on
#                 the bridge), lo up, default route via the bridge, and its own
#                 UTS namespace for sshd so `hostname` there prints SET-hK
#   /etc/hosts    "198.18.X.(10+K) SET-hK # gorun-testhosts:SET"
#
# 198.18.0.0/15 is reserved for network benchmark tests (RFC 2544): it is
# never a real network, so it cannot shadow a route this machine needs. X is
# picked per set so that several sets (one per test binary) can coexist.
#
# Keys, sshd configs, logs and the client ssh config live in
# $GORUN_TESTHOSTS_DIR/SET (default /tmp/gorun-testhosts/SET); root's own
# ~/.ssh is never touched. Idempotent: running it again repairs what is
# missing and leaves what works alone. On success it verifies
# `ssh -F CONFIG SET-hK true` for every host and prints KEY=VALUE lines
# (also saved in STATE/env):
#
#   SET STATE SSH_CONFIG IDENTITY BRIDGE BRIDGE_ADDR SUBNET HOSTS ADDRS HOSTFILE
#
# --owner PID records the process the set belongs to: a later netns-up.sh or
# the Go helper may remove sets whose owner is gone (netns-down.sh --stale).
#
# Exit codes: 0 ok, 1 failure, 2 usage, 3 this machine cannot (not root,
# tools missing and not installable).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"

usage() { echo "usage: $0 N [SET] [--owner PID]   (1 <= N <= 200, SET = [a-z][a-z0-9]{0,7})" >&2; exit 2; }
n="" set="" owner=""
while [ $# -gt 0 ]; do
	case $1 in
	--owner) [ $# -ge 2 ] || usage; owner=$2; shift 2 ;;
	-h | --help) usage ;;
	*)
		if [ -z "$n" ]; then n=$1; elif [ -z "$set" ]; then set=$1; else usage; fi
		shift
		;;
	esac
done
set=${set:-gr}
[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || usage
# Interface names are at most 15 bytes: "v" + SET + "-h" + 3 digits fits.
[[ $set =~ ^[a-z][a-z0-9]{0,7}$ ]] || usage
[ -z "$owner" ] || [[ $owner =~ ^[0-9]+$ ]] || usage

require_root
take_lock
ensure_pkgs ip:iproute2 unshare:util-linux /usr/sbin/sshd:openssh-server ssh:openssh-client ssh-keygen:openssh-client

state=$BASE/$set
mkdir -p "$state"
chmod 700 "$state"
# No --owner: made by hand, so --stale must leave it alone.
# The owner's PID namespace goes with its pid: a pid means nothing in
# another namespace (a test run under unshare --pid beside one outside it).
if [ -n "$owner" ]; then echo "$owner $(pidns)" >"$state/owner"; else rm -f "$state/owner"; fi

# Subnet: keep the set's own, else the lowest 198.18.X.0/24 no other set
# holds and no interface of this machine uses.
if [ -s "$state/subnet_index" ]; then
	x=$(cat "$state/subnet_index")
else
	used=" "
	for f in "$BASE"/*/subnet_index; do
		[ -s "$f" ] && used+="$(cat "$f") "
	done
	addrs=$(ip -o -4 addr show)
	x=""
	for i in $(seq 1 254); do
		case $used in *" $i "*) continue ;; esac
		grep -qF " 198.18.$i." <<<"$addrs" && continue
		x=$i
		break
	done
	[ -n "$x" ] || die "no free 198.18.X.0/24 subnet left"
	echo "$x" >"$state/subnet_index"
fi
br=$set-br
br_addr=198.18.$x.1

# Bridge.
ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge
ip addr replace "$br_addr/24" dev "$br"
ip link set "$br" up

# Keys: one host key shared by the set's sshds, one client key.
[ -s "$state/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "gorun-testhosts $set host" -f "$state/ssh_host_ed25519_key"
[ -s "$state/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "gorun-testhosts $set client" -f "$state/id_ed25519"
cp "$state/id_ed25519.pub" "$state/authorized_keys"
# This machine's cgroup mounts (target fstype options, ';'-separated),
# given to each host's sshd below.
cgmounts=$(findmnt -rn -R -o TARGET,FSTYPE,OPTIONS /sys/fs/cgroup 2>/dev/null | tr '\n' ';' || true)

# sshd's privilege separation directory.
mkdir -p /run/sshd
chmod 755 /run/sshd

# The kernel keeps one IPv4 neighbour (ARP) table for every namespace of
# the machine, capped by gc_thresh3 (1024 by default): N hosts that all
# talk to each other hold about N^2 entries, so 32 hosts overflow it and
# the kernel drops packets ("neighbor table overflow"), which a job sees
# as dial timeouts between healthy hosts. On a real cluster every host has
# its own table. Raise the caps (never lower them) to fit every set.
neigh=/proc/sys/net/ipv4/neigh/default
for kv in gc_thresh2=8192 gc_thresh3=16384; do
	f=$neigh/${kv%=*} want=${kv#*=}
	if [ -w "$f" ] && [ "$(cat "$f")" -lt "$want" ]; then
		echo "$want" >"$f" || echo "netns-up.sh: cannot raise ${kv%=*} to $want; more than ~30 hosts may drop packets" >&2
	fi
done

# Hosts beyond N left by an earlier, larger run of this set go away.
for ns in $(ip netns list | awk '{print $1}' | grep -E "^$set-h[0-9]+\$" || true); do
	k=${ns#"$set"-h}
	if [ "$k" -gt "$n" ]; then
		stop_pidfile "$state/$ns/sshd.pid" "$state/$ns/sshd_config"
		for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
		ip netns del "$ns" 2>/dev/null || true
		rm -rf "${state:?}/$ns"
	fi
done

names=() addrs=() hosts_lines=()
for k in $(seq 1 "$n"); do
	ns=$set-h$k
	addr=198.18.$x.$((10 + k))
	veth=v$ns
	names+=("$ns")
	addrs+=("$addr")
	hosts_lines+=("$addr $ns")

	[ -e "/run/netns/$ns" ] || ip netns add "$ns"
	if ! ip link show "$veth" >/dev/null 2>&1; then
		# A stale eth0 (its peer gone) would block the new pair.
		ip -n "$ns" link del eth0 2>/dev/null || true
		ip link add "$veth" type veth peer name eth0 netns "$ns"
	fi
	ip link set "$veth" master "$br" up
	ip -n "$ns" link set lo up
	ip -n "$ns" addr replace "$addr/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" route replace default via "$br_addr"

	mkdir -p "$state/$ns"
	cat >"$state/$ns/sshd_config" <<EOF
# sshd of test host $ns (gorun tests/testhosts); started by netns-up.sh.
ListenAddress $addr
Port 22
PidFile $state/$ns/sshd.pid
HostKey $state/ssh_host_ed25519_key
AuthorizedKeysFile $state/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# The state directory is under /tmp: StrictModes would refuse it.
StrictModes no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
# Launch tests open many sessions at once; the defaults (10) would refuse some.
MaxStartups 200
MaxSessions 200
LogLevel ERROR
Subsystem sftp internal-sftp
EOF
	if ! pid_alive "$state/$ns/sshd.pid" "$state/$ns/sshd_config"; then
		rm -f "$state/$ns/sshd.pid"
		# sshd daemonizes; the UTS namespace gives the host its own name.
		# ip netns exec remounts /sys in a mount namespace of its own,
		# which hides the cgroup tree a real host has: mount this
		# machine's cgroup hierarchies again there (best effort, the same
		# hierarchies), so that a gorun agent on the host finds them as it
		# would on a real machine (job cgroups, gorun doctor).
		ip netns exec "$ns" unshare --uts sh -c '
			hostname "$1" || exit 1
			printf "%s" "$4" | tr ";" "\n" | while read -r target fstype opts; do
				[ -n "$target" ] || continue
				mkdir -p "$target" 2>/dev/null
				mount -t "$fstype" -o "$opts" "$fstype" "$target" 2>/dev/null || true
			done
			exec /usr/sbin/sshd -f "$2" -E "$3"' 9>&- \
			sh "$ns" "$state/$ns/sshd_config" "$state/$ns/sshd.log" "$cgmounts"
	fi
done

# Client side.
{
	echo "# ssh client config for test hosts of set $set (gorun tests/testhosts)."
	for k in $(seq 1 "$n"); do
		cat <<EOF
Host ${names[k - 1]}
	HostName ${addrs[k - 1]}
EOF
	done
	cat <<EOF
Host ${names[*]}
	User root
	IdentityFile $state/id_ed25519
	IdentitiesOnly yes
	StrictHostKeyChecking no
	UserKnownHostsFile /dev/null
	BatchMode yes
	ConnectTimeout 5
	LogLevel ERROR
EOF
} >"$state/ssh_config"
printf '%s\n' "${names[@]}" >"$state/hostfile"
hosts_set "gorun-testhosts:$set" "${hosts_lines[@]}"

# Verify: every host answers over ssh, all hosts at once (a handshake costs
# seconds of CPU on a loaded machine). sshd needs a moment after forking.
verify() {
	local i
	for i in $(seq 1 100); do
		ssh -F "$state/ssh_config" "$1" true 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
pids=()
for ns in "${names[@]}"; do
	verify "$ns" &
	pids+=($!)
done
for k in $(seq 1 "$n"); do
	ns=${names[k - 1]}
	if ! wait "${pids[k - 1]}"; then
		ssh -F "$state/ssh_config" "$ns" true || true
		die "ssh to $ns does not work; sshd log: $(tail -n 5 "$state/$ns/sshd.log" 2>/dev/null)"
	fi
done

cat >"$state/env" <<EOF
SET=$set
STATE=$state
SSH_CONFIG=$state/ssh_config
IDENTITY=$state/id_ed25519
BRIDGE=$br
BRIDGE_ADDR=$br_addr
SUBNET=198.18.$x.0/24
HOSTS=${names[*]}
ADDRS=${addrs[*]}
HOSTFILE=$state/hostfile
EOF
cat "$state/env"
log "set $set: $n hosts up (${names[0]}..${names[n - 1]}), ssh -F $state/ssh_config ${names[0]}"
