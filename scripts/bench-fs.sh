#!/usr/bin/env bash
# scripts/bench-fs.sh — dkvfs against libfuse's passthrough and tmpfs with
# real shell tools, same run.
#
# Mounts dkvfs with an embedded memory node (its data_dir in /dev/shm, so both
# sides live in DRAM), builds libfuse's own high-level `passthrough` example
# (Debian ships it in /usr/share/doc/libfuse3-dev/examples) and mounts it over
# a tmpfs directory (the FUSE baseline: the same kernel round trips, no
# store), and runs every step on the three, printing one line per step:
#
#   RESULT bench=fs_STEP dkvfs=X passthrough=P tmpfs=Y vs_passthrough=X/P vs_tmpfs=X/Y unit=UNIT
#
#   fs_cp_small     cp -r of NSMALL (20000) files of 4 KiB in 20 dirs   files_per_sec
#   fs_cp_big       cp of one BIG_MB (1024) MiB file                     mb_per_sec
#   fs_read_big     cat of that file to /dev/null (caches dropped; memory
#                   warmed first, see the step)                          mb_per_sec
#   fs_ls_l_10k     ls -l of a directory of NWIDE (10000) entries        ms
#   fs_find         find -type f over the fs_cp_small tree               ms
#   fs_diff         diff -r of the fs_cp_small tree against its source   ms
#   fs_tar_c        tar c of the fs_cp_small tree to /dev/null           ms
#   fs_rm_small     rm -rf of the fs_cp_small tree                       ms
#   fs_bulk_create  cp -r of NBULK (1000000) empty files, 1000 dirs      files_per_sec
#   fs_ls_10_in_1m  ls of a 10-entry directory beside the bulk tree      ms
#   fs_ls_root_1m   ls of the root whose sibling holds the bulk tree     ms
#
# and, unless WORKLOADS=0, real programs (sources made first, not timed):
#
#   fs_git_clone    git clone --no-hardlinks of a generated repository    ms
#                   (NREPO (4000) files in 40 dirs, 3 commits)
#   fs_tar_x        tar x of the NSMALL-file tree                        ms
#   fs_grep_r       grep -r for a string that is not there, over it      ms
#   fs_rsync_1      rsync -a of the NSMALL-file tree into the fs          ms
#   fs_rsync_2      the same rsync again (nothing to copy: all stat)     ms
#   fs_sqlite       sqlite3: NSQL (200000) rows in 200 transactions      ms
#   fs_create_100k  NCREATE (100000) empty files in one dir (touch)      files_per_sec
#   fs_ls_l_100k    ls -l of that directory                              ms
#   fs_rm_100k      rm -rf of it                                         ms
#
# CHART=FILE.svg (default /tmp/dkvfs-bench-fs.svg) gets every step as one
# chart (scripts/bench-chart.sh, gnuplot): time relative to passthrough.
#
# For rates (files_per_sec, mb_per_sec) a ratio above 1 means dkvfs is
# faster; for times (ms) below 1.  Before each read-side step the kernel's
# page, dentry and inode caches are dropped (as root) so the file systems are
# measured, not the kernel cache; tmpfs keeps its data in the page cache by
# nature.  The ms steps are the median of REPEAT (3) such cold runs (rm -rf
# and tar run once).  The big file is compared with cmp after the timed read
# (not timed).  Set PASSTHROUGH=0 to leave the passthrough column out (NA).
#
# Environment: BUILD (build), NSMALL, NWIDE, NBULK, BIG_MB, NREPO, NSQL,
# NCREATE, WORKLOADS (1), CHART, BULK_JOBS (4
# parallel cp for the bulk create), DKVFS_OPTS (extra -o options for the
# mount, default memnode_size=8G), STEP_LIMIT (seconds per step, default
# 900), PASSTHROUGH (1).  Always unmounts and removes its directories, also
# on failure or ^C.
set -uo pipefail
BUILD=${BUILD:-build}
NSMALL=${NSMALL:-20000}
NWIDE=${NWIDE:-10000}
NBULK=${NBULK:-1000000}
BIG_MB=${BIG_MB:-1024}
BULK_JOBS=${BULK_JOBS:-4}
STEP_LIMIT=${STEP_LIMIT:-900}
REPEAT=${REPEAT:-3}
DKVFS_OPTS=${DKVFS_OPTS-memnode_size=8G}
PASSTHROUGH=${PASSTHROUGH:-1}
WORKLOADS=${WORKLOADS:-1}
NREPO=${NREPO:-4000}
NSQL=${NSQL:-200000}
NCREATE=${NCREATE:-100000}
CHART=${CHART:-/tmp/dkvfs-bench-fs.svg}
HERE=$(dirname "$(readlink -f "$0")")

DKVFS=$BUILD/dkvfs
[ -x "$DKVFS" ] || { echo "bench-fs: $DKVFS not built (make BUILD=$BUILD $DKVFS)" >&2; exit 1; }
DKVFS=$(readlink -f "$DKVFS")
# The bulk step's source tree and the passthrough's copy of it both live in
# /dev/shm (NBULK inodes each), beside the other steps' trees: with too few
# free inodes the passthrough's cp fails with ENOSPC, its column is NA, and
# that is found out after minutes (a leftover million-file tree did it).
need=$((2 * NBULK + 2 * NSMALL + NCREATE + 100000))
free=$(df --output=iavail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
if [ -n "$free" ] && [ "$free" -lt "$need" ]; then
	echo "bench-fs: /dev/shm has $free free inodes and this run needs about $need" \
	     "(NBULK=$NBULK): remove what is left there (ls /dev/shm) or set a smaller NBULK" >&2
	exit 1
fi

BASE=$(mktemp -d /dev/shm/dkvfs-bench-fs.XXXXXX)
SRC=$BASE/src          # source trees (tmpfs)
TMP=$BASE/tmpfs        # the tmpfs side
DATA=$BASE/data        # dkvfs data_dir (embedded memory node region)
MNT=$(mktemp -d /tmp/dkvfs-bench-mnt.XXXXXX)
PT=$(mktemp -d /tmp/dkvfs-bench-pt.XXXXXX)   # passthrough mount (of $BASE/ptback)
mkdir -p "$SRC" "$TMP" "$DATA" "$BASE/ptback"
# The tmpfs side gets a tmpfs of its own without an inode limit (as root):
# the source's, the passthrough's and its own million-file bulk trees do not
# fit in /dev/shm's ~3.08M inodes, and its fs_bulk_create came out NA.
if mount -t tmpfs -o nr_inodes=0,size=50% dkvfs-bench "$TMP" 2>/dev/null; then
	TMP_MOUNTED=1
else
	echo "bench-fs: could not mount a tmpfs for the tmpfs side (needs root); using $TMP" \
	     "in /dev/shm, whose inode limit may leave fs_bulk_create NA" >&2
fi
DPID=
r=()

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if mountpoint -q "$MNT" 2>/dev/null; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null
	fi
	if mountpoint -q "$PT" 2>/dev/null; then
		fusermount3 -u "$PT" 2>/dev/null || fusermount3 -u -z "$PT" 2>/dev/null
	fi
	rmdir "$PT" 2>/dev/null
	[ -n "${TMP_MOUNTED:-}" ] && umount "$TMP" 2>/dev/null
	if [ -n "$DPID" ]; then
		# The daemon flushes and exits after the unmount; give it a bound.
		for _ in $(seq 100); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
		kill -TERM "$DPID" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$DPID" 2>/dev/null
	fi
	rmdir "$MNT" 2>/dev/null
	if [ -e "$BASE/failed" ]; then
		cp "$BASE/dkvfs.log" "/tmp/dkvfs-bench-fs-$$.log" 2>/dev/null &&
			echo "bench-fs: daemon log kept in /tmp/dkvfs-bench-fs-$$.log" >&2
		rc=1
	fi
	rm -rf "$BASE"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
BENCH=bench-fs
. "$HERE/bench-lib.sh" # die, tmo, bl_mount (this script keeps its own setup and cleanup, above)
# Dropping caches also evicts ls, find, cat and their libraries: load them
# again on something else so the timed command does not read them from disk.
drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
	ls -l / >/dev/null; find / -maxdepth 0 >/dev/null; cat </dev/null; wc -l </dev/null >/dev/null
	cp --version >/dev/null; timeout 5 true
}
# result NAME UNIT DKVFS PASSTHROUGH TMPFS  (NA for a side whose command failed)
result() {
	awk -v n="$1" -v u="$2" -v d="$3" -v p="$4" -v t="$5" '
	function ratio(a, b) { return (a != "NA" && b != "NA" && b + 0 > 0) ? sprintf("%.3f", a / b) : "NA" }
	BEGIN {
		printf "RESULT bench=%s dkvfs=%s passthrough=%s tmpfs=%s vs_passthrough=%s vs_tmpfs=%s unit=%s\n",
			n, d, p, t, ratio(d, p), ratio(d, t), u }' | tee -a "$BASE/results"
	echo "# $1 done at $(date +%T)" >&2
}
warn() { echo "bench-fs: WARNING: $*" >&2; touch "$BASE/failed"; }
# timed rate COUNT CMD... -> COUNT per second;  timed ms 0 CMD... -> milliseconds.
# CMD's stdout goes to $OUT (default /dev/null).  A failed or timed-out CMD
# prints NA, and the run exits 1 at the end (the other steps still run).
timed() {
	local kind=$1 count=$2 t0 t1 rc
	shift 2
	t0=$(now); tmo "$@" >"${OUT:-/dev/null}"; rc=$?; t1=$(now)
	if [ $rc -ne 0 ]; then
		warn "failed (rc=$rc): $*"
		echo NA
	elif [ "$kind" = ms ]; then
		ms "$t0" "$t1"
	else
		rate "$count" "$t0" "$t1"
	fi
}
# rate COUNT T0 T1 -> COUNT per second;  ms T0 T1 -> milliseconds
# cold_ms CMD...: median of REPEAT (3) runs of CMD, each after drop_caches.
cold_ms() {
	local i v vals=()
	for ((i = 0; i < REPEAT; i++)); do
		drop_caches
		v=$(timed ms 0 "$@")
		[ "$v" = NA ] && { echo NA; return; }
		vals+=("$v")
	done
	printf '%s\n' "${vals[@]}" | sort -g | sed -n "$(( (REPEAT + 1) / 2 ))p"
}
rate() { awk -v c="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%.1f", c / (b - a) }'; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b - a) * 1000 }'; }

# mount: start the daemon in the foreground (so we hold its pid) and wait
# until the mount is there.
opts="data_dir=$DATA${DKVFS_OPTS:+,$DKVFS_OPTS}"
bl_mount "$BASE/dkvfs.log" -o "$opts"
echo "# dkvfs mounted on $MNT (pid $DPID, -o $opts); tmpfs side $TMP" >&2
# passthrough: libfuse's example, built here (bl_build_example), mounted over
# a tmpfs directory (its default options: caches as libfuse sets them, one
# thread per request)
if [ "$PASSTHROUGH" = 1 ] && [ -f "$BL_EX/passthrough.c" ] &&
	bl_build_example passthrough "$BASE/passthrough" 2>"$BASE/pt-build.log" &&
	(cd "$BASE/ptback" && "$BASE/passthrough" "$PT") && mountpoint -q "$PT"; then
	echo "# passthrough of $BASE/ptback mounted on $PT" >&2
	PTROOT=$PT$BASE/ptback   # passthrough shows the whole root: work in ptback
else
	[ "$PASSTHROUGH" = 1 ] && echo "bench-fs: passthrough not available ($(tail -1 "$BASE/pt-build.log" 2>/dev/null)): NA" >&2
	PTROOT=
fi
SIDES=("$MNT" "${PTROOT:-NA}" "$TMP")
# each SIDE loop below runs the step on dkvfs, passthrough, tmpfs (in that
# order); the passthrough side is NA when it is not mounted

# ---- sources (not timed) ----
per_dir=$(( (NSMALL + 19) / 20 ))
for d in $(seq -w 1 20); do
	mkdir -p "$SRC/small/d$d"
	head -c $((per_dir * 4096)) /dev/urandom | (cd "$SRC/small/d$d" && split -b 4096 -a 5 - f)
done
mkdir -p "$SRC/wide"
head -c $((NWIDE * 16)) /dev/urandom | (cd "$SRC/wide" && split -b 16 -a 5 - w)
head -c $((BIG_MB << 20)) /dev/urandom >"$SRC/big"
nsmall=$(find "$SRC/small" -type f | wc -l)

# ---- cp -r of the small files ----
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	drop_caches
	r+=("$(timed rate "$nsmall" cp -r "$SRC/small" "$side/small")")
done
result fs_cp_small files_per_sec "${r[@]}"; r=()

# ---- one big file ----
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	drop_caches
	r+=("$(timed rate "$BIG_MB" cp "$SRC/big" "$side/big")")
done
result fs_cp_big mb_per_sec "${r[@]}"; r=()
# The first big read after the big writes would fill page-cache pages this
# VM had never touched, and a guest's first touch of a page is slow (the host
# backs it then): measured, a cold cat of 1 GiB from dkvfs took 2.2-2.3 s
# that way and 1.0 s after 4 GiB had been written and freed first.  dkvfs
# reads first, so it alone paid that.  Touch and free that much memory first,
# so every side reads into pages the machine has used before.
dd if=/dev/zero of="$BASE/warm" bs=1M count=$((2 * BIG_MB)) status=none; rm -f "$BASE/warm"
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	drop_caches
	r+=("$(timed rate "$BIG_MB" cat "$side/big")")
done
result fs_read_big mb_per_sec "${r[@]}"; r=()
tmo cmp -s "$SRC/big" "$MNT/big" || warn "$MNT/big differs from the source"

# ---- ls -l of a wide directory ----
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	tmo cp -r "$SRC/wide" "$side/wide" || warn "cp -r wide to $side failed"
	r+=("$(OUT=$BASE/out cold_ms ls -l "$side/wide")")
	n=$(wc -l <"$BASE/out")
	[ "$n" -eq $((NWIDE + 1)) ] || warn "ls -l $side/wide: $n lines"
done
result fs_ls_l_10k ms "${r[@]}"; r=()

# ---- find over the small tree ----
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	r+=("$(OUT=$BASE/out cold_ms find "$side/small" -type f)")
	n=$(wc -l <"$BASE/out")
	[ "$n" -eq "$nsmall" ] || warn "find $side/small: $n files"
done
result fs_find ms "${r[@]}"; r=()

# ---- diff -r against the source, tar c, rm -rf of the small tree ----
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	r+=("$(cold_ms diff -r "$SRC/small" "$side/small")")
done
result fs_diff ms "${r[@]}"; r=()
# (GNU tar does not read the files when it writes to /dev/null itself)
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	drop_caches
	r+=("$(timed ms 0 sh -c 'tar cf - -C "$1" small | cat >/dev/null' _ "$side")")
done
result fs_tar_c ms "${r[@]}"; r=()
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	drop_caches
	r+=("$(timed ms 0 rm -rf "$side/small")")
done
result fs_rm_small ms "${r[@]}"; r=()

# ---- a volume holding NBULK keys, and a 10-entry directory beside them ----
# The bulk tree is 1000 directories of NBULK/1000 empty files, copied by
# BULK_JOBS parallel cp -r (the kernel and the daemon then work on both CPUs).
ndirs=1000; [ "$NBULK" -lt 1000 ] && ndirs=$NBULK
per=$(( (NBULK + ndirs - 1) / ndirs ))
for i in $(seq -w 0 $((ndirs - 1))); do
	mkdir -p "$SRC/bulk/b$i"
	(cd "$SRC/bulk/b$i" && seq -f 'k%06g' 0 $((per - 1)) | xargs touch)
done
nbulk=$((ndirs * per))
mkdir -p "$SRC/ten"
for i in $(seq 0 9); do echo "$i" >"$SRC/ten/e$i"; done
# bulk_copy SRC JOBS DST: every directory of SRC into DST, JOBS cp at a time.
bulk='cd "$1" && ls | xargs -P "$2" -n 50 sh -c '"'"'cp -r "$@" "$0"'"'"' "$3"'
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	mkdir -p "$side/bulk"
	r+=("$(timed rate "$nbulk" sh -c "$bulk" _ "$SRC/bulk" "$BULK_JOBS" "$side/bulk/")")
	cp -r "$SRC/ten" "$side/ten" || warn "cp -r ten to $side failed"
done
result fs_bulk_create files_per_sec "${r[@]}"; r=()
# The source's million inodes go now: with the passthrough's and tmpfs's
# copies, three bulk trees took every inode of a 24 GiB machine's /dev/shm
# (about 3.08M) and every later step on those sides failed with ENOSPC.
rm -rf "$SRC/bulk"
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	r+=("$(OUT=$BASE/out cold_ms ls "$side/ten")")
	n=$(wc -l <"$BASE/out")
	[ "$n" -eq 10 ] || warn "ls $side/ten: $n entries"
done
result fs_ls_10_in_1m ms "${r[@]}"; r=()
for side in "${SIDES[@]}"; do
	[ "$side" = NA ] && { r+=(NA); continue; }
	r+=("$(cold_ms ls "$side")")
done
result fs_ls_root_1m ms "${r[@]}"; r=()

# ---- real programs ----
# Each step is a shell line run once per side (as sh -c LINE _ SIDE, so $1
# is the side), after dropping caches; the results are checked afterwards.
step() { # step NAME UNIT LINE
	local side
	for side in "${SIDES[@]}"; do
		[ "$side" = NA ] && { r+=(NA); continue; }
		drop_caches
		if [ "$2" = ms ]; then
			r+=("$(timed ms 0 sh -c "$3" _ "$side")")
		else
			r+=("$(timed rate "$NCREATE" sh -c "$3" _ "$side")")
		fi
	done
	result "$1" "$2" "${r[@]}"; r=()
}
if [ "$WORKLOADS" = 1 ]; then
	"$HERE/deps.sh" sqlite3 || warn "could not install sqlite3"
	export SRC NCREATE
	# a repository: NREPO small C files in 40 dirs, three commits
	mkdir -p "$SRC/repo" && (
		cd "$SRC/repo" && git init -q && git config user.email bench@dkvfs &&
		git config user.name bench && mkdir $(seq -f 'd%02g' 0 39) &&
		for c in 1 2 3; do
			awk -v n="$NREPO" -v c="$c" 'BEGIN { for (i = 0; i < n; i++) {
				f = sprintf("d%02d/f%05d.c", i % 40, i)
				printf "/* %s, commit %d */\nint f%d(void) { return %d; }\n", f, c, i, i * c > f
				close(f) } }' && git add -A && git commit -qm "commit $c" || exit 1
		done) || warn "could not make the git repository"
	tar cf "$SRC/small.tar" -C "$SRC" small
	awk -v n="$NSQL" 'BEGIN { print "create table t (k integer primary key, v text);"
		per = int(n / 200); for (x = 0; x < 200; x++) { print "begin;"
			for (i = 0; i < per; i++) printf "insert into t values (%d, %c%064d%c);\n", x * per + i, 39, i, 39
			print "commit;" } }' >"$SRC/sql"
	step fs_git_clone ms 'git clone -q --no-hardlinks "$SRC/repo" "$1/repo"'
	step fs_tar_x ms 'mkdir "$1/tx" && tar xf "$SRC/small.tar" -C "$1/tx"'
	step fs_grep_r ms 'grep -r -l -F dkvfs-needle-not-there "$1/tx"; [ $? -eq 1 ]'
	step fs_rsync_1 ms 'rsync -a "$SRC/small/" "$1/rs/"'
	step fs_rsync_2 ms 'rsync -a "$SRC/small/" "$1/rs/"'
	step fs_sqlite ms 'sqlite3 "$1/db" <"$SRC/sql"'
	step fs_create_100k files_per_sec 'mkdir "$1/c" && cd "$1/c" && seq -f c%06g 1 "$NCREATE" | xargs touch'
	step fs_ls_l_100k ms 'n=$(ls -l "$1/c" | wc -l) && [ "$n" -eq $((NCREATE + 1)) ]'
	step fs_rm_100k ms 'rm -rf "$1/c"'
	for side in "${SIDES[@]}"; do
		[ "$side" = NA ] && continue
		[ "$(sqlite3 "$side/db" 'select count(*) from t')" = $((NSQL / 200 * 200)) ] ||
			warn "sqlite on $side: rows missing"
		tmo diff -r "$SRC/small" "$side/tx/small" >/dev/null || warn "tar x on $side differs"
		tmo diff -r "$SRC/small" "$side/rs" >/dev/null || warn "rsync on $side differs"
		[ "$(git -C "$side/repo" rev-list --count HEAD 2>/dev/null)" = 3 ] &&
			tmo diff -r -x .git "$SRC/repo" "$side/repo" >/dev/null ||
			warn "git clone on $side differs"
		rm -rf "$side/repo" "$side/tx" "$side/rs" "$side/db"
	done
fi
"$HERE/bench-chart.sh" "$BASE/results" "$CHART" && echo "# chart: $CHART" >&2
echo "# done; unmounting" >&2
