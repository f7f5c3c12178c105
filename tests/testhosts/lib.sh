# Shared by the testhosts scripts; sourced, never run. Bash only.
#
# Everything these scripts create lives under $GORUN_TESTHOSTS_DIR (default
# /tmp/gorun-testhosts): one directory per namespace set, one for SLURM, and
# a lock file that serializes every up and down on this machine, because
# test binaries of several packages may ask for hosts at the same time and
# they share /etc/hosts, apt and the subnet allocation.

BASE=${GORUN_TESTHOSTS_DIR:-/tmp/gorun-testhosts}

# Exit codes the Go helper relies on: 3 means "this machine cannot do it"
# (not root, a tool missing and not installable), so tests skip instead of
# failing.
EXIT_UNSUPPORTED=3

log() { echo "testhosts: $*" >&2; }
die() { log "$*"; exit 1; }
unsupported() { log "$*"; exit "$EXIT_UNSUPPORTED"; }

require_root() {
	[ "$(id -u)" -eq 0 ] || unsupported "needs root (network namespaces, sshd, slurm daemons)"
}

# take_lock serializes with every other up/down on this machine. The lock is
# held until the script exits (fd 9 stays open), so every daemon the scripts
# start must be started with 9>&- or it would hold the lock forever.
take_lock() {
	mkdir -p "$BASE"
	exec 9>"$BASE/.lock"
	flock -w 300 9 || die "timed out waiting for $BASE/.lock"
}

# ensure_pkgs CMD:PKG... installs the Debian package of every missing command.
ensure_pkgs() {
	local missing=() pair cmd pkg
	for pair in "$@"; do
		cmd=${pair%%:*} pkg=${pair#*:}
		if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "$cmd" ]; then
			missing+=("$pkg")
		fi
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	command -v apt-get >/dev/null 2>&1 || unsupported "missing ${missing[*]} and no apt-get to install them"
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# Try without a fresh index first: it is much faster when the cached one
	# is recent enough.
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$BASE/apt.log" 2>&1; then
		apt-get update -qq >>"$BASE/apt.log" 2>&1 || true
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$BASE/apt.log" 2>&1 ||
			unsupported "could not install ${missing[*]} (see $BASE/apt.log)"
	fi
}

# pid_alive PIDFILE PATTERN: the pid in PIDFILE is running and its command
# line contains PATTERN (guards against a recycled pid).
pid_alive() {
	local pid
	[ -s "$1" ] || return 1
	pid=$(tr -dc 0-9 <"$1")
	[ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}

# stop_pidfile PIDFILE PATTERN: SIGTERM the daemon, SIGKILL after ~5 s.
stop_pidfile() {
	local pid i
	pid_alive "$1" "$2" || { rm -f "$1"; return 0; }
	pid=$(tr -dc 0-9 <"$1")
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 50); do
		[ -d "/proc/$pid" ] || break
		# a zombie child of ours would never disappear: stop waiting then
		grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && break
		sleep 0.1
	done
	[ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null || true
	rm -f "$1"
}

# hosts_set MARKER [LINE...]: replace the /etc/hosts lines that end with
# "# MARKER" by LINEs (none: just remove them). MARKER holds only letters,
# digits, '-' and ':', so it is safe in a regular expression. /etc/hosts is
# often a bind mount, so it is rewritten in place, never renamed over.
hosts_set() {
	local marker="# $1" tmp
	shift
	tmp=$(mktemp "$BASE/hosts.XXXXXX")
	grep -vE -- " $marker\$" /etc/hosts >"$tmp" || true
	local line
	for line in "$@"; do
		printf '%s %s\n' "$line" "$marker" >>"$tmp"
	done
	if ! cmp -s "$tmp" /etc/hosts; then
		cat "$tmp" >/etc/hosts
	fi
	rm -f "$tmp"
}

# pidns names this shell's PID namespace: owners' pids are recorded with
# it, and a pid from another namespace is never judged dead from here.
pidns() { readlink /proc/self/ns/pid 2>/dev/null || echo unknown; }
