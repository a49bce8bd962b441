#!/usr/bin/env bash
# scripts/bench-fuse-api.sh — what libfuse's high-level API costs against its
# low-level one, for the decision issue 12 asks for ("measure whether
# libfuse's high-level path tree and its lock cost enough to move to the
# low-level API").  dkvfs cannot be run both ways, so this runs libfuse's own
# two examples over the same tmpfs: `passthrough` (high-level, the API dkvfs
# uses) and `passthrough_ll` (low-level), both from
# /usr/share/doc/libfuse3-dev/examples, with the same caching (entry and
# attribute timeouts 0: passthrough sets them, passthrough_ll gets
# timeout=0,cache=auto), both multi-threaded.  The same steps run on each,
# caches dropped before each:
#
#   RESULT bench=fuse_api step=STEP files=N hl_ms=.. ll_ms=.. ll_vs_hl=.. hl_cpu_ms=.. ll_cpu_ms=..
#
# Steps: cp (cp -r of N files of 4 KiB in 20 directories), find (find
# -type f), ls_lR (ls -lR), rm (rm -rf).  *_cpu_ms is the example daemon's
# CPU time (user + system) during the step.  ll_vs_hl below 1 means the
# low-level example took less time.  Differences other than the API:
# passthrough_ll keeps an O_PATH fd per inode (so N is bounded by the open
# files limit) and always answers readdirplus with attributes, while
# passthrough uses the kernel's adaptive readdirplus.
#
# Run as root (drop_caches).  Environment: N (10000), ROUNDS (2),
# STEP_LIMIT (seconds per step, 300).  Unmounts and removes its directories,
# also on failure or ^C.
set -uo pipefail
N=${N:-10000}
ROUNDS=${ROUNDS:-2}
STEP_LIMIT=${STEP_LIMIT:-300}
BENCH=bench-fuse-api
. "$(dirname "$0")/bench-lib.sh" # die, tmo, bl_build_example
[ "$(id -u)" = 0 ] || die "run as root (it drops the kernel's caches)"
if [ ! -f "$BL_EX/passthrough.c" ] || [ ! -f "$BL_EX/passthrough_ll.c" ]; then
	die "libfuse's examples are not in $BL_EX (apt-get install libfuse3-dev)"
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null
[ "$(ulimit -n)" -gt $((N + 1000)) ] || die "N=$N needs more open files than $(ulimit -n) (passthrough_ll keeps one per inode)"

BASE=$(mktemp -d /dev/shm/dkvfs-fuse-api.XXXXXX)
HL=$(mktemp -d /tmp/dkvfs-fuse-api-hl.XXXXXX)
LL=$(mktemp -d /tmp/dkvfs-fuse-api-ll.XXXXXX)
cleanup() {
	local m
	for m in "$HL" "$LL"; do
		mountpoint -q "$m" 2>/dev/null && { fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m"; }
		rmdir "$m" 2>/dev/null
	done
	rm -rf "$BASE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$BASE/hlback" "$BASE/llback" "$BASE/src"
bl_build_example passthrough "$BASE/passthrough" || die "cannot build passthrough"
bl_build_example passthrough_ll "$BASE/passthrough_ll" || die "cannot build passthrough_ll"
(cd "$BASE/hlback" && "$BASE/passthrough" "$HL") || die "passthrough did not mount"
"$BASE/passthrough_ll" -o "source=$BASE/llback,timeout=0,cache=auto" "$LL" || die "passthrough_ll did not mount"
HLPID=$(pgrep -f "^$BASE/passthrough $HL") || die "no passthrough process"
LLPID=$(pgrep -f "^$BASE/passthrough_ll ") || die "no passthrough_ll process"
HLROOT=$HL$BASE/hlback # passthrough shows the whole root

per_dir=$(( (N + 19) / 20 ))
for d in $(seq -w 1 20); do
	mkdir -p "$BASE/src/d$d"
	head -c $((per_dir * 4096)) /dev/urandom | (cd "$BASE/src/d$d" && split -b 4096 -a 5 - f)
done
n=$(find "$BASE/src" -type f | wc -l)

cpu_ms() { awk '{ print ($14 + $15) * 10 }' "/proc/$1/stat"; }
cold() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
	cp --version >/dev/null; find / -maxdepth 0 >/dev/null; ls / >/dev/null; rm --version >/dev/null
	sleep 1 # let the FORGETs of the drop reach the daemons before the clock starts
}
# one PID CMD...: "ms cpu_ms" of CMD, timed cold
one() {
	local pid=$1 t0 t1 c0
	shift
	cold
	c0=$(cpu_ms "$pid")
	t0=$(date +%s%N)
	tmo "$@" >/dev/null || die "failed: $*"
	t1=$(date +%s%N)
	echo "$(( (t1 - t0) / 1000000 )) $(( $(cpu_ms "$pid") - c0 ))"
}
# step NAME HL-CMD... @ LL-CMD...: "NAME hl_ms hl_cpu ll_ms ll_cpu"
step() {
	local name=$1 hlcmd=() hl ll
	shift
	while [ "$1" != @ ]; do hlcmd+=("$1"); shift; done
	shift
	hl=$(one "$HLPID" "${hlcmd[@]}") || exit 1
	ll=$(one "$LLPID" "$@") || exit 1
	echo "$name $hl $ll"
}
for ((r = 1; r <= ROUNDS; r++)); do
	{
		step cp cp -r "$BASE/src" "$HLROOT/t" @ cp -r "$BASE/src" "$LL/t" &&
		step find find "$HLROOT/t" -type f @ find "$LL/t" -type f &&
		step ls_lR ls -lR "$HLROOT/t" @ ls -lR "$LL/t" &&
		step rm rm -rf "$HLROOT/t" @ rm -rf "$LL/t"
	} >>"$BASE/raw" || die "round $r failed"
	echo "# round $r done at $(date +%T)" >&2
done
# the median of each column over the rounds (the lower middle for an even count)
med() { grep "^$1 " "$BASE/raw" | awk -v c="$2" '{ print $c }' | sort -n | sed -n "$(( (ROUNDS + 1) / 2 ))p"; }
for s in cp find ls_lR rm; do
	awk -v s="$s" -v n="$n" -v h="$(med "$s" 2)" -v hc="$(med "$s" 3)" -v l="$(med "$s" 4)" -v lc="$(med "$s" 5)" 'BEGIN {
		printf "RESULT bench=fuse_api step=%s files=%d hl_ms=%d ll_ms=%d ll_vs_hl=%.3f hl_cpu_ms=%d ll_cpu_ms=%d\n",
			s, n, h, l, l / (h > 0 ? h : 1), hc, lc }'
done
