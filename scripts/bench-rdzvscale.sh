#!/usr/bin/env bash
# In-process formation of host-leader worlds (bench/rdzvscale -form-only):
# medians of ROUNDS runs per size, of the wall time and of the process's CPU
# time during formation (which the machine's load moves much less), with
# the 1-minute load average, peak memory and live heap per member once
# formed (after a GC: what each member costs while the world lives) of each
# run, and, when ANCHOR
# names a revision, that revision's
# rendezvous package built the same way and run interleaved with this tree,
# with the ratio of the medians. The machine may be shared: the load column
# says how much, and the lag column how late the process ran its
# goroutines; a run that fails prints its error (at 4,096 ranks in one
# process, the formation timeout with hosts whose leaders gossip declared
# dead when the cores are starved).
#
#   SIZES=1024,4096 ROUNDS=3 PER=16 ANCHOR=main scripts/bench-rdzvscale.sh
#
# ARGS passes more flags to every run (e.g. ARGS='-formation-timeout 2m').
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-64,256,1024,4096}
ROUNDS=${ROUNDS:-3}
PER=${PER:-16}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/new" ./bench/rdzvscale
bins=(new)
if [[ -n "${ANCHOR:-}" ]]; then
	mkdir "$tmp/anchor-src"
	git archive "$ANCHOR" | tar -x -C "$tmp/anchor-src"
	# The anchor's library under this tree's driver (which has -form-only).
	cp bench/rdzvscale/main.go "$tmp/anchor-src/bench/rdzvscale/main.go"
	(cd "$tmp/anchor-src" && go build -o "$tmp/anchor" ./bench/rdzvscale)
	bins=(anchor new)
fi
printf '%-6s %-7s %-6s %10s %8s %8s %8s %10s %12s  %s\n' size build round formation cpu lag load1 maxrss_MB heap_KB/mem note
IFS=, read -ra sizes <<<"$SIZES"
for n in "${sizes[@]}"; do
	for ((i = 1; i <= ROUNDS; i++)); do
		for b in "${bins[@]}"; do
			out=$( { /usr/bin/time -f 'RSS %M' "$tmp/$b" -sizes "$n" -mode hier -per "$PER" -form-only ${ARGS:-} 2>&1 || true; } | tail -3)
			load=$(cut -d' ' -f1 /proc/loadavg)
			rss=$(sed -n 's/^RSS \([0-9]*\)$/\1/p' <<<"$out")
			row=$(grep -E "^$n " <<<"$out" || true)
			f=$(awk '{print $4}' <<<"$row")
			c=$(awk '{print $5}' <<<"$row")
			lag=$(awk '{print $6}' <<<"$row")
			h=$(awk '{print $10}' <<<"$row")
			note=""
			if [[ "$f" == "-" || -z "$f" ]]; then
				note=$(awk '{$1=$2=$3=$4=$5=$6=""; sub(/^ +/, ""); print}' <<<"$row")
				h=-
			fi
			[[ -z "$row" ]] && note=$(tail -1 <<<"$out")
			printf '%-6s %-7s %-6s %10s %8s %8s %8s %10s %12s  %s\n' "$n" "$b" "$i" "${f:--}" "${c:--}" "${lag:--}" "$load" "$(( ${rss:-0} / 1024 ))" "${h:--}" "$note" | tee -a "$tmp/rows"
		done
	done
done
echo
echo "medians (failed runs excluded; n = runs that formed; cpu = the process's CPU time during formation):"
median() { # column, size, build: the lower median of that column over the runs that formed
	awk -v col="$1" -v n="$2" -v b="$3" '$1==n && $2==b && $4!="-" {v=$col; sub("s","",v); print v}' "$tmp/rows" | sort -g |
		awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "-"}'
}
for n in "${sizes[@]}"; do
	line="$n:"
	declare -A med=() cpu=()
	for b in "${bins[@]}"; do
		med[$b]=$(median 4 "$n" "$b")
		cpu[$b]=$(median 5 "$n" "$b")
		k=$(awk -v n="$n" -v b="$b" '$1==n && $2==b && $4!="-"' "$tmp/rows" | grep -c . || true)
		mem=$(awk -v n="$n" -v b="$b" '$1==n && $2==b {print $8}' "$tmp/rows" | sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}')
		heap=$(awk -v n="$n" -v b="$b" '$1==n && $2==b && $9!="-" {v=$9; sub("KB","",v); print v}' "$tmp/rows" | sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]; else print "-"}')
		line+=" $b ${med[$b]}s cpu ${cpu[$b]}s rss ${mem}MB heap/member ${heap}KB (n=$k/$ROUNDS);"
	done
	if [[ -n "${ANCHOR:-}" && ${med[anchor]} != - && ${med[new]} != - ]]; then
		line+=" new/anchor formation $(awk -v a="${med[anchor]}" -v b="${med[new]}" 'BEGIN{printf "%.2f", b/a}')"
		line+=", cpu $(awk -v a="${cpu[anchor]}" -v b="${cpu[new]}" 'BEGIN{if (a > 0) printf "%.2f", b/a; else print "-"}')"
	fi
	echo "$line"
	unset med cpu
done
