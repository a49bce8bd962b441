#!/usr/bin/env bash
# scripts/bench-requests.sh — FUSE requests the kernel sends per file for the
# steps users feel (issue 12: "fewer kernel round trips per operation").
# Mounts dkvfs in the foreground with libfuse's -d (which prints every
# request), runs each step on N files in one directory, and counts the
# requests by opcode from the daemon's output:
#
#   RESULT bench=requests step=STEP files=N per_file=R LOOKUP=.. GETATTR=.. ...
#
# Steps: create (`touch` of N new names), ls_l (`ls -l` of them, cold),
# cat_cold (cat of each after the kernel dropped its caches), cat_warm (the
# same again), rm (`rm -rf` of the directory, cold).  per_file is all
# requests of the step over N.  -d slows every request, so the step's time
# means nothing here; scripts/bench-fs.sh times the same steps without it.
#
# Run as root (drop_caches).  Environment: BUILD (build), N (2000),
# DKVFS_OPTS (extra -o options, e.g. entry_timeout=1,attr_timeout=1 to see
# the old defaults), STEP_LIMIT (seconds per step, 300).  Unmounts and
# removes its directories, also on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
N=${N:-2000}
DKVFS_OPTS=${DKVFS_OPTS-}
STEP_LIMIT=${STEP_LIMIT:-300}
DKVFS=$BUILD/dkvfs
BENCH=bench-requests
. "$(dirname "$0")/bench-lib.sh"
bl_setup bench-requests
mkdir -p "$BASE/data"
mount_it() { bl_mount "$BASE/d.log" -d -o "data_dir=$BASE/data${DKVFS_OPTS:+,$DKVFS_OPTS}"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# step NAME COMMAND...: run it, count the requests it caused
step() {
	local name=$1
	shift
	cold_first=${cold_first:-0}
	[ "$cold_first" = 1 ] && cold
	local from
	from=$(wc -l <"$BASE/d.log")
	tmo "$@" >/dev/null || die "step $name failed"
	sleep 0.5 # RELEASE and FORGET come after the syscalls return
	tail -n +"$((from + 1))" "$BASE/d.log" | grep -a -o 'opcode: [A-Z_]*' | awk -v s="$name" -v n="$N" '
		{ c[$2]++; t++ }
		END {
			line = sprintf("RESULT bench=requests step=%s files=%d per_file=%.2f", s, n, t / n)
			for (k in c) line = line sprintf(" %s=%d", k, c[k])
			print line
		}'
}

mount_it
mkdir "$MNT/d" || die "mkdir failed"
cold_first=0 step create sh -c "cd '$MNT/d' && seq -f f%06.0f $N | xargs touch"
cold_first=0 step write sh -c "cd '$MNT/d' && for f in \$(seq -f f%06.0f $N); do echo data > \$f; done"
# a fresh mount: the kernel has seen none of the names
bl_unmount
mount_it
cold_first=1 step ls_l ls -l "$MNT/d"
cold_first=1 step cat_cold sh -c "cd '$MNT/d' && find . -type f | xargs cat"
cold_first=0 step cat_warm sh -c "cd '$MNT/d' && find . -type f | xargs cat"
cold_first=1 step rm rm -rf "$MNT/d"
