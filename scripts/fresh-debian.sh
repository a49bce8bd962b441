#!/usr/bin/env bash
# scripts/fresh-debian.sh [ROOT] — check the README's two commands on a fresh
# Debian 12 system: a minimal Debian 12 root (debootstrap --variant=minbase,
# plus make, gcc, git and ca-certificates, the least a machine needs to clone
# and run `make`), a clone of this repository's HEAD inside it, then, in a
# chroot, `make mount` (with a smoke use of the mount and its unmount) and
# `make check`.  Everything else must come from scripts/deps.sh.
#
# Needs root, /dev/fuse and Debian's mirror (apt-get); installs debootstrap on
# the host if it is missing.  ROOT defaults to a new directory under /tmp and
# is removed at the end unless KEEP=1.  CHECK=0 stops after `make mount`.
# Prints one line per step and exits non-zero at the first step that fails;
# the logs of the two commands are ROOT.mount.log and ROOT.check.log.
# Takes about 2 minutes to build the root and 10 to 15 for `make check` on a
# 2-vCPU machine.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "fresh-debian: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
root=${1:-$(mktemp -d /tmp/dkvfs-fresh.XXXXXX)}
mirror=${MIRROR:-http://deb.debian.org/debian}

binds=()
cleanup() {
	local i
	grep -q " $root/root/kv " /proc/mounts && umount -l "$root/root/kv"
	for ((i = ${#binds[@]} - 1; i >= 0; i--)); do
		umount -l "${binds[$i]}" 2>/dev/null || true
	done
	if [ "${KEEP:-0}" != 1 ]; then
		grep -q " $root/" /proc/mounts && { echo "fresh-debian: mounts left under $root, not removed" >&2; return; }
		rm -rf "$root"
	fi
}
trap cleanup EXIT

if ! command -v debootstrap >/dev/null; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if [ ! -x "$root/usr/bin/make" ]; then
	echo "fresh-debian: debootstrap bookworm (minbase + make gcc libc6-dev git ca-certificates) into $root"
	debootstrap --variant=minbase --include=make,gcc,libc6-dev,git,ca-certificates \
		bookworm "$root" "$mirror" > "$root.debootstrap.log" 2>&1 ||
		{ echo "fresh-debian: debootstrap failed, see $root.debootstrap.log" >&2; exit 1; }
fi
for d in proc sys dev dev/pts dev/shm; do
	mount --bind "/$d" "$root/$d"
	binds+=("$root/$d")
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
rm -rf "$root/root/dkvfs"
git clone -q "$src" "$root/root/dkvfs"
echo "fresh-debian: cloned $(git -C "$src" rev-parse --short HEAD)"

in_root() {
	chroot "$root" env -i HOME=/root TERM=dumb \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "$1"
}

if ! in_root 'cd /root/dkvfs && make mount MNT=/root/kv' > "$root.mount.log" 2>&1; then
	echo "fresh-debian: FAIL make mount (see $root.mount.log)"; exit 1
fi
if ! in_root 'cd /root/kv && mkdir -p a/b && cp -r /usr/share/doc/git a/b/ && echo hi > x &&
	      test "$(cat x)" = hi && diff -r --no-dereference /usr/share/doc/git a/b/git && cd / &&
	      fusermount3 -u /root/kv && cd /root/dkvfs && make mount MNT=/root/kv >/dev/null &&
	      test "$(cat /root/kv/x)" = hi && fusermount3 -u /root/kv' >> "$root.mount.log" 2>&1; then
	echo "fresh-debian: FAIL using the mount (see $root.mount.log)"; exit 1
fi
echo "fresh-debian: ok   make mount (mounted, used, remounted, unmounted)"
[ "${CHECK:-1}" = 0 ] && exit 0
if ! in_root 'cd /root/dkvfs && make check' > "$root.check.log" 2>&1; then
	echo "fresh-debian: FAIL make check: $(tail -1 "$root.check.log") (see $root.check.log)"; exit 1
fi
echo "fresh-debian: ok   make check: $(tail -1 "$root.check.log")"
