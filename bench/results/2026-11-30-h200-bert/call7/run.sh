#!/usr/bin/env bash
# Call 7 (two H200s), the final commit's library built with its profile (scripts/build-pgo, as
# the release wheel's), against 7e015d7's built the same way ("before").
# GPU 0, CPUs 0-15: GPU tests on vmm: pages moving under data checks, sleep and wake, near full,
#   threads and streams, the soak, exit and fork (scripts/gpu-check pytest).
# GPU 1, CPUs 16-31: the benchmark's pairs on bert and vision_sizes: native, native-aa, vmm, before.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g7.sh $R/run.sh; t0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
T=python/tests/test_gpu.py
( CUDA_VISIBLE_DEVICES=0 STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T::test_vmm_backend_keeps_every_element_while_pages_move $T::test_vmm_sleep_and_wake_keeps_tensors_graphs_and_training_right $T::test_a_device_near_full_serves_40_percent_of_the_card_from_a_checkerboard $T::test_threads_and_streams_under_load $T::test_soak_reserves_no_more_than_native_after_warm_up $T::test_exit_with_live_tensors_is_quiet $T::test_fork_after_install_gives_the_child_a_clear_error_and_the_parent_goes_on" \
  timeout 320 taskset -c 0-15 scripts/gpu-check --log-dir $R/check pytest > $R/check.log 2>&1
  echo "check rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 320 taskset -c 16-31 python3 -m bench --workloads bert,vision_sizes \
  --configs native,native-aa,streampool-vmm \
  --variant before:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-before.so \
  --processes 3 --budget-s 290 --out-dir $R/pairs > $R/pairs.log 2>&1
  echo "pairs rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt; tail -5 $R/check.log; grep -c "CUDA_ERROR" $R/pairs.log
grep -A6 "^| workload | native | native-aa" $R/pairs/report.md | head -5
grep -A6 "^## Peak device memory" $R/pairs/report.md | grep -E "bert|vision"
tar czf $OUT/g7.tgz -C $OUT r && rm -rf $R
