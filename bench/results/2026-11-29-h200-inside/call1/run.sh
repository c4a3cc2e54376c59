#!/usr/bin/env bash
# Diagnostic call: where vmm's extra host time a vision_sizes step goes.
set -u
export PYTHONPATH=$PWD:$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi > $R/nvidia-smi.txt 2>&1; echo "built $(cat .gpu/BUILT_FROM)" > $R/built_from.txt
{ command -v perf; command -v nsys; } > $R/tools.txt 2>&1
t0=$(date +%s)
for b in pool vmm; do
  STREAMPOOL_BACKEND=$b STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-counts.so \
    timeout 100 python3 bench/diag_steps.py --child $b vision_sizes > $R/calls-$b.txt 2>&1
  echo "calls $b rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
done
grep -h "^STEPS\|^CALLS" $R/calls-*.txt
if command -v perf >/dev/null; then
  for b in native vmm; do
    [ $b = vmm ] && export STREAMPOOL_BACKEND=vmm
    timeout 100 perf record -q -F 2999 -g -o $R/perf-$b.data python3 bench/diag_steps.py --child $b vision_sizes > $R/perf-$b.log 2>&1
    echo "perf $b rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
    perf report -i $R/perf-$b.data --stdio --no-children --sort dso 2>/dev/null | grep -v '^$' | grep -v '^#' | head -n 40 > $R/perf-$b-dso.txt
    perf report -i $R/perf-$b.data --stdio --no-children --sort dso,symbol -g none 2>/dev/null | grep -E '^ +[0-9.]+%' | head -n 80 > $R/perf-$b-sym.txt
    rm -f $R/perf-$b.data; unset STREAMPOOL_BACKEND
  done
  head -n 15 $R/perf-*-dso.txt
fi
DIAG_CONFIGS=native,pool,vmm timeout 200 python3 bench/diag_steps.py vision_sizes > $R/steps.txt 2>&1
echo "steps rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt; grep -h "^STEPS" $R/steps.txt
tar czf $OUT/d1.tgz -C $OUT r && rm -rf $R
