#!/usr/bin/env bash
# scripts/bench-bytes.sh — bytes on the wire per byte of file data written.
#
# Starts a memory node on 127.0.0.1 (tcp, region of SIZE, 3G), mounts dkvfs on
# it with transport=tcp (WAL on, the defaults otherwise), and `cp`s a FILE_MB
# (1024) MiB file of random bytes in, then `sync`s it.  The daemon's transport
# counters (.dkvfs/stats net_bytes_sent + net_bytes_recv) are read before and
# after, and again WAIT (20) s later to count the background work (flushes,
# compactions) the copy caused:
#
#   RESULT bench=bytes_per_file_byte file_mb=.. sent_mb=.. recv_mb=.. ratio=..
#          ratio_after_wait=.. cp_s=..
#
# ratio = (sent + recv) / file bytes; 1.0 is every byte once.  Environment:
# BUILD (build), SIZE, FILE_MB, WAIT, DIR.  Cleans up on exit.
set -uo pipefail
BUILD=${BUILD:-build}
SIZE=${SIZE:-3G}
FILE_MB=${FILE_MB:-1024}
WAIT=${WAIT:-20}
DIR=${DIR:-$(mktemp -d /tmp/dkvfs-bytes.XXXXXX)}
MNT=$DIR/mnt
. "$(dirname "$0")/tcp-mount.sh"
tcp_mount_start
head -c $((FILE_MB << 20)) /dev/urandom >"$DIR/src" || exit 1

w0=$(wire); s0=$(stat_of net_bytes_sent); r0=$(stat_of net_bytes_recv)
t0=$(date +%s.%N)
cp "$DIR/src" "$MNT/f" && sync "$MNT/f" || { echo "cp failed" >&2; exit 1; }
t1=$(date +%s.%N)
w1=$(wire); s1=$(stat_of net_bytes_sent); r1=$(stat_of net_bytes_recv)
sleep "$WAIT"
w2=$(wire)
cmp -s "$DIR/src" "$MNT/f" || { echo "the copy differs" >&2; exit 1; }
bytes=$((FILE_MB << 20))
awk -v b="$bytes" -v w1="$((w1 - w0))" -v w2="$((w2 - w0))" -v s="$((s1 - s0))" \
	-v r="$((r1 - r0))" -v t="$(echo "$t1 - $t0" | bc)" -v mb="$FILE_MB" 'BEGIN {
	printf "RESULT bench=bytes_per_file_byte file_mb=%d sent_mb=%.1f recv_mb=%.1f ratio=%.3f ratio_after_wait=%.3f cp_s=%.2f\n",
		mb, s / 1048576, r / 1048576, w1 / b, w2 / b, t }'
