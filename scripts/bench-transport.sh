#!/usr/bin/env bash
# scripts/bench-transport.sh — what one remote READ / WRITE costs.
#
# Runs `dkvfs-bench --benchmarks=transport`: READ and WRITE of 64 B, 4 KiB,
# 64 KiB and 1 MiB with 1 and 16 operations in flight over the tcp and local
# backends of mn_client and over a plain loopback socket (the baseline), one
# RESULT line per case.  Without --memnode the bench starts its own memory
# node in-process on 127.0.0.1:0, so this is one command.
#
#   scripts/bench-transport.sh [dkvfs-bench flags...]
#   BUILD=/tmp/b-me scripts/bench-transport.sh --duration=2 --memnode=127.0.0.1:7000
#
# Bounded: each case runs --duration seconds (default 1 here) and the whole
# script is killed after BENCH_TIME_LIMIT seconds (default 300).
set -euo pipefail
BUILD=${BUILD:-build}
LIMIT=${BENCH_TIME_LIMIT:-300}
BIN=$BUILD/dkvfs-bench
[ -x "$BIN" ] || { echo "bench-transport: $BIN not built (make BUILD=$BUILD $BIN)" >&2; exit 1; }

exec timeout -k 10 "$LIMIT" "$BIN" --benchmarks=transport --duration=1 "$@"
