#!/usr/bin/env bash
# Call 2 (two H200s): BERT on vmm after the background thread's unmaps left the lock, against
# two page policies: c1s (STREAMPOOL_VMM_COLD_AFTER=1s) and s5c1s (and STREAMPOOL_VMM_GROWTH_SLACK=5%).
# GPU 0, CPUs 0-15: the call-counting build, one process each of vmm, c1s, s5c1s (whole process:
#   driver calls, lock waits, where a growth's handles came from); then bench/diag_steps.py
#   (DIAG_ROUNDS=7) native, vmm, c1s, s5c1s, ABBA, with the plain build.
# GPU 1, CPUs 16-31: the benchmark's pairs on bert: native, native-aa, vmm, c1s, s5c1s.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-plain.so
R=$OUT/r; mkdir -p $R/steps; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g2.sh $R/run.sh; t0=$(date +%s)
V="c1s:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_COLD_AFTER=1s;s5c1s:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=5%,STREAMPOOL_VMM_COLD_AFTER=1s"
( export CUDA_VISIBLE_DEVICES=0
  for c in vmm c1s s5c1s; do
    env STREAMPOOL_BACKEND=vmm $( [ $c = c1s ] && echo STREAMPOOL_VMM_COLD_AFTER=1s ) \
      $( [ $c = s5c1s ] && echo STREAMPOOL_VMM_COLD_AFTER=1s STREAMPOOL_VMM_GROWTH_SLACK=5% ) \
      STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-counts.so PYTHONPATH=$PWD:$PYTHONPATH \
      timeout 100 taskset -c 12-15 python3 bench/diag_steps.py --child $c bert > $R/steps/calls-$c.txt 2>&1
  done
  DIAG_ROUNDS=7 DIAG_CONFIGS=native,vmm,c1s,s5c1s DIAG_VARIANTS="$V" timeout 240 taskset -c 0-15 \
    python3 bench/diag_steps.py bert > $R/steps/steps.txt 2>&1
  echo "steps rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 330 taskset -c 16-31 python3 -m bench --workloads bert \
  --configs native,native-aa,streampool-vmm \
  --variant c1s:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_COLD_AFTER=1s \
  --variant s5c1s:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=5%,STREAMPOOL_VMM_COLD_AFTER=1s \
  --processes 3 --budget-s 300 --out-dir $R/pairs > $R/pairs.log 2>&1
  echo "pairs rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt; grep STEPS $R/steps/steps.txt
for c in vmm c1s s5c1s; do echo "== $c"; grep -E "^CALLS (my_|vmm|cuMem|background|cuEvent)" $R/steps/calls-$c.txt; done
grep -A6 "^| workload | native | native-aa" $R/pairs/report.md | head -4
grep -A4 "^## Peak device memory" $R/pairs/report.md | tail -2
tar czf $OUT/g2.tgz -C $OUT r && rm -rf $R
