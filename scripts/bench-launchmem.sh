#!/usr/bin/env bash
# Launcher memory per rank: the resident memory of gorun (the launcher and
# its local job supervisor) while N ranks of `sleep` run, beside Open MPI's
# mpirun and MPICH's hydra mpiexec (whatever of them is installed) at the
# same N in the same run, and the slope between the smallest and largest N
# in KB per rank: what each extra rank costs the launcher, without the
# fixed cost of the binary. Ranks are all on this host (oversubscribed).
# Each launcher's memory is the sum of VmRSS over its process tree, less
# the ranks; it is read once every rank runs. ROUNDS runs per N and
# launcher, medians.
#
# BASE=REV also measures gorun built from git revision REV (for example
# main, or HEAD~3), as launcher "base", beside this tree's: a change's
# before and after in the same run.
#
#   SIZES=64,256,1024 ROUNDS=3 [BASE=main] scripts/bench-launchmem.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-64,256,1024}
ROUNDS=${ROUNDS:-3}
tmp=$(mktemp -d)
root=""
cleanup() {
	[[ -n "$root" ]] && kill -TERM "$root" 2>/dev/null || true
	[[ -d "$tmp/base-src" ]] && git worktree remove --force "$tmp/base-src"
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/gorun" ./cmd/gorun

launchers=(gorun)
if [[ -n ${BASE:-} ]]; then
	git worktree add -q --detach "$tmp/base-src" "$BASE"
	(cd "$tmp/base-src" && go build -o "$tmp/base" ./cmd/gorun)
	git worktree remove --force "$tmp/base-src"
	launchers+=(base)
fi
command -v mpirun.openmpi >/dev/null && launchers+=(openmpi)
command -v mpiexec.hydra >/dev/null && launchers+=(hydra)

# start LAUNCHER N MARK: start N ranks of `sleep MARK` under it, in the
# background; sets root to its pid.
start() {
	case $1 in
	gorun | base) "$tmp/$1" -np "$2" --oversubscribe sleep "$3" >/dev/null 2>&1 & ;;
	openmpi) OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun.openmpi --oversubscribe -np "$2" sleep "$3" >/dev/null 2>&1 & ;;
	hydra) mpiexec.hydra -np "$2" sleep "$3" >/dev/null 2>&1 & ;;
	esac
	root=$!
}

# treerss ROOT MARK: KB of VmRSS summed over ROOT and its descendants,
# less the ranks (processes whose command line is `sleep MARK`), and the
# sum of the same processes' peaks (VmHWM: start-up's transients).
treerss() {
	ps -eo pid=,ppid=,rss=,args= | awk -v root="$1" -v mark="sleep $2" '
		{ pid[NR] = $1; ppid[NR] = $2; rss[NR] = $3; $1 = $2 = $3 = ""; sub(/^ +/, ""); cmd[NR] = $0 }
		END {
			in_tree[root] = 1
			do { grew = 0
				for (i = 1; i <= NR; i++) if (!(pid[i] in in_tree) && (ppid[i] in in_tree)) { in_tree[pid[i]] = 1; grew = 1 }
			} while (grew)
			for (i = 1; i <= NR; i++) if ((pid[i] in in_tree) && cmd[i] != mark) {
				sum += rss[i]
				# The peak: VmHWM, the most this process ever held.
				f = "/proc/" pid[i] "/status"
				while ((getline l < f) > 0) if (l ~ /^VmHWM:/) { split(l, a, " "); hwm += a[2] }
				close(f)
			}
			print sum + 0, hwm + 0
		}'
}

# measure LAUNCHER N: the launcher's KB once N ranks run and its peak KB,
# or "- -".
measure() {
	local mark="3$RANDOM.5" n=0
	start "$1" "$2" "$mark"
	for ((i = 0; i < 600; i++)); do
		n=$(pgrep -c -x -f "sleep $mark" || true)
		((n >= $2)) && break
		sleep 0.1
	done
	local kb="- -"
	if ((n >= $2)); then
		sleep 0.5 # let the launcher settle once every rank runs
		kb=$(treerss "$root" "$mark")
	fi
	kill -TERM "$root" 2>/dev/null || true
	wait "$root" 2>/dev/null || true
	pkill -x -f "sleep $mark" 2>/dev/null || true
	root=""
	echo "$kb"
}

printf '%-6s %-8s %-6s %10s %10s  %s\n' ranks launcher round rss_KB peak_KB load1
IFS=, read -ra sizes <<<"$SIZES"
for n in "${sizes[@]}"; do
	for ((r = 1; r <= ROUNDS; r++)); do
		for l in "${launchers[@]}"; do
			read -r kb peak < <(measure "$l" "$n")
			printf '%-6s %-8s %-6s %10s %10s  %s\n' "$n" "$l" "$r" "$kb" "$peak" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$tmp/rows"
		done
	done
done
echo
median() { # launcher, ranks[, column: 4 resident, 5 peak]
	awk -v l="$1" -v n="$2" -v c="${3:-4}" '$1==n && $2==l && $c!="-" {print $c}' "$tmp/rows" | sort -g |
		awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "-"}'
}
lo=${sizes[0]} hi=${sizes[-1]}
for col in 4 5; do
	what="resident once every rank runs"
	((col == 5)) && what="peak (VmHWM)"
	echo "medians (KB), $what, and the slope from $lo to $hi ranks (KB per rank):"
	for l in "${launchers[@]}"; do
		line=$(printf '%-8s' "$l")
		for n in "${sizes[@]}"; do line+=$(printf ' %6s@%-5s' "$(median "$l" "$n" "$col")" "$n"); done
		a=$(median "$l" "$lo" "$col") b=$(median "$l" "$hi" "$col")
		if [[ $a != - && $b != - ]]; then
			line+=$(awk -v a="$a" -v b="$b" -v lo="$lo" -v hi="$hi" 'BEGIN{printf "  %.1f KB/rank", (b-a)/(hi-lo)}')
		fi
		echo "$line"
	done
done
