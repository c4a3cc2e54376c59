#!/usr/bin/env bash
# Call 2 (two H200s): the profile-guided library under the GPU tests. GPU 0: the GPU cases and
# PyTorch's statistics on vmm; GPU 1: PyTorch parity on the pool backend (the default).
set -u
export PYTHONUNBUFFERED=1 STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g2.sh $R/run.sh
T=python/tests; t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 STREAMPOOL_BACKEND=vmm \
  GPU_CHECK_TESTS="$T/test_gpu.py $T/test_gpu_torch_stats.py --deselect=$T/test_gpu_torch_stats.py::test_compare_on_a_training_script" \
  timeout 500 scripts/gpu-check --log-dir $R/vmm pytest > $R/vmm.txt 2>&1
  echo "vmm pytest rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 GPU_CHECK_TESTS="$T/test_gpu_parity.py" \
  timeout 500 scripts/gpu-check --log-dir $R/pool-parity pytest > $R/pool-parity.txt 2>&1
  echo "pool parity rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for f in pool-parity vmm; do echo "== $f"; sed -n '/SUMMARY/,$p' $R/$f.txt | head -n 14; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/$f/*.log 2>/dev/null | tail -n 6; done
tar czf $OUT/g2.tgz -C $OUT r && rm -rf $R
