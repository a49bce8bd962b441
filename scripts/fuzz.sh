#!/usr/bin/env bash
# Run every fuzzer of a fuzzing build (make fuzz): first each kept crasher
# under tests/fuzz/crashers/NAME/ once (regressions), then FUZZ_SECONDS of
# libFuzzer from the seed corpus tests/fuzz/corpus/NAME/ (new inputs go to
# OUT/corpus/NAME, the committed seeds stay as they are).  A crash, leak,
# sanitizer report or timeout fails the run; the input is saved under
# OUT/artifacts/ and the line says how to keep it as a regression input.
#   usage: [JOBS=N] scripts/fuzz.sh OUT SECONDS   (N fuzzers at once; default: CPUs)
set -uo pipefail
out=${1:?usage: fuzz.sh OUT SECONDS}
secs=${2:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
bins=("$out"/fuzz/fuzz_*)
[ -x "${bins[0]}" ] || { echo "fuzz: no fuzzers under $out/fuzz (make fuzz builds them)" >&2; exit 1; }
# One fuzzer: its result line goes to OUT/fuzz-NAME.result (ok or FAIL).
run_one() {
	local b=$1 name=${1##*/fuzz_} corpus art log res start rc runs cov
	corpus=$out/corpus/$name
	art=$out/artifacts/$name
	log=$out/fuzz-$name.log
	res=$out/fuzz-$name.result
	mkdir -p "$corpus" "$art"
	: >"$log"
	if compgen -G "tests/fuzz/crashers/$name/*" >/dev/null; then
		if ! "$b" tests/fuzz/crashers/"$name"/* >"$log" 2>&1; then
			echo "FAIL fuzz/$name: a kept crasher crashes again (log: $log)" >"$res"
			return
		fi
	fi
	start=$(date +%s)
	"$b" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$art/" "$corpus" "tests/fuzz/corpus/$name" >>"$log" 2>&1
	rc=$?
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	cov=$(grep -a -o 'cov: [0-9]*' "$log" | tail -1)
	if [ $rc -ne 0 ]; then
		echo "FAIL fuzz/$name after $(( $(date +%s) - start ))s: see $log; inputs in $art/" \
			"(keep one as tests/fuzz/crashers/$name/NAME once fixed)" >"$res"
	else
		echo "ok   fuzz/$name: ${runs:-?} runs in ${secs}s, ${cov:-cov: ?}" >"$res"
	fi
}

# A libFuzzer process uses one CPU: run one per CPU at a time (JOBS), so each
# still gets SECONDS of a whole CPU and the run takes 1/JOBS of the time.
jobs_max=${JOBS:-$(nproc 2>/dev/null || echo 1)}
running=0
for b in "${bins[@]}"; do
	rm -f "$out/fuzz-${b##*/fuzz_}.result"
	if [ "$running" -ge "$jobs_max" ]; then
		wait -n
		running=$((running - 1))
	fi
	run_one "$b" &
	running=$((running + 1))
done
wait
failed=()
for b in "${bins[@]}"; do
	name=${b##*/fuzz_}
	res=$out/fuzz-$name.result
	if [ -s "$res" ]; then
		cat "$res"
	else
		echo "FAIL fuzz/$name: no result (the run was killed?)"
	fi
	[ -s "$res" ] && grep -q '^ok ' "$res" || failed+=("$name")
done
if [ ${#failed[@]} -ne 0 ]; then
	echo "fuzz: failed: ${failed[*]}"
	exit 1
fi
echo "fuzz: ${#bins[@]} fuzzers clean for ${secs}s each"
