#!/usr/bin/env bash
# Call 2 (two H200s): GPU 0, CPUs 0-15: the rest of the PyTorch parity suite on pool (the cases
# from compile_reduce_overhead_training on; multiprocessing_queue last, it waits out the plain
# pluggable allocator's queue timeouts), then `compare` on vmm. GPU 1, CPUs 16-31:
# vision_sizes, multistream and torch.empty at 1 MiB, vmm against the commit before the kept
# blocks, native and its A/A.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cat .gpu/BEFORE_FROM > $R/before_from.txt
t0=$(date +%s); T=python/tests; P=$T/test_gpu_parity.py::test_feature_under_install_works_and_matches_native
cases=""; for c in compile_reduce_overhead_training compile_max_autotune alloc_conf_environment \
  allocator_backend set_allocator_settings snapshot_adds_up memory_history_frames mempool_own_allocator \
  multiprocessing_queue; do cases="$cases $P[$c]"; done
( export CUDA_VISIBLE_DEVICES=0
  GPU_CHECK_TESTS="$cases" timeout 470 taskset -c 0-15 scripts/gpu-check --log-dir $R/pool-parity pytest > $R/pool-parity.txt 2>&1
  echo "pool parity rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
  STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T/test_gpu_torch_stats.py::test_compare_on_a_training_script" \
    timeout 100 taskset -c 0-15 scripts/gpu-check --log-dir $R/vmm-compare pytest > $R/vmm-compare.txt 2>&1
  echo "vmm compare rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 575 taskset -c 16-31 python3 -m bench \
  --workloads vision_sizes,multistream,empty_1MiB,empty_64MiB --configs native,native-aa,streampool-vmm \
  --variant before:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-before.so \
  --budget-s 540 --out-dir $R/ab2 > $R/ab2.log 2>&1
  echo "ab2 rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for f in pool-parity vmm-compare; do echo "== $f"; sed -n '/SUMMARY/,$p' $R/$f.txt | head -n 14; grep -h -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" $R/$f/*.log 2>/dev/null | tail -n 6; done
echo "== ab2"; tail -n 25 $R/ab2.log
tar czf $OUT/g2.tgz -C $OUT r && rm -rf $R
