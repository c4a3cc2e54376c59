#!/usr/bin/env bash
# Call i2 (one H200), the same library as i1: GPU tests on vmm (scripts/gpu-check pytest, the
# selected cases of f2): data while pages move, sleep and wake, near full, threads and streams,
# training losses, peak bytes, the soak, exit.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/i2.sh $R/run.sh; t0=$(date +%s)
T=python/tests/test_gpu.py
STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T::test_vmm_backend_keeps_every_element_while_pages_move $T::test_vmm_sleep_and_wake_keeps_tensors_graphs_and_training_right $T::test_a_device_near_full_serves_40_percent_of_the_card_from_a_checkerboard $T::test_threads_and_streams_under_load $T::test_training_losses_match_native $T::test_peak_allocated_bytes_match_native $T::test_soak_reserves_no_more_than_native_after_warm_up $T::test_exit_with_live_tensors_is_quiet" \
  timeout 480 scripts/gpu-check --log-dir $R/check pytest > $R/check.log 2>&1
echo "check rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt; tail -8 $R/check.log
tar czf $OUT/i2.tgz -C $OUT r
