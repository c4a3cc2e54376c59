#!/usr/bin/env bash
# Final library (two H200s). GPU 0, CPUs 0-15: churn then bert in each worker, vmm of this
# commit against vmm of a19aae1 ("before"): BERT's memory after churn. GPU 1, CPUs 16-31: the GPU
# cases on vmm.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cat .gpu/BEFORE_FROM > $R/before_from.txt; t0=$(date +%s)
T=python/tests
( CUDA_VISIBLE_DEVICES=0 timeout 300 taskset -c 0-15 python3 -m bench --workloads churn,bert \
    --configs native,streampool-vmm \
    --variant before:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-before.so \
    --processes 2 --pairs 2 --budget-s 280 --out-dir $R/order > $R/order.log 2>&1
  echo "order rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T/test_gpu.py" \
  timeout 440 taskset -c 16-31 scripts/gpu-check --log-dir $R/vmm pytest > $R/vmm.txt 2>&1
  echo "vmm pytest rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
echo "== vmm"; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/vmm.txt 2>/dev/null | tail -n 4
echo "== order"; grep -E "memory pass" $R/order.log
tar czf $OUT/f5.tgz -C $OUT r && rm -rf $R
