#!/usr/bin/env bash
# scripts/repeat-test.sh — run one test case (or a whole test binary) N
# times, each under a watchdog, and count passes, failures and hangs (a
# flaky test's rate, before and after a fix).  A hang's stacks go to
# $OUT/hang.RUN.PID (gdb, when installed).
#
#   scripts/repeat-test.sh BINARY FILTER [RUNS=20] [SECONDS=90]
#   scripts/repeat-test.sh build/tests/engine/test_cleaner \
#       'cleaner/half_deleted_full_node_heals_memnode' 30
#   PAR=4 scripts/repeat-test.sh build/tests/engine/test_cleaner all 24 200
#
# FILTER `all` runs every case of the binary.  PAR (default 1) runs that
# many copies at a time: a loaded machine is where the flakes CI meets show
# up first (test_cleaner's full-volume cases failed 4 runs in 24 as whole
# binaries with PAR=4 before 5794f4e; the case that had failed in `make
# check` passed 24 of 24 alone).
# Prints one line per run and then: RESULT runs=N passed=P failed=F hung=H
set -uo pipefail
bin=${1:?binary}; filter=${2:?criterion filter, or all}; runs=${3:-20}; secs=${4:-90}
par=${PAR:-1}
# As scripts/run-tests.sh: leaks inside Criterion's own runner are not ours
# (an ASan build's runs would all fail on them), and sanitizer builds let
# forked servers run.
here=$(cd "$(dirname "$0")/.." && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/tests/lsan.supp:print_suppressions=0}
export TSAN_OPTIONS=${TSAN_OPTIONS:-die_after_fork=0}
OUT=${OUT:-$(mktemp -d /tmp/dkv-repeat-XXXXXX)}
mkdir -p "$OUT" || exit 1
args=()
[ "$filter" = all ] || args=(--filter="$filter")

# one I: run I under the watchdog; its verdict in $OUT/verdict.I
one() {
	local i=$1 p c
	"$bin" "${args[@]}" >"$OUT/run.$i" 2>&1 &
	p=$!
	for _ in $(seq 1 "$secs"); do
		sleep 1
		kill -0 "$p" 2>/dev/null || break
	done
	if kill -0 "$p" 2>/dev/null; then
		for c in $(pgrep -P "$p"); do
			command -v gdb >/dev/null &&
				gdb -p "$c" -batch -ex "thread apply all bt 15" >"$OUT/hang.$i.$c" 2>&1
		done
		pkill -9 -P "$p"; kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
		echo hung >"$OUT/verdict.$i"
		echo "run $i: hung after ${secs} s (stacks in $OUT)"
	elif wait "$p" && grep -q 'Tested: [1-9]' "$OUT/run.$i"; then
		echo passed >"$OUT/verdict.$i"
		echo "run $i: passed"
	else
		echo failed >"$OUT/verdict.$i"
		echo "run $i: failed, or no case matched ($OUT/run.$i)"
	fi
}

for ((i = 1; i <= runs; i += par)); do
	for ((j = i; j < i + par && j <= runs; j++)); do
		one "$j" &
	done
	wait
done
passed=$(grep -l '^passed$' "$OUT"/verdict.* 2>/dev/null | wc -l)
failed=$(grep -l '^failed$' "$OUT"/verdict.* 2>/dev/null | wc -l)
hung=$(grep -l '^hung$' "$OUT"/verdict.* 2>/dev/null | wc -l)
echo "RESULT runs=$runs passed=$passed failed=$failed hung=$hung"
