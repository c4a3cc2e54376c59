#!/usr/bin/env bash
# Job g6 (one H200): a selection of the GPU tests on the default backend (vmm) with the final
# library (.gpu/d/BUILT_FROM): what small-block placement could break, in the time left.
set -u
export PYTHONUNBUFFERED=1 STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so PYTEST_ADDOPTS="-v --durations=0"
R=$OUT/r; mkdir -p $R/logs; cat .gpu/d/BUILT_FROM > $R/built_from.txt; cp .gpu/tests4.sh $R/logs/
T=python/tests/test_gpu.py
GPU_CHECK_TESTS="$T::test_training_losses_match_native[resnet18] $T::test_demo_runs_on_the_gpu \
 $T::test_vmm_sleep_and_wake_keeps_tensors_graphs_and_training_right $T::test_record_stream_hook_keeps_side_stream_data_correct \
 $T::test_peak_allocated_bytes_match_native $T::test_a_device_near_full_serves_40_percent_of_the_card_from_a_checkerboard[with-small-vmm] \
 $T::test_threads_and_streams_under_load $T::test_vmm_backend_keeps_every_element_while_pages_move $T::test_exit_with_live_tensors_is_quiet"
export GPU_CHECK_TESTS
t0=$(date +%s)
timeout ${LIMIT_S:-170} scripts/gpu-check --log-dir $R/check pytest > $R/check.log 2>&1
echo "check rc=$? $(( $(date +%s)-t0 ))s" > $R/times.txt
cat $R/times.txt; grep -E "PASSED|FAILED|ERROR|passed|failed" $R/check/pytest.log | cut -c1-150 | tail -14
tar czf $OUT/g6.tgz -C $OUT r
