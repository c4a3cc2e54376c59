#!/usr/bin/env bash
# Call 1 (two H200s): where BERT's time on vmm goes.
# GPU 0, CPUs 0-15: scripts/gpu-diag steps on bert (DIAG_ROUNDS=7): wall, CPU and GPU ms a call
#   under native, vmm (plain build), vmm-before (the same commit with the background thread's
#   tick of the release threshold taken out: .gpu/libstreampool-notick.so) and vmm with 20 MiB
#   pages, ABBA; then the call-counting build on pool and vmm (driver calls, lock waits, ticks).
# GPU 1, CPUs 16-31: the benchmark's pairs on bert: native, native-aa, the plain build and the
#   no-tick build, each paired with native.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-plain.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g1.sh $R/run.sh; t0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1
( CUDA_VISIBLE_DEVICES=0 STEPS_WORKLOADS=bert DIAG_ROUNDS=7 DIAG_CONFIGS=native,vmm,vmm-before,vmm20 \
  DIAG_BEFORE_LIBRARY=$PWD/.gpu/libstreampool-notick.so \
  DIAG_VARIANTS="vmm20:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_PAGE_SIZE=20MiB" \
  timeout 330 taskset -c 0-15 scripts/gpu-diag --log-dir $R/steps steps > $R/steps.log 2>&1
  echo "steps rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 330 taskset -c 16-31 python3 -m bench --workloads bert \
  --configs native,native-aa \
  --variant plain:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-plain.so \
  --variant notick:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-notick.so \
  --processes 4 --budget-s 290 --out-dir $R/pairs > $R/pairs.log 2>&1
  echo "pairs rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt $R/steps.log
grep -A6 "^| workload | native | native-aa" $R/pairs/report.md | head -5
tar czf $OUT/g1.tgz -C $OUT r && rm -rf $R
