#!/usr/bin/env bash
# scripts/mount.sh DIR BUILDDIR — mount a dkvfs volume on DIR with an
# embedded memory node (called by `make mount MNT=DIR`).  The volume's data
# lives under ${DKVFS_DATA_DIR:-$XDG_DATA_HOME/dkvfs or ~/.local/share/dkvfs}
# and survives unmount/remount.
set -euo pipefail
dir=${1:?usage: scripts/mount.sh DIR BUILDDIR}
build=${2:-build}
bin="$build/dkvfs"
[ -x "$bin" ] || { echo "mount.sh: $bin not built (run make)" >&2; exit 1; }
mkdir -p "$dir"
if grep -q " $(realpath "$dir") fuse.dkvfs " /proc/mounts; then
	echo "dkvfs is already mounted on $dir"
	exit 0
fi
opts=()
[ -n "${DKVFS_DATA_DIR:-}" ] && opts=(-o "data_dir=$DKVFS_DATA_DIR")
[ -n "${DKVFS_OPTS:-}" ] && opts+=(-o "$DKVFS_OPTS")
"$bin" "${opts[@]}" "$dir"
cat <<MSG
dkvfs mounted on $dir (embedded memory node; data under ${DKVFS_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/dkvfs}).
  use it:      cp -r something $dir/ ; ls -l $dir
  live stats:  cat $dir/.dkvfs/stats
  unmount:     fusermount3 -u $dir     (or: umount $dir)
  options:     $bin --help   (e.g. DKVFS_OPTS=memnode_size=4G make mount MNT=$dir)
MSG
