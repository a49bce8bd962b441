#!/usr/bin/env bash
# scripts/bench-space.sh — does space come back after rm, on a mounted volume?
#
# Mounts dkvfs with an embedded memory node of SIZE (3G) whose backing file
# lives in DIR (a temp dir under /var/tmp, a real disk, so `du` shows what the
# node really holds), then ROUNDS (10) times writes one FILE_MB (1024) MiB file
# of random bytes and removes it.  After each round, and WAIT (30) s after the
# last one, it prints the volume's `df` use, the memory node's RSS and the
# backing file's allocated bytes, against the same figures of the empty
# volume measured first:
#
#   RESULT bench=space_round round=N write_ok=1 df_used_mb=.. rss_mb=.. file_mb=..
#   RESULT bench=space_after_wait df_used_mb=.. df_used_pct=.. rss_mb=.. file_mb=..
#          empty_df_used_mb=.. empty_rss_mb=.. empty_file_mb=.. enospc_rounds=..
#   RESULT bench=space_empty rss_kb=.. anon_kb=.. region_rss_kb=.. code_kb=.. file_kb=..
#   RESULT bench=space_warm_kb rss_kb=.. anon_kb=.. region_rss_kb=.. code_kb=.. file_kb=..
#   RESULT bench=space_after_wait_kb rss_kb=.. anon_kb=.. region_rss_kb=.. code_kb=.. file_kb=..
#
# (the _kb lines split the node's RSS into its anonymous memory and the
# region's resident pages: the empty volume's figures are a few MiB).
# space_warm_kb is the empty volume again, WAIT s after the first round: the
# node has then run its write, delete and compaction code once, and the RSS
# it gained by that (program and library pages touched for the first time,
# thread stacks, malloc's arena) is a fixed cost, not data.  Comparing the
# last round with it shows whether the node's memory follows live data.
#
# Environment: BUILD (build), SIZE, ROUNDS, FILE_MB, WAIT, DIR.  Always
# unmounts and removes its directory, also on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
SIZE=${SIZE:-3G}
ROUNDS=${ROUNDS:-10}
FILE_MB=${FILE_MB:-1024}
WAIT=${WAIT:-30}
DIR=${DIR:-$(mktemp -d /var/tmp/dkvfs-space.XXXXXX)}
MNT=$DIR/mnt
DATA=$DIR/data

cleanup() {
	fusermount3 -u -z "$MNT" 2>/dev/null
	timeout 20 flock "$DATA/lock" true 2>/dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
mkdir -p "$MNT" "$DATA" || exit 1

used_mb() { df -B1M --output=used "$MNT" | tail -1 | tr -d ' '; }
size_mb() { df -B1M --output=size "$MNT" | tail -1 | tr -d ' '; }
node_pid() { pgrep -f -- "--backing $DATA/region" | head -1; }
rss_mb() { awk '/VmRSS/ { printf "%d", $2 / 1024 }' /proc/"$(node_pid)"/status; }
file_mb() { echo $(( $(stat -c %b "$DATA/region") * 512 / 1048576 )); }
# KiB, for the comparison with the empty volume (a few MiB: whole MiB hide
# the difference): the node's RSS, its anonymous part (heap, thread arenas
# and stacks), the region's resident pages, the backing file's blocks
rss_kb() { awk '/VmRSS/ { print $2 }' /proc/"$(node_pid)"/status; }
anon_kb() { awk '/^Anonymous/ { print $2 }' /proc/"$(node_pid)"/smaps_rollup; }
region_kb() { awk -v r="$DATA/region" '/^[0-9a-f]+-/ { m = ($6 == r) } m && /^Rss/ { s += $2 }
	END { print s + 0 }' /proc/"$(node_pid)"/smaps; }
file_kb() { echo $(( $(stat -c %b "$DATA/region") / 2 )); }
# code_kb: the rest of the RSS, the program's and libraries' pages (it grows
# as code paths run for the first time, not with data)
kb_line() {
	local rss anon region
	rss=$(rss_kb) anon=$(anon_kb) region=$(region_kb)
	echo "rss_kb=$rss anon_kb=$anon region_rss_kb=$region code_kb=$((rss - anon - region))" \
	     "file_kb=$(file_kb)"
}

"$BUILD/dkvfs" -o "data_dir=$DATA,memnode_size=$SIZE" "$MNT" || exit 1
e_df=$(used_mb) e_rss=$(rss_mb) e_file=$(file_mb) e_kb=$(kb_line)
echo "empty volume: df ${e_df} MiB used of $(size_mb), node RSS ${e_rss} MiB, backing file ${e_file} MiB"
echo "RESULT bench=space_empty $e_kb"
head -c $((FILE_MB << 20)) /dev/urandom > "$DIR/src" || exit 1
enospc=0
for r in $(seq 1 "$ROUNDS"); do
	ok=1
	cp "$DIR/src" "$MNT/big" 2>/dev/null || { ok=0; enospc=$((enospc + 1)); }
	rm -f "$MNT/big"
	echo "RESULT bench=space_round round=$r write_ok=$ok df_used_mb=$(used_mb)" \
	     "rss_mb=$(rss_mb) file_mb=$(file_mb)"
	if [ "$r" = 1 ]; then
		sleep "$WAIT"
		echo "RESULT bench=space_warm_kb $(kb_line)"
	fi
done
sleep "$WAIT"
u=$(used_mb)
echo "RESULT bench=space_after_wait df_used_mb=$u df_used_pct=$((u * 100 / $(size_mb)))" \
     "rss_mb=$(rss_mb) file_mb=$(file_mb) empty_df_used_mb=$e_df empty_rss_mb=$e_rss" \
     "empty_file_mb=$e_file enospc_rounds=$enospc"
echo "RESULT bench=space_after_wait_kb $(kb_line)"
grep -E '^(delete_flushes|tombstone_compactions|slab_discards|volume_full|flushes|compactions):' \
	"$MNT/.dkvfs/stats"
