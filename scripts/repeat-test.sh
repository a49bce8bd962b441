#!/usr/bin/env bash
# scripts/repeat-test.sh — run one test case N times, each under a watchdog,
# and count passes, failures and hangs (a flaky test's rate, before and after
# a fix).  A hang's stacks go to $OUT/hang.RUN.PID (gdb, when installed).
#
#   scripts/repeat-test.sh BINARY FILTER [RUNS=20] [SECONDS=90]
#   scripts/repeat-test.sh build/tests/engine/test_cleaner \
#       'cleaner/half_deleted_full_node_heals_memnode' 30
#
# Prints one line per run and then: RESULT runs=N passed=P failed=F hung=H
set -uo pipefail
bin=${1:?binary}; filter=${2:?criterion filter}; runs=${3:-20}; secs=${4:-90}
OUT=${OUT:-$(mktemp -d /tmp/dkv-repeat-XXXXXX)}
mkdir -p "$OUT" || exit 1
passed=0; failed=0; hung=0
for i in $(seq 1 "$runs"); do
	"$bin" --filter="$filter" >"$OUT/run.$i" 2>&1 &
	p=$!
	for _ in $(seq 1 "$secs"); do
		sleep 1
		kill -0 "$p" 2>/dev/null || break
	done
	if kill -0 "$p" 2>/dev/null; then
		hung=$((hung + 1))
		for c in $(pgrep -P "$p"); do
			command -v gdb >/dev/null &&
				gdb -p "$c" -batch -ex "thread apply all bt 15" >"$OUT/hang.$i.$c" 2>&1
		done
		pkill -9 -P "$p"; kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
		echo "run $i: hung after ${secs} s (stacks in $OUT)"
	elif wait "$p"; then
		passed=$((passed + 1)); echo "run $i: passed"
	else
		failed=$((failed + 1)); echo "run $i: failed ($OUT/run.$i)"
	fi
done
echo "RESULT runs=$runs passed=$passed failed=$failed hung=$hung"
