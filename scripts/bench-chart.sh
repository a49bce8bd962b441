#!/usr/bin/env bash
# scripts/bench-chart.sh — draw bench-fs.sh's results as one chart.
#
#   scripts/bench-chart.sh RESULTS OUT.svg
#
# RESULTS holds bench-fs.sh's lines (RESULT bench=fs_STEP dkvfs=X
# passthrough=P tmpfs=Y ... unit=U).  Every step becomes a group of three
# bars, dkvfs, passthrough and tmpfs, each the step's time relative to
# libfuse's passthrough (so passthrough is 1, lower is better, log scale):
# for ms steps X/P and Y/P, for rates (files or MB per second) P/X and P/Y.
# Steps without a passthrough or dkvfs figure are left out.  Installs
# gnuplot-nox through scripts/deps.sh when it is missing.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 RESULTS OUT.svg" >&2; exit 2; }
IN=$1 OUT=$2
HERE=$(dirname "$(readlink -f "$0")")
command -v gnuplot >/dev/null || "$HERE/deps.sh" gnuplot-nox
DATA=$(mktemp /tmp/dkvfs-chart.XXXXXX)
trap 'rm -f "$DATA"' EXIT

awk '/^RESULT bench=fs_/ {
	for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
	d = v["dkvfs"]; p = v["passthrough"]; t = v["tmpfs"]
	if (d == "NA" || p == "NA" || d + 0 <= 0 || p + 0 <= 0) next
	rate = v["unit"] != "ms"
	rd = rate ? p / d : d / p
	rt = (t == "NA" || t + 0 <= 0) ? "NaN" : (rate ? p / t : t / p)
	printf "%s %.4f 1 %s\n", substr(v["bench"], 4), rd, rt
}' "$IN" >"$DATA"
[ -s "$DATA" ] || { echo "bench-chart: no fs results with a passthrough figure in $IN" >&2; exit 1; }

gnuplot <<GP
set terminal svg size 1200,520 dynamic noenhanced font 'sans,12'
set output '$OUT'
set title 'bench-fs.sh: time of each step relative to libfuse passthrough (lower is better)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set yrange [0.001:*]
set grid ytics
set ylabel 'time / passthrough time'
set xtics rotate by -35 nomirror
set key top left
plot '$DATA' using 2:xtic(1) title 'dkvfs' lc rgb '#1f77b4', \
     '' using 3 title 'passthrough' lc rgb '#999999', \
     '' using 4 title 'tmpfs' lc rgb '#2ca02c'
GP
