#!/usr/bin/env bash
# scripts/bench-big.sh — one big file in and out, ROUNDS times on dkvfs and
# on libfuse's passthrough in turn, medians printed as
#
#   RESULT bench=big step=STEP mb=M rounds=R dkvfs_ms=M passthrough_ms=M ratio=X
#
# (ratio: dkvfs time over the passthrough's; below 1 is faster)
#
# Steps: cp (cp of a BIG_MB file from /dev/shm into a fresh directory),
# read (cat of it after a cache drop, same mount), read_remount (the same
# after unmounting and mounting both again).  bench-fs.sh has cp and read
# as one-shot steps; this repeats them and adds the remount, where the
# daemon has never touched the node's pages of the file.  Run as root.
# Environment: BUILD (build), BIG_MB (256), ROUNDS (5), DKVFS_OPTS,
# STEP_LIMIT (seconds per step, 300).  Unmounts and removes its
# directories, also on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
BIG_MB=${BIG_MB:-256}
ROUNDS=${ROUNDS:-5}
DKVFS_OPTS=${DKVFS_OPTS-}
STEP_LIMIT=${STEP_LIMIT:-300}
DKVFS=$BUILD/dkvfs
BENCH=bench-big
. "$(dirname "$0")/bench-lib.sh"
bl_setup bench-big
PT=$(mktemp -d /tmp/dkvfs-bench-big-pt.XXXXXX)
pt_cleanup() {
	mountpoint -q "$PT" 2>/dev/null && fusermount3 -u "$PT"
	rmdir "$PT" 2>/dev/null
	bl_cleanup
}
trap pt_cleanup EXIT
mkdir -p "$BASE/data" "$BASE/ptback"
bl_build_example passthrough "$BASE/passthrough" 2>"$BASE/pt-build.log" ||
	die "cannot build libfuse's passthrough: $(tail -1 "$BASE/pt-build.log")"
head -c $((BIG_MB << 20)) /dev/urandom >"$BASE/big"
PTROOT=$PT$BASE/ptback # the passthrough shows the whole root: work in ptback

mount_both() {
	bl_mount "$BASE/dkvfs.log" -o "data_dir=$BASE/data${DKVFS_OPTS:+,$DKVFS_OPTS}"
	(cd "$BASE/ptback" && "$BASE/passthrough" "$PT") || die "cannot mount the passthrough"
}
unmount_both() {
	bl_unmount
	fusermount3 -u "$PT" || die "cannot unmount the passthrough"
}
ms() { # CMD...: prints its ms
	local t0 t1
	t0=$(date +%s%N)
	tmo "$@" || die "$* failed"
	t1=$(date +%s%N)
	echo $(( (t1 - t0) / 1000000 ))
}
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

: >"$BASE/r.txt"
mount_both
for i in $(seq "$ROUNDS"); do
	for side in dkvfs pt; do
		dir=$MNT
		[ "$side" = pt ] && dir=$PTROOT
		rm -f "$dir/big"
		cold
		echo "cp $side $(ms cp "$BASE/big" "$dir/big")" >>"$BASE/r.txt"
		cold
		echo "read $side $(ms sh -c 'cat "$1" >/dev/null' _ "$dir/big")" >>"$BASE/r.txt"
	done
	unmount_both
	mount_both
	for side in dkvfs pt; do
		dir=$MNT
		[ "$side" = pt ] && dir=$PTROOT
		cold
		echo "read_remount $side $(ms sh -c 'cat "$1" >/dev/null' _ "$dir/big")" >>"$BASE/r.txt"
	done
	[ "$i" = 1 ] && { cmp -s "$BASE/big" "$MNT/big" || die "the file read back differs"; }
done
unmount_both
awk -v mb="$BIG_MB" -v r="$ROUNDS" '
	function med(a, k,   i, j, t) {
		for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
			t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
		}
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	{ n[$1 "," $2]++; v[$1 "," $2, n[$1 "," $2]] = $3 }
	END {
		split("cp read read_remount", steps, " ")
		for (s = 1; s <= 3; s++) {
			st = steps[s]
			for (x = 1; x <= n[st ",dkvfs"]; x++) d[x] = v[st ",dkvfs", x]
			for (x = 1; x <= n[st ",pt"]; x++) p[x] = v[st ",pt", x]
			md = med(d, n[st ",dkvfs"]); mp = med(p, n[st ",pt"])
			printf "RESULT bench=big step=%s mb=%d rounds=%d dkvfs_ms=%d passthrough_ms=%d ratio=%.3f\n",
				st, mb, r, md, mp, md / mp
		}
	}' "$BASE/r.txt"
