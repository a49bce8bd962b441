#!/usr/bin/env bash
# scripts/bench-names.sh — the daemon's memory per name the kernel has
# visited (issue 12: "bytes per cached inode").  Mounts dkvfs on an embedded
# node, copies in NFILES files of FILE_BYTES in NDIRS directories, mounts
# again (the data now in tables on the node, as after any restart), drops the
# kernel's caches (so every name is forgotten), then walks the tree with
# `find` and `ls -lR` and reads the daemon's /proc/PID/status:
#
#   RESULT bench=names names=N file_bytes=B anon_bytes_per_name=A mapped_bytes_per_name=M
#          anon_kept_bytes_per_name=K rss_anon_kib=... rss_shared_kib=...
#
#   A  private (anonymous) memory the walk added, per name: libfuse's
#      high-level path tree (one node per name the kernel holds) and the
#      daemon's own allocations
#   M  shared resident memory the walk added, per name (RssFile + RssShmem):
#      the memory node's region, mapped by the local transport (shared with
#      the node, which holds those pages anyway; not private to the daemon)
#   K  anonymous memory still held after the kernel dropped its caches
#      again and sent its FORGETs, per name, after ROUNDS walks (3): a figure
#      that grows with ROUNDS would be a leak
#
# Run as root (drop_caches).  Environment: BUILD (build), NFILES (20000),
# NDIRS (200), FILE_BYTES (4096: inline in the record, as bench-fs's small
# files; 0 for empty files), ROUNDS (3), STEP_LIMIT (seconds per step,
# 300).  Unmounts and removes its
# directories, also on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
NFILES=${NFILES:-20000}
NDIRS=${NDIRS:-200}
FILE_BYTES=${FILE_BYTES:-4096}
ROUNDS=${ROUNDS:-3}
STEP_LIMIT=${STEP_LIMIT:-300}
DKVFS=$BUILD/dkvfs
BENCH=bench-names
. "$(dirname "$0")/bench-lib.sh"
bl_setup bench-names
kib() { awk -v k="$1" '$1 == k ":" { print $2 }' "/proc/$DPID/status"; }
forget_all() { sync; echo 3 >/proc/sys/vm/drop_caches; sleep 2; }

mkdir -p "$BASE/src" "$BASE/data"
per=$(( (NFILES + NDIRS - 1) / NDIRS ))
for ((d = 0; d < NDIRS; d++)); do
	mkdir "$BASE/src/d$d"
	if [ "$FILE_BYTES" -gt 0 ]; then
		head -c $((per * FILE_BYTES)) /dev/urandom |
			(cd "$BASE/src/d$d" && split -b "$FILE_BYTES" -d -a 6 - f)
	else
		(cd "$BASE/src/d$d" && seq -f "f%.0f" 1 "$per" | xargs touch)
	fi
done
names=$(find "$BASE/src" -mindepth 1 | wc -l)

mount_it() { bl_mount "$BASE/dkvfs.log" -o "data_dir=$BASE/data"; }
mount_it
tmo cp -r "$BASE/src" "$MNT/t" || die "cp into the mount failed"
# Walk a volume as it is after any restart: its data in tables on the node,
# not in the memtable of the daemon that wrote it.
bl_unmount
mount_it

forget_all
anon0=$(kib RssAnon) file0=$(( $(kib RssFile) + $(kib RssShmem) ))
kept=()
for ((round = 0; round < ROUNDS; round++)); do
	tmo find "$MNT/t" >/dev/null || die "find failed"
	tmo ls -lR "$MNT/t" >/dev/null || die "ls -lR failed"
	if [ "$round" = 0 ]; then
		anon1=$(kib RssAnon) file1=$(( $(kib RssFile) + $(kib RssShmem) ))
	fi
	forget_all
	kept+=("$(kib RssAnon)")
done
anon2=${kept[-1]}
echo "# $names names; RssAnon KiB $anon0 -> $anon1 after the walk; after each round's FORGETs: ${kept[*]}; RssFile+RssShmem KiB $file0 -> $file1" >&2
awk -v n="$names" -v b="$FILE_BYTES" -v a0="$anon0" -v a1="$anon1" -v a2="$anon2" -v f0="$file0" -v f1="$file1" 'BEGIN {
	printf "RESULT bench=names names=%d file_bytes=%d anon_bytes_per_name=%.0f mapped_bytes_per_name=%.0f anon_kept_bytes_per_name=%.0f rss_anon_kib=%d rss_shared_kib=%d\n",
		n, b, (a1 - a0) * 1024 / n, (f1 - f0) * 1024 / n, (a2 - a0) * 1024 / n, a1, f1 }'
