#!/usr/bin/env bash
# scripts/bench-all.sh — every figure the project reports, in one run.
#
#   BUILD=/tmp/b-me scripts/bench-all.sh [OUTDIR]      (default /tmp/dkvfs-bench-<date>)
#
# 1. transport: scripts/bench-transport.sh (tcp, local, plain; 4 sizes x 2 depths)
# 2. engine: scripts/bench-engine.sh, dkv (transport auto: local) and RocksDB,
#    all seven benchmarks at NUM keys (default 2000000)
# 3. engine over tcp, near-data vs compute-side compaction: fillrandom,
#    readrandom, readseq at NUM_TCP keys (default 1000000), so net_bytes and
#    compaction_net_bytes show what crosses the network
# 4. filesystem: scripts/bench-fs.sh, then scripts/bench-requests.sh (FUSE
#    requests per file), scripts/bench-names.sh (the daemon's memory per
#    name) and scripts/bench-fuse-api.sh (libfuse's high-level API against
#    its low-level one); SKIP_FS=1 leaves all four out
#
# Each part's stdout goes to OUTDIR/<part>.out, stderr to OUTDIR/<part>.err;
# every RESULT/RATIO line is also collected in OUTDIR/results.txt, headed by
# the exact command and the load average at its start.  TRANSPORT_FLAGS adds
# flags to the transport part (e.g. "--duration=0.1" for a quick try).
set -uo pipefail
BUILD=${BUILD:-build}
export BUILD
NUM=${NUM:-2000000}
NUM_TCP=${NUM_TCP:-1000000}
# The tcp parts run with a 30 s operation timeout: with the default 5 s a
# loaded 2-vCPU box has failed a fill with ETIMEDOUT (see docs/bench.md).
OP_TIMEOUT=${OP_TIMEOUT:-30000}
here=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-/tmp/dkvfs-bench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
rc=0

part() {
	local name=$1; shift
	{
		echo "## $name: $*"
		echo "## start $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
	} | tee -a "$OUT/results.txt" >&2
	"$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || { rc=1; echo "## $name FAILED (see $OUT/$name.err)" | tee -a "$OUT/results.txt" >&2; }
	grep -E '^(RESULT|RATIO) ' "$OUT/$name.out" | tee -a "$OUT/results.txt"
}

# shellcheck disable=SC2086  # TRANSPORT_FLAGS is a list of flags
part transport "$here/bench-transport.sh" ${TRANSPORT_FLAGS:-}
part engine "$here/bench-engine.sh" --num="$NUM" --memnode_size=8G
for c in memnode compute; do
	part "engine-tcp-$c" "$BUILD/dkvfs-bench" --engine=dkv --transport=tcp --compaction=$c \
		--num="$NUM_TCP" --memnode_size=8G --op_timeout_ms="$OP_TIMEOUT" \
		--benchmarks=fillrandom,readrandom,readseq
done
if [ "${SKIP_FS:-0}" != 1 ]; then
	part fs "$here/bench-fs.sh"
	part requests "$here/bench-requests.sh"
	part names "$here/bench-names.sh"
	part fuse-api "$here/bench-fuse-api.sh"
fi
echo "## all results in $OUT/results.txt" >&2
exit $rc
