#!/usr/bin/env bash
# Call 2 (two H200s). The GPU cases (python/tests/test_gpu.py) with this library: GPU 0, CPUs
# 0-15, on vmm; GPU 1, CPUs 16-31, on pool (the default).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g7.sh $R/run.sh; t0=$(date +%s)
T=python/tests/test_gpu.py
( CUDA_VISIBLE_DEVICES=0 STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T" \
  timeout 560 taskset -c 0-15 scripts/gpu-check --log-dir $R/vmm pytest > $R/vmm.txt 2>&1
  echo "vmm pytest rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 GPU_CHECK_TESTS="$T" \
  timeout 560 taskset -c 16-31 scripts/gpu-check --log-dir $R/pool pytest > $R/pool.txt 2>&1
  echo "pool pytest rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in vmm pool; do echo "== $g"; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/$g.txt $R/$g/*.log 2>/dev/null | tail -n 8; done
tar czf $OUT/g7.tgz -C $OUT r && rm -rf $R
