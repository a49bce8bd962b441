#!/usr/bin/env bash
# scripts/bench-uring.sh — what FUSE over io_uring would give dkvfs's create
# and remove paths (issue 12's last goals), a measurement only: the product
# builds against Debian 12's libfuse 3.14, which has no io_uring.  Builds a
# libfuse of 3.18 or later from LIBFUSE_SRC (a source tree; this script
# downloads nothing) into a temporary prefix, dkvfs against it in
# BUILD-uring, and libfuse's passthrough example against both libraries,
# turns the kernel's /sys/module/fuse/parameters/enable_uring on for the run
# (and back to what it was after), and on each side times
#   touch   of NFILES new names in one directory        files_per_sec
#   rm      rm -rf of them, caches dropped first         ms
#   bulk    4 parallel cp -r of NFILES empty files each  files_per_sec
#           (1,000 per directory)
# printing one line per side:
#   RESULT bench=uring side=S touch_per_sec=.. rm_ms=.. bulk_per_sec=..
# Sides: pt314 (Debian's passthrough, bench-fs.sh's baseline), pt_new (the
# new library's), pt_new_uring (-o io_uring), dkvfs (this build, default
# polling reader), dkvfs_spin0 (-o spin_us=0), dkvfs_new_spin0 (the new
# library, libfuse's loop), dkvfs_new_uring (-o spin_us=0,io_uring).
#
#   LIBFUSE_SRC=~/libfuse scripts/bench-uring.sh
#
# Needs root, a kernel with FUSE over io_uring (6.14 or later), meson,
# ninja-build and liburing-dev (apt-get install meson ninja-build
# liburing-dev).  Environment: LIBFUSE_SRC (required), BUILD (build),
# NFILES (20000), STEP_LIMIT (300 s per step).  About 4 minutes.
set -uo pipefail
BUILD=${BUILD:-build}
NFILES=${NFILES:-20000}
STEP_LIMIT=${STEP_LIMIT:-300}
DKVFS=$BUILD/dkvfs
BENCH=bench-uring
. "$(dirname "$0")/bench-lib.sh"

[ -n "${LIBFUSE_SRC:-}" ] && [ -f "$LIBFUSE_SRC/meson.build" ] ||
	die "LIBFUSE_SRC must name a libfuse source tree (3.18 or later)"
command -v meson >/dev/null && command -v ninja >/dev/null ||
	die "needs meson and ninja (apt-get install meson ninja-build liburing-dev)"
URING=/sys/module/fuse/parameters/enable_uring
[ -w "$URING" ] || die "this kernel has no FUSE over io_uring ($URING)"
bl_setup bench-uring
URING_WAS=$(cat "$URING")
PT=
bu_cleanup() {
	local rc=$?
	[ -n "$PT" ] && mountpoint -q "$PT" && fusermount3 -u -z "$PT"
	echo "$URING_WAS" | sed 's/Y/1/;s/N/0/' > "$URING"
	(exit $rc)
	bl_cleanup
}
trap bu_cleanup EXIT

# ---- builds (not timed) ----
LF=$BASE/libfuse
meson setup "$LF/build" "$LIBFUSE_SRC" --prefix="$LF/inst" -Dexamples=true -Dutils=false \
	-Dtests=false >"$BASE/meson.log" 2>&1 && ninja -C "$LF/build" install >>"$BASE/meson.log" 2>&1 ||
	{ tail -5 "$BASE/meson.log" >&2; die "libfuse did not build"; }
grep -q "io_uring support *: True" "$BASE/meson.log" || die "libfuse was built without io_uring"
LIBDIR=$(dirname "$(find "$LF/inst" -name 'libfuse3.so*' | head -1)")
make -s BUILD="$BUILD-uring" PKG_CFLAGS="-I$LF/inst/include/fuse3" \
	LDFLAGS="-L$LIBDIR -Wl,-rpath,$LIBDIR" "$BUILD-uring/dkvfs" "$BUILD-uring/dkvfs-memnode" ||
	die "dkvfs did not build against $LIBFUSE_SRC"
bl_build_example passthrough "$BASE/pt314" 2>"$BASE/pt-build.log" || die "passthrough did not build"
DK_OLD=$DKVFS
DK_NEW=$(readlink -f "$BUILD-uring/dkvfs")
echo 1 > "$URING"

SRC=$BASE/src
for j in 1 2 3 4; do
	for d in $(seq 0 $((NFILES / 1000 - 1))); do
		mkdir -p "$SRC/b$j/d$d"
		(cd "$SRC/b$j/d$d" && seq -f f%g 1000 | xargs touch)
	done
done

now() { date +%s%N; }
steps() { # SIDE DIR
	local t0 t1 touch_rate rm_ms pids=""
	sync; echo 3 > /proc/sys/vm/drop_caches
	mkdir "$2/t"
	t0=$(now); (cd "$2/t" && seq -f n%g "$NFILES" | tmo xargs touch) || die "$1: touch failed"
	t1=$(now); touch_rate=$((NFILES * 1000000000 / (t1 - t0)))
	sync; echo 3 > /proc/sys/vm/drop_caches
	t0=$(now); tmo rm -rf "$2/t" || die "$1: rm -rf failed"
	t1=$(now); rm_ms=$(((t1 - t0) / 1000000))
	t0=$(now)
	for j in 1 2 3 4; do tmo cp -r "$SRC/b$j" "$2/b$j" & pids="$pids $!"; done
	# shellcheck disable=SC2086 # the pids are words
	wait $pids || die "$1: cp -r failed"
	t1=$(now)
	echo "RESULT bench=uring side=$1 touch_per_sec=$touch_rate rm_ms=$rm_ms" \
		"bulk_per_sec=$((4 * NFILES * 1000000000 / (t1 - t0)))"
}
pt_side() { # SIDE BINARY [OPTS]
	local back=$BASE/back-$1
	PT=$BASE/mnt-$1
	mkdir -p "$back" "$PT"
	(cd "$back" && "$2" ${3:+-o "$3"} "$PT") && mountpoint -q "$PT" || die "$1 did not mount"
	steps "$1" "$PT$back"   # the passthrough shows the whole root
	fusermount3 -u "$PT" || die "$1: unmount failed"
	PT=
	rm -rf "$back"
}
dk_side() { # SIDE BINARY [OPTS]
	DKVFS=$2
	rm -rf "$BASE/data"
	mkdir -p "$BASE/data"
	bl_mount "$BASE/$1.log" -o "data_dir=$BASE/data,memnode_size=2G${3:+,$3}"
	steps "$1" "$MNT"
	bl_unmount
}
pt_side pt314 "$BASE/pt314"
pt_side pt_new "$LF/build/example/passthrough"
pt_side pt_new_uring "$LF/build/example/passthrough" io_uring
dk_side dkvfs "$DK_OLD"
dk_side dkvfs_spin0 "$DK_OLD" spin_us=0
dk_side dkvfs_new_spin0 "$DK_NEW" spin_us=0
dk_side dkvfs_new_uring "$DK_NEW" spin_us=0,io_uring
