# scripts/bench-lib.sh — what the benchmarks that mount dkvfs by themselves
# share (sourced by bench-names.sh and bench-requests.sh; bench-fs.sh uses
# bl_mount, die and tmo only, with its own setup and cleanup):
#
#   bl_setup NAME    checks $DKVFS and root, makes BASE (in /dev/shm) and
#                    MNT, and traps EXIT/INT/TERM to unmount, stop the
#                    daemon and remove both, also on failure or ^C
#   bl_mount LOG ARG...   starts "$DKVFS" -f ARG... MNT in the background
#                    (stdout and stderr appended to LOG), DPID its pid, and
#                    waits until the mount is there
#   bl_unmount       unmounts and waits until the daemon has exited
#   die MSG, tmo CMD...   one-line failure; CMD bounded by STEP_LIMIT
#   bl_build_example NAME OUT   builds libfuse's example NAME.c (passthrough,
#                    passthrough_ll) from BL_EX into OUT, with the HAVE_
#                    features libfuse's own build turns on for Linux (without
#                    HAVE_UTIMENSAT, touch, tar x and rsync -a fail to set
#                    times on passthrough); compiler output to stderr
# Needs BENCH (the script's name, for messages), DKVFS, STEP_LIMIT.

BL_EX=/usr/share/doc/libfuse3-dev/examples

die() { echo "$BENCH: $*" >&2; exit 1; }
tmo() { timeout -k 5 "$STEP_LIMIT" "$@"; }

bl_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if mountpoint -q "$MNT" 2>/dev/null; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null
	fi
	if [ -n "$DPID" ]; then
		for _ in $(seq 100); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$DPID" 2>/dev/null
	fi
	rmdir "$MNT" 2>/dev/null
	rm -rf "$BASE"
	exit $rc
}

bl_setup() {
	[ -x "$DKVFS" ] || die "$DKVFS not built (make)"
	[ "$(id -u)" = 0 ] || die "run as root (it drops the kernel's caches)"
	DKVFS=$(readlink -f "$DKVFS")
	BASE=$(mktemp -d "/dev/shm/dkvfs-$1.XXXXXX")
	MNT=$(mktemp -d "/tmp/dkvfs-$1-mnt.XXXXXX")
	DPID=
	trap bl_cleanup EXIT
	trap 'exit 130' INT TERM
}

bl_mount() {
	local log=$1
	shift
	"$DKVFS" -f "$@" "$MNT" >>"$log" 2>&1 &
	DPID=$!
	for _ in $(seq 200); do
		mountpoint -q "$MNT" && break
		kill -0 "$DPID" 2>/dev/null || break
		sleep 0.1
	done
	mountpoint -q "$MNT" || { tail "$log" >&2; die "dkvfs did not mount"; }
}

bl_unmount() {
	fusermount3 -u "$MNT" || die "unmount failed"
	for _ in $(seq 300); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
	kill -0 "$DPID" 2>/dev/null && die "the daemon did not exit after the unmount"
	DPID=
}

bl_build_example() {
	# shellcheck disable=SC2046 # pkg-config's flags are words
	cc -O2 -Wall -I"$BL_EX" -DHAVE_UTIMENSAT -DHAVE_POSIX_FALLOCATE -DHAVE_SETXATTR \
		-DHAVE_COPY_FILE_RANGE "$BL_EX/$1.c" -o "$2" $(pkg-config fuse3 --cflags --libs)
}
