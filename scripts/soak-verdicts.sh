#!/usr/bin/env bash
# soak-verdicts.sh: no false "frozen/lost" verdict under load, and true
# ones still in time (notes/verdicts.md).
#
# For SOAK_SECS (default 600) it holds the machine loaded — SOAK_HOGS busy
# loops (default 40, load >= 40 on 2 cores) and a memory churner touching
# SOAK_MEM_MB (default 3072) — and runs healthy jobs back to back:
#   trainer  the Go trainer, 4, 8 and 16 ranks in turn
#   torch    examples/torch/ddp.py on the gorun backend, 4 ranks (needs
#            torch in $PYTHON and bin/libgorun.so)
#   mpich    MPICH's checks (tests/mpi/testdata/mpiprog.c check: Allreduce,
#            Bcast, Comm_split, a ring), 8 ranks (needs mpicc.mpich)
#   hosts    the Go trainer across 2 namespace hosts (tests/testhosts), 2
#            ranks each (needs root; SOAK_HOSTS=0 leaves it out)
# Every healthy job must exit 0 within 300 s: one that fails is a false
# verdict (or, exit 124, too slow), and its last lines are printed. Meanwhile a probe job (the trainer, 4 ranks) has
# rank 2 SIGSTOPped or SIGKILLed in turn, and gorun must end naming it
# within 10 s (stopped) or 2 s (killed): the time from the signal to the
# first line of the job (a survivor's error, or gorun's) that names rank 2.
# With the namespace hosts, a third probe cuts the link of the second host of
# a 2-host trainer on hosts of its own (its interface down, as a pulled
# cable; the healthy jobs' hosts are not touched) and gorun must
# name that host or its network within the lease and a second (5 s): the
# time from the cut to the first line naming the host as lost.
#
# It prints one line per job kind (jobs, failures), the probes' detection
# times (median, max), the load average seen (median, min), and exits 1 on
# any false verdict or late probe. Run it alone (make soak-verdicts takes
# the bench lock): it loads every core on purpose.
set -u
cd "$(dirname "$0")/.."
SECS=${SOAK_SECS:-600}
HOGS=${SOAK_HOGS:-40}
MEM_MB=${SOAK_MEM_MB:-3072}
PY=${PYTHON:-/root/.cache/gorun/venv/bin/python}
GORUN=bin/gorun
out=$(mktemp -d /tmp/gorun-soak.XXXXXX)
bg=()
cleanup() {
	for p in "${bg[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	if [ -n "${SOAK_KEEP:-}" ]; then echo "soak: kept $out"; else rm -rf "$out"; fi
}
trap cleanup EXIT

# Namespace hosts for the "hosts" kind and the link-cut probe.
hostset=""
if [ "${SOAK_HOSTS:-1}" != 0 ] && [ "$(id -u)" = 0 ]; then
	hostset=soak$(($$ % 1000))
	if tests/testhosts/netns-up.sh 4 "$hostset" --owner $$ >"$out/hosts.env" 2>"$out/hosts.err"; then
		HOSTS=$(sed -n 's/^HOSTS=//p' "$out/hosts.env")
		SSH_CONFIG=$(sed -n 's/^SSH_CONFIG=//p' "$out/hosts.env")
		read -r -a hostv <<<"$HOSTS"
		# Healthy jobs on hosts 1 and 2, the link-cut probe on 3 and 4
		# (the trainer wants a power of two of ranks).
		hostarg="${hostv[0]}:2,${hostv[1]}:2"
		cutarg="${hostv[2]}:2,${hostv[3]}:2"
	else
		echo "soak: namespace hosts not made ($(tail -1 "$out/hosts.err")); hosts jobs and link cuts skipped"
		hostset=""
	fi
fi
downhosts() {
	if [ -n "$hostset" ]; then tests/testhosts/netns-down.sh "$hostset" >/dev/null 2>&1; fi
}
trap 'cleanup; downhosts' EXIT

kinds="trainer"
if [ -f bin/libgorun.so ] && "$PY" -c 'import torch' 2>/dev/null; then
	kinds="$kinds torch"
else
	echo "soak: torch jobs skipped: no bin/libgorun.so (make lib) or no torch in $PY"
fi
if [ -n "$hostset" ]; then kinds="$kinds hosts"; fi
if command -v mpicc.mpich >/dev/null && mpicc.mpich -O1 -o "$out/mpiprog" tests/mpi/testdata/mpiprog.c 2>"$out/mpicc.err"; then
	kinds="$kinds mpich"
else
	echo "soak: MPICH jobs skipped: no mpicc.mpich (Debian mpich, libmpich-dev)"
fi

end=$(($(date +%s) + SECS))
for _ in $(seq "$HOGS"); do
	sh -c 'while :; do :; done' &
	bg+=($!)
done
"$PY" -c "
b = bytearray($MEM_MB << 20)
while True:
    for i in range(0, len(b), 4096):
        b[i] = (b[i] + 1) & 255
" &
bg+=($!)

# job KIND NP CMD...: runs one healthy job, records "KIND NP RC SECS".
job() {
	local kind=$1 np=$2 t0 rc
	shift 2
	t0=$(date +%s.%N)
	"$GORUN" --timeout 300s -np "$np" "$@" >"$out/$kind.out" 2>"$out/$kind.err"
	rc=$?
	echo "$kind $np $rc $(echo "$(date +%s.%N) - $t0" | bc)" >>"$out/results"
	if [ "$rc" != 0 ]; then
		# A verdict is gorun's or a survivor's word that a rank was
		# lost, frozen or silent; anything else (the program's own
		# error, the 300 s bound) is a failure of another kind.
		local what="OTHER FAILURE (not a verdict)"
		if grep -qE 'lost|frozen|silent|unresponsive|no word from' "$out/$kind.err"; then
			what="FALSE VERDICT"
			echo "$kind" >>"$out/verdicts"
		fi
		{
			echo "== $what: $kind np=$np exit $rc at $(date +%T)"
			tail -5 "$out/$kind.err"
		} >>"$out/failures"
	fi
}

loop() {
	local kind=$1 i=0 nps
	while [ "$(date +%s)" -lt "$end" ]; do
		case $kind in
		trainer)
			nps=(4 8 16)
			np=${nps[$((i % 3))]}
			job trainer "$np" bin/trainer -steps 60
			;;
		torch) job torch 4 "$PY" examples/torch/ddp.py --steps 60 ;;
		mpich) job mpich 8 "$out/mpiprog" check ;;
		hosts) job hosts 4 --launch-agent "ssh -F $SSH_CONFIG" -H "$hostarg" "$PWD/bin/trainer" -steps 60 ;;
		esac
		i=$((i + 1))
	done
}

# stamp prefixes each line with the time it was read (Unix seconds): one
# process, no fork per line, so a loaded machine delays it little (and
# only ever makes a detection look later than it was).
stamp() {
	"$PY" -u -c '
import sys, time
for l in sys.stdin:
    sys.stdout.write("%.6f %s" % (time.time(), l))
'
}

# probe SIG: a 4-rank trainer, rank 2 signaled once every rank stepped;
# records "probe SIG SECS NAMED" (time from the signal to gorun's exit).
probe() {
	local sig=$1 g sp sup r2 t0 named
	rm -f "$out/probe.err" "$out/fifo"
	mkfifo "$out/fifo"
	stamp <"$out/fifo" >"$out/probe.err" &
	sp=$!
	"$GORUN" -np 4 bin/trainer -steps 1000000 >"$out/probe.out" 2>"$out/fifo" &
	g=$!
	while [ "$(date +%s)" -lt "$end" ]; do
		grep -q '^step 3 ' "$out/probe.out" 2>/dev/null && break
		sleep 0.2
	done
	r2=""
	for sup in $(pgrep -P "$g"); do
		for p in $(pgrep -P "$sup"); do
			if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=2'; then r2=$p; fi
		done
	done
	if [ -z "$r2" ]; then
		echo "probe $sig - no-rank-2" >>"$out/results"
		kill -9 "$g" 2>/dev/null
		wait "$g" "$sp" 2>/dev/null
		return
	fi
	t0=$(date +%s.%N)
	kill -"$sig" "$r2"
	wait "$g" "$sp"
	# The verdict, not a stall diagnosis ("rank 2 does not answer"): a
	# survivor's "rank 2 (host H) lost: ..." or gorun's line on rank 2.
	named=$(awk -v t0="$t0" '$1 >= t0 && (/ rank 2 \(host [^)]*\) lost/ || /gorun: rank 2 \(host /) {print $1 - t0; exit}' "$out/probe.err")
	if [ -n "$named" ]; then
		echo "probe $sig $named yes" >>"$out/results"
	else
		echo "probe $sig 999 no" >>"$out/results"
		{
			echo "== probe SIG$sig: rank 2 never named"
			tail -5 "$out/probe.err"
		} >>"$out/failures"
	fi
	kill -9 "$r2" 2>/dev/null
}

# cutprobe: a 2-host trainer (2 ranks each) on hosts 3 and 4; once every
# rank stepped, host 4's interface goes down; records "probe CUT SECS NAMED"
# (time from the cut to the first line naming that host as lost), then
# brings the link back.
cutprobe() {
	local g sp t0 named victim=${hostv[3]}
	rm -f "$out/cut.err" "$out/cutfifo"
	mkfifo "$out/cutfifo"
	stamp <"$out/cutfifo" >"$out/cut.err" &
	sp=$!
	"$GORUN" --launch-agent "ssh -F $SSH_CONFIG" -H "$cutarg" "$PWD/bin/trainer" -steps 1000000 >"$out/cut.out" 2>"$out/cutfifo" &
	g=$!
	while [ "$(date +%s)" -lt "$end" ]; do
		grep -q '^step 3 ' "$out/cut.out" 2>/dev/null && break
		sleep 0.2
	done
	t0=$(date +%s.%N)
	ip -n "$victim" link set eth0 down
	# gorun ends by itself; past 60 s it is a hang, recorded as unnamed.
	( sleep 60; kill -9 "$g" 2>/dev/null ) &
	local guard=$!
	wait "$g" "$sp"
	kill "$guard" 2>/dev/null
	ip -n "$victim" link set eth0 up
	ip -n "$victim" route replace default via "$(sed -n 's/^BRIDGE_ADDR=//p' "$out/hosts.env")"
	named=$(awk -v t0="$t0" -v h="$victim" '$1 >= t0 && index($0, h) && /lost|network between|no word/ {print $1 - t0; exit}' "$out/cut.err")
	if [ -n "$named" ]; then
		echo "probe CUT $named yes" >>"$out/results"
	else
		echo "probe CUT 999 no" >>"$out/results"
		{
			echo "== probe CUT: host $victim never named"
			tail -5 "$out/cut.err"
		} >>"$out/failures"
	fi
}

for k in $kinds; do
	loop "$k" &
	bg+=($!)
done
(
	while [ "$(date +%s)" -lt "$end" ]; do
		cut -d' ' -f1 /proc/loadavg >>"$out/load"
		sleep 10
	done
) &
bg+=($!)
n=0
while [ "$(date +%s)" -lt "$((end - 30))" ]; do
	sleep 30
	case $((n % 3)) in
	0) probe STOP ;;
	1) probe KILL ;;
	2) if [ -n "$hostset" ]; then cutprobe; else probe STOP; fi ;;
	esac
	n=$((n + 1))
done
while [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
# The job loops end after their current job.
for p in "${bg[@]:0:$((HOGS + 1))}"; do kill -9 "$p" 2>/dev/null; done
wait "${bg[@]:$((HOGS + 1))}" 2>/dev/null

bad=0
echo "soak-verdicts: $SECS s, $HOGS CPU hogs + ${MEM_MB} MiB churner on $(nproc) cores"
sort -n "$out/load" | awk '{a[NR]=$1} END {if (NR) printf "load average (1 min): median %s, min %s, max %s (%d samples)\n", a[int((NR+1)/2)], a[1], a[NR], NR}'
for k in $kinds; do
	v=$(grep -cx "$k" "$out/verdicts" 2>/dev/null)
	awk -v k="$k" -v v="${v:-0}" '$1==k {n++; if ($3!=0) f++} END {printf "%-8s %3d jobs, %d failed: %d false verdicts, %d other failures\n", k, n, f+0, v, f-v}' "$out/results"
	f=$(awk -v k="$k" '$1==k && $3!=0' "$out/results" | wc -l)
	bad=$((bad + f))
done
for sig in STOP KILL CUT; do
	limit=10
	[ $sig = KILL ] && limit=2
	[ $sig = CUT ] && limit=5
	awk -v s="$sig" '$1=="probe" && $2==s {print $3, $4}' "$out/results" | sort -n | awk -v s="$sig" -v lim="$limit" '
		{n++; t[n]=$1; if ($1>lim || $2!="yes") late++}
		END {name = (s == "CUT" ? "link cut" : "SIG" s)
		if (!n) {printf "probe %s: none ran\n", name; exit}
		printf "probe %s: %d runs, named in median %.2f s, max %.2f s (limit %d s), %d late or unnamed\n", name, n, t[int((n+1)/2)], t[n], lim, late+0}'
	l=$(awk -v s="$sig" -v lim="$limit" '$1=="probe" && $2==s && ($3>lim || $4!="yes")' "$out/results" | wc -l)
	bad=$((bad + l))
done
if [ -s "$out/failures" ]; then cat "$out/failures"; fi
[ "$bad" = 0 ]
