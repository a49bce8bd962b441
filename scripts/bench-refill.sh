#!/usr/bin/env bash
# scripts/bench-refill.sh — can small files use the space that removed large
# files leave between the kept ones?
#
# Mounts dkvfs with an embedded memory node of SIZE (256M), backing file in
# DIR (a temp dir under /var/tmp), copies BIG_MB (1) MiB files of random bytes
# in until ENOSPC (at most MAX_BIG), removes every other one, waits WAIT (5)
# s, then copies SMALL_KB (4) KiB files into a new directory until ENOSPC (at
# most MAX_SMALL), and checks every kept large file byte for byte:
#
#   RESULT bench=refill big_files=.. removed=.. node_used_mb_full=..
#          node_used_mb_after_rm=.. punched_mb=.. small_files=..
#          node_used_mb_at_enospc=.. volume_full_events=.. big_bad=..
#
# small_files is the figure: the 4 KiB files that fit after the removal.
# On c4e6984 (before whole free pages inside blob slabs went back to the
# node) it was 1,868; with them back it is about 26,000 (docs/engine.md,
# "Extents").  Environment: BUILD (build), SIZE, BIG_MB, SMALL_KB, WAIT,
# MAX_BIG (400), MAX_SMALL (60000), DIR.  Bounded by MAX_BIG and MAX_SMALL;
# always unmounts and removes its directory, also on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
SIZE=${SIZE:-256M}
BIG_MB=${BIG_MB:-1}
SMALL_KB=${SMALL_KB:-4}
WAIT=${WAIT:-5}
MAX_BIG=${MAX_BIG:-400}
MAX_SMALL=${MAX_SMALL:-60000}
DIR=${DIR:-$(mktemp -d /var/tmp/dkvfs-refill.XXXXXX)}
MNT=$DIR/mnt
DATA=$DIR/data

cleanup() {
	fusermount3 -u -z "$MNT" 2>/dev/null
	timeout 20 flock "$DATA/lock" true 2>/dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
mkdir -p "$MNT" "$DATA" || exit 1

# a stat's value, 0 when this build has no such stat (an older one)
stat_of() {
	local v
	v=$(sed -n "s/^$1: //p" "$MNT/.dkvfs/stats")
	echo "${v:-0}"
}
node_mb() { echo $(( $(stat_of node_used) >> 20 )); }

"$BUILD/dkvfs" -o "data_dir=$DATA,memnode_size=$SIZE,log_file=$DATA/dkvfs.log" "$MNT" || exit 1
head -c $((BIG_MB << 20)) /dev/urandom > "$DIR/big" || exit 1
head -c $((SMALL_KB << 10)) /dev/urandom > "$DIR/small" || exit 1
mkdir "$MNT/d" "$MNT/s" || exit 1

n=0
while [ "$n" -lt "$MAX_BIG" ] && cp "$DIR/big" "$MNT/d/f$n" 2>/dev/null; do
	n=$((n + 1))
done
rm -f "$MNT/d/f$n" # the one that failed, if it exists
full=$(node_mb)
removed=0
for ((i = 0; i < n; i += 2)); do
	rm "$MNT/d/f$i" && removed=$((removed + 1))
done
sleep "$WAIT"
after=$(node_mb)
k=0
while [ "$k" -lt "$MAX_SMALL" ] && cp "$DIR/small" "$MNT/s/k$k" 2>/dev/null; do
	k=$((k + 1))
done
at_enospc=$(node_mb)
bad=0
for ((i = 1; i < n; i += 2)); do
	cmp -s "$DIR/big" "$MNT/d/f$i" || bad=$((bad + 1))
done
echo "RESULT bench=refill big_files=$n removed=$removed node_used_mb_full=$full" \
     "node_used_mb_after_rm=$after punched_mb=$(( $(stat_of extent_punched_bytes) >> 20 ))" \
     "small_files=$k node_used_mb_at_enospc=$at_enospc" \
     "volume_full_events=$(stat_of volume_full_events) big_bad=$bad"
