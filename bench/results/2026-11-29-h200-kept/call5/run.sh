#!/usr/bin/env bash
# Call 5 (two H200s): the library of the final code commit on vmm. GPU 0, CPUs 0-15: the GPU
# cases (test_gpu.py). GPU 1, CPUs 16-31: memcheck, then PyTorch's statistics (without
# `compare`).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so STREAMPOOL_BACKEND=vmm
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; t0=$(date +%s); T=python/tests
( CUDA_VISIBLE_DEVICES=0 GPU_CHECK_TESTS="$T/test_gpu.py" timeout 420 taskset -c 0-15 \
    scripts/gpu-check --log-dir $R/cases pytest > $R/cases.txt 2>&1
  echo "cases rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 taskset -c 16-31 scripts/gpu-check --log-dir $R/memcheck memcheck > $R/memcheck.txt 2>&1
  echo "memcheck rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
  GPU_CHECK_TESTS="$T/test_gpu_torch_stats.py --deselect=$T/test_gpu_torch_stats.py::test_compare_on_a_training_script" \
    timeout 250 taskset -c 16-31 scripts/gpu-check --log-dir $R/stats pytest > $R/stats.txt 2>&1
  echo "stats rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for f in cases memcheck stats; do echo "== $f"; sed -n '/SUMMARY/,$p' $R/$f.txt | head -n 12; done
tar czf $OUT/g5.tgz -C $OUT r && rm -rf $R
