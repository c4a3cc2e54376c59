#!/usr/bin/env bash
# Final call (two H200s). GPU 0, CPUs 0-15: churn then bert in each worker, vmm of this commit
# against vmm of a19aae1 ("before"), native and its A/A: bert's memory after churn (the
# empty_cache cycle rule) and both workloads' time. GPU 1, CPUs 16-31: the GPU cases on vmm.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cat .gpu/BEFORE_FROM > $R/before_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
T=python/tests
( CUDA_VISIBLE_DEVICES=0 timeout 575 taskset -c 0-15 python3 -m bench \
  --workloads churn,bert --configs native,native-aa,streampool-vmm \
  --variant before:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-before.so \
  --budget-s 520 --out-dir $R/ab > $R/ab.log 2>&1
  echo "ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T/test_gpu.py" \
  timeout 570 taskset -c 16-31 scripts/gpu-check --log-dir $R/vmm pytest > $R/vmm.txt 2>&1
  echo "vmm pytest rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
echo "== vmm"; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/vmm/*.log $R/vmm.txt 2>/dev/null | tail -n 8
echo "== ab"; grep -E "memory pass" $R/ab.log | head -n 40; tail -n 30 $R/ab.log
tar czf $OUT/f3.tgz -C $OUT r && rm -rf $R
