#!/usr/bin/env bash
# scripts/bench-smoke.sh — every benchmark once with tiny sizes (~1 minute),
# to catch a broken benchmark, not to measure anything.  Checks that each run
# exits 0 and prints the RESULT lines it must; prints "bench-smoke: ok" or
# names what failed and exits 1.
#
#   BUILD=/tmp/b-me scripts/bench-smoke.sh          (SKIP_FS=1 skips the mount)
set -uo pipefail
BUILD=${BUILD:-build}
export BUILD
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fails=()

# expect NAME MIN_RESULT_LINES CMD...
expect() {
	local name=$1 want=$2; shift 2
	echo "== $name: $*" >&2
	timeout -k 10 300 "$@" >"$out" 2> >(tail -n 20 >&2)
	local rc=$? got
	got=$(grep -c '^RESULT ' "$out")
	cat "$out"
	if [ $rc -ne 0 ] || [ "$got" -lt "$want" ]; then
		fails+=("$name (rc=$rc, $got/$want RESULT lines)")
	fi
}

expect transport 24 "$here/bench-transport.sh" --duration=0.05 --sizes=64,4K --depths=1,4
expect crc32c 5 "$BUILD/dkvfs-bench" --benchmarks=crc32c
expect engine 14 "$here/bench-engine.sh" --num=3000 --threads=2 --stats_interval=0
expect engine-compute 2 "$BUILD/dkvfs-bench" --engine=dkv --compaction=compute --num=3000 \
	--benchmarks=fillrandom,readrandom --memtable_size=64K
if [ "${SKIP_FS:-0}" != 1 ]; then
	NSMALL=200 NWIDE=100 NBULK=1000 BIG_MB=8 BULK_JOBS=2 STEP_LIMIT=120 NREPO=80 \
		NSQL=2000 NCREATE=500 CHART=/tmp/dkvfs-bench-smoke-$$.svg \
		expect fs 20 "$here/bench-fs.sh"
	[ -s /tmp/dkvfs-bench-smoke-$$.svg ] || fails+=("fs chart (no /tmp/dkvfs-bench-smoke-$$.svg)")
	rm -f /tmp/dkvfs-bench-smoke-$$.svg
	N=200 ROUNDS=1 STEP_LIMIT=60 expect fuse-api 4 "$here/bench-fuse-api.sh"
fi

if [ ${#fails[@]} -eq 0 ]; then
	echo "bench-smoke: ok"
else
	echo "bench-smoke: FAILED: ${fails[*]}"
	exit 1
fi
