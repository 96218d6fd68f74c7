#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/plot-scaling on good and bad input: a plot, or one line
# "plot-scaling: ..." and exit status 2 (never a Python traceback).
# usage: plot_scaling_test.sh PYTHON PLOT_SCALING
set -u
PY=$1
TOOL=$2
"$PY" -c 'import matplotlib' 2>/dev/null || { echo "SKIP: $PY has no matplotlib"; exit 77; }
T=$(mktemp -d /tmp/plot-scaling-test-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0

# expect STATUS STDERR_LINE ARGS...: exit status and the whole of stderr.
expect() {
  want_status=$1 want_err=$2
  shift 2
  "$PY" "$TOOL" "$@" >"$T/out" 2>"$T/err"
  status=$?
  err=$(cat "$T/err")
  if [ "$status" != "$want_status" ] || [ "$err" != "$want_err" ]; then
    echo "FAIL: plot-scaling $*"
    echo "  status $status (want $want_status)"
    echo "  stderr: $err"
    echo "  want:   $want_err"
    fails=$((fails + 1))
  fi
}

cat >"$T/ok.csv" <<'CSV'
# tool: uprobe-bench
# cpus_allowed: 2
kind,variant,compare,design,lookup,xol,signal_mask,emulate,ri_pool,ri_lock,optimize,producers,affinity,repeat,iteration,warmup,hits_per_sec,mean_mps,stddev_mps,median_mps,per_cpu_mps,samples,ratio,note
summary,uprobe-nop,,,,,,,,,,1,0,,,,,1.500000,0.100000,1.500000,1.500000,3,,
summary,uprobe-nop,,,,,,,,,,2,0,,,,,2.800000,0.100000,2.800000,1.400000,3,,
summary,uprobe-push,,,,,,,,,,1,0,,,,,1.200000,0.100000,1.200000,1.200000,3,,
CSV
printf '{"meta": {\n' >"$T/truncated.json"
printf 'kind,variant\nsummary,uprobe-nop\n' >"$T/columns.csv"
: >"$T/empty.csv"

expect 2 "plot-scaling: $T/missing.csv: No such file or directory" "$T/missing.csv"
expect 2 "plot-scaling: $T: Is a directory" "$T"
expect 2 "plot-scaling: $T/truncated.json: not valid JSON (Expecting property name enclosed in double quotes at line 2, column 1; a run that did not finish?)" "$T/truncated.json"
expect 2 "plot-scaling: $T/columns.csv: not uprobe-bench csv/json output (missing field 'compare')" "$T/columns.csv"
expect 2 "plot-scaling: no summary rows found (was the run made with --format csv or json?)" "$T/empty.csv"
expect 2 "plot-scaling: no rows match --variants nosuch (the data has: uprobe-nop, uprobe-push)" "$T/ok.csv" --variants nosuch
# A bad file among good ones is named.
expect 2 "plot-scaling: $T/missing.json: No such file or directory" "$T/ok.csv" "$T/missing.json"
expect 0 "" "$T/ok.csv" --variants uprobe-push -o "$T/plot"
[ -s "$T/plot.png" ] && [ -s "$T/plot.svg" ] || { echo "FAIL: no $T/plot.png/.svg"; fails=$((fails + 1)); }
grep -qx "plot-scaling: wrote $T/plot.png and $T/plot.svg" "$T/out" || { echo "FAIL: stdout: $(cat "$T/out")"; fails=$((fails + 1)); }

[ "$fails" = 0 ] && echo "plot-scaling: all cases pass"
[ "$fails" = 0 ]
