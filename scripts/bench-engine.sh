#!/usr/bin/env bash
# scripts/bench-engine.sh — the dkv engine against RocksDB, same flags, same box.
#
# Runs `dkvfs-bench --engine=dkv` and then `--engine=rocksdb` with the same
# flags, prints both RESULT lines of every benchmark and one RATIO line each:
#
#   RATIO bench=fillrandom ops_per_sec=DKV/ROCKSDB p50_us=... p99_us=...
#
# (ratios are dkv divided by rocksdb: > 1 means dkv is faster for
# ops_per_sec and slower for the latencies).  Without --memnode the bench
# starts its own memory node in-process; RocksDB lives in /dev/shm.
#
#   scripts/bench-engine.sh [dkvfs-bench flags...]
#   scripts/bench-engine.sh --num=2000000 --benchmarks=fillseq,fillrandom,readrandom
#
# Defaults: --benchmarks=fillseq,fillrandom,overwrite,readrandom,readseq,
# readrandomwriterandom,deleterandom --num=1000000 --key_size=20
# --value_size=400 (any flag given overrides them).  Bounded by
# BENCH_TIME_LIMIT seconds per engine (default 1800).
set -uo pipefail
BUILD=${BUILD:-build}
LIMIT=${BENCH_TIME_LIMIT:-1800}
BIN=$BUILD/dkvfs-bench
[ -x "$BIN" ] || { echo "bench-engine: $BIN not built (make BUILD=$BUILD $BIN)" >&2; exit 1; }

defaults=(--benchmarks=fillseq,fillrandom,overwrite,readrandom,readseq,readrandomwriterandom,deleterandom
	  --num=1000000 --key_size=20 --value_size=400)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
for engine in dkv rocksdb; do
	echo "# $BIN --engine=$engine ${defaults[*]} $*" >&2
	timeout -k 10 "$LIMIT" "$BIN" "${defaults[@]}" "$@" --engine=$engine | tee -a "$out" || rc=1
done

# One RATIO line per benchmark that both engines finished.
awk '
/^RESULT bench=/ {
	b = ""; e = ""
	for (i = 2; i <= NF; i++) {
		split($i, kv, "=")
		if (kv[1] == "bench") b = kv[2]
		else if (kv[1] == "engine") e = kv[2]
		else v[b, e, kv[1]] = kv[2]
	}
	if (!(b in seen)) { seen[b] = 1; order[n++] = b }
}
function ratio(b, k) {
	if (v[b, "rocksdb", k] + 0 == 0) return "NA"
	return sprintf("%.3f", v[b, "dkv", k] / v[b, "rocksdb", k])
}
END {
	for (i = 0; i < n; i++) {
		b = order[i]
		if (!((b, "dkv", "ops_per_sec") in v) || !((b, "rocksdb", "ops_per_sec") in v))
			continue
		printf "RATIO bench=%s ops_per_sec=%s p50_us=%s p99_us=%s mb_per_sec=%s\n",
		       b, ratio(b, "ops_per_sec"), ratio(b, "p50_us"), ratio(b, "p99_us"),
		       ratio(b, "mb_per_sec")
	}
}' "$out"
exit $rc
