#!/usr/bin/env bash
# Final call 1: the library of this commit under the GPU tests: PyTorch parity on the pool
# backend (the default), the GPU cases and PyTorch's statistics on vmm, memcheck on vmm.
set -u
export PYTHONUNBUFFERED=1 STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; nvidia-smi > $R/nvidia-smi.txt 2>&1
T=python/tests; t0=$(date +%s)
GPU_CHECK_TESTS="$T/test_gpu_parity.py" timeout 250 scripts/gpu-check --log-dir $R/pool-parity pytest > $R/pool-parity.txt 2>&1
echo "pool parity rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T/test_gpu.py $T/test_gpu_torch_stats.py --deselect=$T/test_gpu_torch_stats.py::test_compare_on_a_training_script" \
  timeout 290 scripts/gpu-check --log-dir $R/vmm pytest memcheck > $R/vmm.txt 2>&1
echo "vmm pytest+memcheck rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt
for f in pool-parity vmm; do echo "== $f"; sed -n '/SUMMARY/,$p' $R/$f.txt | head -n 14; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/$f/*.log 2>/dev/null | tail -n 6; done
tar czf $OUT/f1.tgz -C $OUT r && rm -rf $R
