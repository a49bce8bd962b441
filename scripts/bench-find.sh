#!/usr/bin/env bash
# scripts/bench-find.sh — the cold `find -type f` of bench-fs.sh's fs_find,
# timed ROUNDS times on dkvfs and on libfuse's passthrough in turn, so that
# a change of a few milliseconds shows through this VM's noise (one fs_find
# step of bench-fs.sh moved between 0.9x and 1.5x the passthrough for the
# same build).  Before each find the kernel drops its caches.  Prints
#
#   RESULT bench=find files=N rounds=R dkvfs_ms=M passthrough_ms=M ratio=X pair_ratio=X daemon_cpu_ms=C
#
# ms are medians; ratio is their quotient, pair_ratio the median of the
# per-round quotients; daemon_cpu_ms the dkvfs daemon's CPU time (user +
# system, /proc/PID/stat) per find, the steadiest of the figures.  Run as root.  Environment: BUILD (build), NSMALL
# (20000 files of 4 KiB in 20 directories), ROUNDS (12), DKVFS_OPTS,
# STEP_LIMIT (seconds per step, 300).  Unmounts and removes its directories,
# also on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
NSMALL=${NSMALL:-20000}
ROUNDS=${ROUNDS:-12}
DKVFS_OPTS=${DKVFS_OPTS-}
STEP_LIMIT=${STEP_LIMIT:-300}
DKVFS=$BUILD/dkvfs
BENCH=bench-find
. "$(dirname "$0")/bench-lib.sh"
bl_setup bench-find
PT=$(mktemp -d /tmp/dkvfs-bench-find-pt.XXXXXX)
pt_cleanup() {
	mountpoint -q "$PT" 2>/dev/null && fusermount3 -u "$PT"
	rmdir "$PT" 2>/dev/null
	bl_cleanup
}
trap pt_cleanup EXIT
mkdir -p "$BASE/data" "$BASE/src" "$BASE/ptback"
bl_mount "$BASE/dkvfs.log" -o "data_dir=$BASE/data${DKVFS_OPTS:+,$DKVFS_OPTS}"
bl_build_example passthrough "$BASE/passthrough" 2>"$BASE/pt-build.log" ||
	die "cannot build libfuse's passthrough: $(tail -1 "$BASE/pt-build.log")"
(cd "$BASE/ptback" && "$BASE/passthrough" "$PT") || die "cannot mount the passthrough"
PTROOT=$PT$BASE/ptback # the passthrough shows the whole root: work in ptback

per_dir=$(( (NSMALL + 19) / 20 ))
for d in $(seq -w 1 20); do
	mkdir -p "$BASE/src/d$d"
	head -c $((per_dir * 4096)) /dev/urandom | (cd "$BASE/src/d$d" && split -b 4096 -a 5 - f)
done
tmo cp -r "$BASE/src" "$MNT/small" || die "cp into dkvfs failed"
tmo cp -r "$BASE/src" "$PTROOT/small" || die "cp into the passthrough failed"
n=$(find "$BASE/src" -type f | wc -l)

cold_find() { # prints ms
	sync
	echo 3 >/proc/sys/vm/drop_caches
	# find and wc themselves back in memory: their pages were dropped too,
	# and reading them from disk is not what is measured
	find / -maxdepth 0 >/dev/null
	wc --version >/dev/null
	sleep 0.2
	local t0 t1 got
	t0=$(date +%s%N)
	got=$(tmo find "$1/small" -type f | wc -l)
	t1=$(date +%s%N)
	[ "$got" = "$n" ] || die "find on $1 saw $got files of $n"
	echo $(( (t1 - t0) / 1000 ))
}
cpu() { awk '{ print $14 + $15 }' "/proc/$DPID/stat"; }
d=() p=() c=0
for _ in $(seq "$ROUNDS"); do
	c0=$(cpu)
	d+=("$(cold_find "$MNT")")
	c=$(( c + $(cpu) - c0 ))
	p+=("$(cold_find "$PTROOT")")
done
tck=$(getconf CLK_TCK)
printf '%s\n' "${d[@]}" >"$BASE/d.txt"
printf '%s\n' "${p[@]}" >"$BASE/p.txt"
paste "$BASE/d.txt" "$BASE/p.txt" | awk -v n="$n" -v r="$ROUNDS" -v c="$c" -v tck="$tck" '
	function med(a, k,   i, j, t) {
		for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
			t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
		}
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	{ d[NR] = $1; p[NR] = $2; q[NR] = $1 / $2 }
	END {
		md = med(d, NR); mp = med(p, NR); mq = med(q, NR)
		printf "RESULT bench=find files=%d rounds=%d dkvfs_ms=%.1f passthrough_ms=%.1f ratio=%.3f pair_ratio=%.3f daemon_cpu_ms=%.1f\n",
			n, r, md / 1000, mp / 1000, md / mp, mq, c * 1000 / tck / r
	}'
