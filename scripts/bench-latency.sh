#!/usr/bin/env bash
# scripts/bench-latency.sh — where the time of a create or a remove goes:
# the daemon's share and the kernel's plus the tool's, per FUSE opcode, for
# dkvfs (default, and with -o spin_us=0) against libfuse's `passthrough`
# example over /dev/shm.  issue 12's create and remove goals sit at the
# kernel's request floor (docs/bench-fs.md); this shows what each request
# costs on each side.
#
# Steps, each cold (the kernel's caches dropped first):
#   rm    rm -rf of NSMALL files of 4 KiB in NSMALL/100 directories, traced
#         with the kernel's FUSE tracepoints (perf record -e
#         fuse:fuse_request_send,fuse:fuse_request_end -a), then again
#         untraced, timed:
#           LAT side=S step=rm op=OP n=N daemon_p50_us=.. daemon_mean_us=.. before_p50_us=.. before_mean_us=..
#           RESULT bench=latency side=S step=rm files=N ms=..
#         daemon_*: from the request's send to its end (the daemon's answer,
#         including waking it); before_*: from the previous request's end to
#         this one's send (waking the tool, the tool's own work, the kernel).
#   bulk  BULK_JOBS (4) parallel `cp -r` of NBULK empty files (1,000 per
#         directory), untraced, with the daemon's CPU time (utime + stime):
#           RESULT bench=latency side=S step=bulk files=N files_per_sec=.. daemon_cpu_ms=..
#
# Sides: dkvfs (embedded node in /dev/shm), dkvfs_spin0 (-o spin_us=0),
# passthrough.  Run as root; needs perf (Debian's linux-perf) for the rm
# step's LAT lines (without it they are left out, and said so).
# Environment: BUILD (build), NSMALL (20000), NBULK (100000), BULK_JOBS (4),
# STEP_LIMIT (300 s per step).  Unmounts and removes what it made, also on
# failure or ^C.  About 2 minutes at the defaults.
set -uo pipefail
BUILD=${BUILD:-build}
NSMALL=${NSMALL:-20000}
NBULK=${NBULK:-100000}
BULK_JOBS=${BULK_JOBS:-4}
STEP_LIMIT=${STEP_LIMIT:-300}
DKVFS=$BUILD/dkvfs
BENCH=bench-latency
. "$(dirname "$0")/bench-lib.sh"
bl_setup bench-latency
PT=
PTPID=
cleanup_pt() {
	local rc=$?
	[ -n "$PT" ] && mountpoint -q "$PT" && fusermount3 -u "$PT"
	[ -n "$PT" ] && rmdir "$PT" 2>/dev/null
	(exit "$rc") # bl_cleanup exits with the status it finds
	bl_cleanup
}
trap cleanup_pt EXIT
command -v perf >/dev/null || echo "$BENCH: no perf (apt-get install linux-perf): no LAT lines" >&2
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
hz=$(getconf CLK_TCK)
cpu_ms() { awk -v hz="$hz" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$1/stat"; }

# the trees to copy in (in BASE, on /dev/shm)
SRC=$BASE/src
mkdir -p "$SRC/small" "$SRC/bulk" "$BASE/data" "$BASE/data0" "$BASE/ptback"
head -c 4096 /dev/urandom >"$BASE/f4k"
for ((d = 0; d < NSMALL / 100; d++)); do
	mkdir "$SRC/small/d$d"
	for ((f = 0; f < 100; f++)); do cp "$BASE/f4k" "$SRC/small/d$d/f$f"; done
done
for ((d = 0; d < NBULK / 1000; d++)); do
	mkdir "$SRC/bulk/b$d"
	(cd "$SRC/bulk/b$d" && seq -f 'k%06g' 0 999 | xargs touch)
done

# lat TRACE SIDE STEP: LAT lines from perf script output (one "OP d|b
# MICROSECONDS" line per request, sorted, then count, median and mean per
# opcode: mawk has no sort of its own)
lat() {
	awk '
	match($0, / [0-9]+\.[0-9]+: +fuse:fuse_request_(send|end): /) {
		split(substr($0, RSTART + 1, RLENGTH - 1), a, ":")
		t = a[1] + 0
		send = $0 ~ /fuse_request_send/
		if (!match($0, /req [0-9]+/)) next
		r = substr($0, RSTART + 4, RLENGTH - 4)
		if (send) {
			if (!match($0, /\((FUSE_[A-Z_]+)\)/)) next
			op = substr($0, RSTART + 1, RLENGTH - 2)
			sent[r] = t; sop[r] = op
			if (last_end) printf "%s b %.1f\n", op, (t - last_end) * 1e6
		} else if (r in sent) {
			printf "%s d %.1f\n", sop[r], (t - sent[r]) * 1e6
			delete sent[r]; last_end = t
		}
	}' "$1" | sort -k1,1 -k2,2 -k3,3g | awk -v side="$2" -v step="$3" '
	function out() {
		if (key == "") return
		med[key] = x[int((k + 1) / 2)]; mean[key] = sum / k; cnt[key] = k
	}
	{ if ($1 " " $2 != key) { out(); key = $1 " " $2; k = 0; sum = 0 }
	  x[++k] = $3; sum += $3 }
	END {
		out()
		for (kk in cnt) {
			split(kk, a, " ")
			if (a[2] != "d") continue
			b = a[1] " b"
			printf "LAT side=%s step=%s op=%s n=%d daemon_p50_us=%.1f daemon_mean_us=%.1f before_p50_us=%.1f before_mean_us=%.1f\n",
				side, step, a[1], cnt[kk], med[kk], mean[kk], med[b], mean[b]
		}
	}' | sort
}

# run_side SIDE DIR PID: the steps on one mounted side
run_side() {
	local side=$1 dir=$2 pid=$3 t0 t1 c0 c1
	tmo cp -r "$SRC/small" "$dir/small" || die "$side: cp -r failed"
	if command -v perf >/dev/null; then
		cold
		tmo perf record -q -o "$BASE/rm.data" -e fuse:fuse_request_send \
			-e fuse:fuse_request_end -a -- rm -rf "$dir/small" 2>/dev/null ||
			die "$side: rm -rf under perf failed"
		perf script -i "$BASE/rm.data" 2>/dev/null >"$BASE/rm.txt"
		lat "$BASE/rm.txt" "$side" rm
		tmo cp -r "$SRC/small" "$dir/small" || die "$side: cp -r failed"
	fi
	cold
	t0=$(now)
	tmo rm -rf "$dir/small" || die "$side: rm -rf failed"
	t1=$(now)
	awk -v s="$side" -v n="$NSMALL" -v a="$t0" -v b="$t1" \
		'BEGIN { printf "RESULT bench=latency side=%s step=rm files=%d ms=%.1f\n", s, n, (b - a) * 1000 }'
	mkdir -p "$dir/bulk"
	cold
	c0=$(cpu_ms "$pid")
	t0=$(now)
	(cd "$SRC/bulk" && ls | tmo xargs -P "$BULK_JOBS" -n 50 sh -c 'cp -r "$@" "$0"' "$dir/bulk/") ||
		die "$side: bulk cp -r failed"
	t1=$(now)
	c1=$(cpu_ms "$pid")
	awk -v s="$side" -v n="$((NBULK / 1000 * 1000))" -v a="$t0" -v b="$t1" -v c="$((c1 - c0))" \
		'BEGIN { printf "RESULT bench=latency side=%s step=bulk files=%d files_per_sec=%.1f daemon_cpu_ms=%d\n", s, n, n / (b - a), c }'
	tmo rm -rf "$dir/bulk" || die "$side: rm -rf of the bulk tree failed"
}

bl_mount "$BASE/dkvfs.log" -o "data_dir=$BASE/data"
run_side dkvfs "$MNT" "$DPID"
bl_unmount
bl_mount "$BASE/dkvfs0.log" -o "data_dir=$BASE/data0,spin_us=0"
run_side dkvfs_spin0 "$MNT" "$DPID"
bl_unmount
if [ -f "$BL_EX/passthrough.c" ] && bl_build_example passthrough "$BASE/passthrough" 2>"$BASE/pt.log"; then
	PT=$(mktemp -d /tmp/dkvfs-bench-latency-pt.XXXXXX)
	(cd "$BASE/ptback" && "$BASE/passthrough" "$PT") || die "passthrough did not mount"
	PTPID=$(pgrep -n -f "^$BASE/passthrough ") || die "passthrough's pid not found"
	run_side passthrough "$PT$BASE/ptback" "$PTPID"
else
	echo "$BENCH: libfuse's passthrough example not available: no passthrough side" >&2
fi
