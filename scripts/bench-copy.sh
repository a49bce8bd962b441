#!/usr/bin/env bash
# scripts/bench-copy.sh — a copy inside the mount: on the memory node
# (copy_file_range, what `cp` and `cat` use) against the same copy through
# read and write (`dd bs=1M`, which does not use copy_file_range: every byte
# through the daemon and over the transport twice).
#
# Starts a memory node on 127.0.0.1 (tcp, region of SIZE, 4G), mounts dkvfs on
# it with transport=tcp, writes one FILE_MB (1024) MiB file of random bytes and
# syncs it, then copies it ROUNDS (3) times each way, alternating, each copy
# synced and then removed.  For each copy it reads the daemon's transport
# counters (.dkvfs/stats net_bytes_sent + net_bytes_recv) before and after:
#
#   RESULT bench=copy way=node|readwrite round=N s=.. mb_per_s=.. wire_mb=.. wire_ratio=..
#   RESULT bench=copy_summary node_s=.. readwrite_s=.. speedup=.. node_wire_ratio=..
#
# (best round each way; wire_ratio = bytes on the wire / file bytes).  Both
# copies are checked against the source.  Environment: BUILD (build), SIZE,
# FILE_MB, ROUNDS, DIR.  Cleans up on exit.
set -uo pipefail
BUILD=${BUILD:-build}
SIZE=${SIZE:-4G}
FILE_MB=${FILE_MB:-1024}
ROUNDS=${ROUNDS:-3}
DIR=${DIR:-$(mktemp -d /tmp/dkvfs-copy.XXXXXX)}
MNT=$DIR/mnt
. "$(dirname "$0")/tcp-mount.sh"
tcp_mount_start
head -c $((FILE_MB << 20)) /dev/urandom >"$MNT/src" && sync "$MNT/src" || exit 1
bytes=$((FILE_MB << 20))

one() { # way round
	local w0 t0 t1 w1
	w0=$(wire)
	t0=$(date +%s.%N)
	if [ "$1" = node ]; then
		cp "$MNT/src" "$MNT/dst" || exit 1
	else
		dd if="$MNT/src" of="$MNT/dst" bs=1M status=none || exit 1
	fi
	sync "$MNT/dst"
	t1=$(date +%s.%N)
	w1=$(wire)
	cmp -s "$MNT/src" "$MNT/dst" || { echo "the $1 copy differs" >&2; exit 1; }
	rm "$MNT/dst"
	awk -v way="$1" -v r="$2" -v t="$(echo "$t1 - $t0" | bc)" -v w="$((w1 - w0))" \
		-v b="$bytes" 'BEGIN {
		printf "RESULT bench=copy way=%s round=%d s=%.3f mb_per_s=%.0f wire_mb=%.1f wire_ratio=%.4f\n",
			way, r, t, b / 1048576 / t, w / 1048576, w / b }'
}

for r in $(seq "$ROUNDS"); do
	one node "$r"
	one readwrite "$r"
	sleep 2 # the freed extents come back after the next sync
done | tee "$DIR/results"
awk '/way=node/ { split($5, a, "="); if (!n || a[2] < n) n = a[2]; split($8, c, "="); nw = c[2] }
     /way=readwrite/ { split($5, a, "="); if (!rw || a[2] < rw) rw = a[2] }
     END { printf "RESULT bench=copy_summary node_s=%.3f readwrite_s=%.3f speedup=%.2f node_wire_ratio=%s\n",
		n, rw, rw / n, nw }' "$DIR/results"
