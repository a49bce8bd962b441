#!/usr/bin/env bash
# Run every Criterion test binary under $BUILD/tests (or the ones named on the
# command line, e.g. `make check TESTS=net/test_tcp`), each with a time limit,
# and close with one summary line "N passed, N failed, N skipped" (a test
# that skips itself, cr_skip_test, is never counted as passed).
set -uo pipefail
BUILD=${BUILD:-build}
LIMIT=${TEST_TIME_LIMIT:-600}
# Tests fork servers out of threaded processes (Criterion, memory nodes):
# ThreadSanitizer must let such children run.  Harmless in other builds.
export TSAN_OPTIONS=${TSAN_OPTIONS:-die_after_fork=0}
# Sanitizer builds run 3-15x slower: tests that give a healthy peer a bounded
# time scale it by this factor (never their assertions).
case "$BUILD" in
*-thread) scale=10 ;;
*-address*) scale=3 ;;
*) scale=1 ;;
esac
export DKVFS_TEST_TIME_SCALE=${DKVFS_TEST_TIME_SCALE:-$scale}
# Leaks inside Criterion's own runner are not ours (see the file).
here=$(cd "$(dirname "$0")/.." && pwd)
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/tests/lsan.supp:print_suppressions=0}
# Sanitizer builds: every process a test starts (a mount's daemon, its
# memory node, a forked server) writes its reports to files here, which are
# appended to the binary's output below, so a report from a background
# daemon fails the binary as one from the test itself does.  Under ASan the
# mount-level suites run without leak checks: their daemons are killed, not
# shut down.
sanlog=
case "$BUILD" in
*-address*)
	sanlog=$(mktemp -d)
	trap 'rm -rf "$sanlog"' EXIT
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$sanlog/asan"
	export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:log_path=$sanlog/ubsan"
	;;
*-thread)
	sanlog=$(mktemp -d)
	trap 'rm -rf "$sanlog"' EXIT
	export TSAN_OPTIONS="$TSAN_OPTIONS:log_path=$sanlog/tsan"
	;;
esac

if [ $# -gt 0 ]; then
	bins=(); for t in "$@"; do bins+=("$BUILD/tests/$t"); done
else
	mapfile -t bins < <(find "$BUILD/tests" -type f -name 'test_*' -perm -u+x | sort)
fi
[ ${#bins[@]} -gt 0 ] || { echo "run-tests: no test binaries under $BUILD/tests" >&2; exit 1; }

passed=0 failed=0 skipped=0 leftout=0 bad=() summary=
for b in "${bins[@]}"; do
	name=${b#"$BUILD/tests/"}
	log=$(mktemp)
	start=$(date +%s)
	if [[ $BUILD == *-address* ]] && [[ $name == mount/* ]]; then
		ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" timeout -k 10 "$LIMIT" "$b" >"$log" 2>&1
	else
		timeout -k 10 "$LIMIT" "$b" >"$log" 2>&1
	fi
	rc=$?
	if [ -n "$sanlog" ]; then
		cat "$sanlog"/* >>"$log" 2>/dev/null
		rm -f "$sanlog"/*
	fi
	secs=$(( $(date +%s) - start ))
	syn=$(grep -a 'Synthesis:' "$log" | tail -n 1)
	t=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$syn")
	p=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$syn")
	t=${t:-0} p=${p:-0}
	f=$(( t - p ))
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or timed out outside a test
	# ThreadSanitizer and UBSan report and go on: a report fails the binary
	# even when every test passed.
	san=$(grep -a -m1 -E '^WARNING: ThreadSanitizer|runtime error: |^SUMMARY: [A-Za-z]*Sanitizer' "$log")
	if [ -n "$san" ] && [ "$f" -eq 0 ]; then f=1; fi
	passed=$((passed + p)) failed=$((failed + f))
	if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
		bad+=("$name")
		# the failed cases and their messages first: the tail of a chatty
		# test's log may scroll past them, and a viewer that shows only the
		# head and the end of a long run would cut them
		echo "FAIL $name (rc=$rc, ${secs}s)"
		cases=$(grep -a -E -A3 '^\[----\] .*: Assertion Failed|^\[FAIL\]' "$log" |
			grep -a -v '^\[----\] *$' | head -n 40)
		echo "-- failed cases:"; echo "$cases"
		summary+="$name:"$'\n'"$cases"$'\n'
		echo "-- the end of its output:"; grep -a -v '^\[----\] *$' "$log" | tail -n 60
		if [ -n "$san" ] && [ "$(grep -a -c '' "$log")" -gt 60 ]; then
			echo "-- first sanitizer report:"; grep -a -m1 -A40 -F "$san" "$log"
		fi
	else
		# tests the binary holds but did not run: they skipped themselves,
		# or a CRITERION_TEST_PATTERN (the Makefile's sanitizer runs) left
		# them out
		listed=$("$b" --list 2>/dev/null | sed -n 's/^.*: \([0-9]*\) tests\{0,1\}$/\1/p' |
			awk '{ s += $1 } END { print s + 0 }')
		k=$(( listed > t ? listed - t : 0 ))
		extra=
		if [ -n "${CRITERION_TEST_PATTERN:-}" ]; then
			leftout=$((leftout + k))
			[ "$k" -eq 0 ] || extra=", $k left out or skipped (CRITERION_TEST_PATTERN is set)"
		else
			skipped=$((skipped + k))
			[ "$k" -eq 0 ] || extra=", $k skipped"
		fi
		echo "ok   $name: $p tests (${secs}s)$extra"
	fi
	rm -f "$log"
done
# the failed cases once more at the very end, where a reader of a long
# run's output looks first
[ -z "$summary" ] || printf -- '-- failed cases of this run:\n%s' "$summary"
[ ${#bad[@]} -eq 0 ] || echo "failed binaries: ${bad[*]}"
if [ "$leftout" -gt 0 ]; then
	echo "$passed passed, $failed failed, $leftout left out by CRITERION_TEST_PATTERN or skipped"
else
	echo "$passed passed, $failed failed, $skipped skipped"
fi
[ "$failed" -eq 0 ]
