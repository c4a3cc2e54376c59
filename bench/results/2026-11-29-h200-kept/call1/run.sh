#!/usr/bin/env bash
# Call 1 (two H200s): GPU 0, CPUs 0-15: the GPU cases and PyTorch's statistics on vmm, then
# memcheck on vmm. GPU 1, CPUs 16-31: bert, churn, torch.empty at 1 KiB and gpt2, vmm with the kept
# blocks against the commit before them (variant "before"), native and its A/A.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cat .gpu/BEFORE_FROM > $R/before_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1; nproc > $R/nproc.txt; t0=$(date +%s)
T=python/tests
( CUDA_VISIBLE_DEVICES=0 STREAMPOOL_BACKEND=vmm \
  GPU_CHECK_TESTS="$T/test_gpu.py $T/test_gpu_torch_stats.py --deselect=$T/test_gpu_torch_stats.py::test_compare_on_a_training_script" \
  timeout 555 taskset -c 0-15 scripts/gpu-check --log-dir $R/vmm pytest memcheck > $R/vmm.txt 2>&1
  echo "vmm pytest+memcheck rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 575 taskset -c 16-31 python3 -m bench \
  --workloads bert,churn,empty_1KiB,gpt2 --configs native,native-aa,streampool-vmm \
  --variant before:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-before.so \
  --budget-s 540 --out-dir $R/ab1 > $R/ab1.log 2>&1
  echo "ab1 rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
echo "== vmm"; sed -n '/SUMMARY/,$p' $R/vmm.txt | head -n 14; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/vmm/*.log 2>/dev/null | tail -n 6
echo "== ab1"; tail -n 25 $R/ab1.log
tar czf $OUT/g1.tgz -C $OUT r && rm -rf $R
