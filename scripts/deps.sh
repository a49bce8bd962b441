#!/usr/bin/env bash
# Install the Debian packages dkvfs needs, only those that are missing.
# Idempotent and quiet when everything is there; needs root (or sudo) otherwise.
# Extra package names as arguments are installed too (the benchmarks' tools:
# scripts/bench-fs.sh asks for sqlite3, scripts/bench-chart.sh for gnuplot-nox).
set -euo pipefail

PKGS=(build-essential pkg-config libfuse3-dev fuse3 libibverbs-dev librdmacm-dev
      libcriterion-dev librocksdb-dev rsync git curl clang libclang-rt-14-dev
      procps "$@")

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
SUDO=
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "deps: need root to install ${missing[*]}" >&2; exit 1; }
	SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
