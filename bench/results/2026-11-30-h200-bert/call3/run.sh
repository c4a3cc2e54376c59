#!/usr/bin/env bash
# Call 3 (two H200s). GPU 0, CPUs 0-15: scripts/gpu-diag vmmtrace: BERT (5 rounds of its timed
#   steps) and vision_sizes (3 rounds) on vmm, traces captured under streampool with each step's
#   maps. GPU 1, CPUs 16-31: the benchmark's pairs on bert: native, native-aa, vmm of this
#   commit (retired pages unmapped a page per lock hold), and "before": 078cde6's library
#   (every due page unmapped in one hold of the lock).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-plain.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g3.sh $R/run.sh; t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 VMMTRACE_WORKLOADS="bert vision_sizes" VMMTRACE_ROUNDS=3 timeout 300 taskset -c 0-15 \
    scripts/gpu-diag --log-dir $R/diag vmmtrace > $R/diag.log 2>&1
  echo "vmmtrace rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 300 taskset -c 16-31 python3 -m bench --workloads bert \
  --configs native,native-aa,streampool-vmm \
  --variant before:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-before.so \
  --processes 3 --budget-s 270 --out-dir $R/pairs > $R/pairs.log 2>&1
  echo "pairs rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt $R/diag.log
grep -c "CUDA_ERROR" $R/pairs.log
grep -A6 "^| workload | native | native-aa" $R/pairs/report.md | head -4
tar czf $OUT/g3.tgz -C $OUT r && rm -rf $R
