#!/usr/bin/env bash
# Job g3 (one H200): the GPU tests on the default backend (vmm) with the library of
# .gpu/c/BUILT_FROM: the sleep cases first, then what the 2026-11-30 run's k2
# did not reach, then the rest of test_gpu.py that runs on one GPU and the PyTorch statistics cases.
set -u
export PYTHONUNBUFFERED=1 STREAMPOOL_LIBRARY=$PWD/.gpu/c/libstreampool.so PYTEST_ADDOPTS="-v --durations=0"
R=$OUT/r; mkdir -p $R/logs; cat .gpu/c/BUILT_FROM > $R/built_from.txt; cp .gpu/tests3.sh $R/logs/
T=python/tests/test_gpu.py
GPU_CHECK_TESTS="$T::test_vmm_sleep_and_wake_keeps_tensors_graphs_and_training_right \
 $T::test_vmm_sleep_discarding_a_tag_keeps_the_rest_and_reuses_the_host_buffer \
 $T::test_vmm_sleep_with_a_reserved_buffer_pins_nothing_more_and_restores_exactly \
 $T::test_scoped_mempool_without_install $T::test_out_of_memory_in_a_scoped_mempool_is_torch_typed_error \
 $T::test_install_after_cuda_initialisation_is_refused_with_advice $T::test_record_stream_hook_keeps_side_stream_data_correct \
 $T::test_fork_after_install_gives_the_child_a_clear_error_and_the_parent_goes_on $T::test_cupy_and_torch_share_one_pool \
 $T::test_memory_timeline_opens_in_pytorchs_memory_viz $T::test_case_under_streampool \
 $T::test_soak_reserves_no_more_than_native_after_warm_up \
 $T::test_a_device_near_full_serves_40_percent_of_the_card_from_a_checkerboard \
 $T::test_vmm_backend_keeps_every_element_while_pages_move $T::test_peak_allocated_bytes_match_native \
 $T::test_training_losses_match_native $T::test_demo_runs_on_the_gpu $T::test_threads_and_streams_under_load \
 $T::test_exit_with_live_tensors_is_quiet \
 python/tests/test_gpu_torch_stats.py::test_pytorch_memory_functions_log_streampools_figures \
 python/tests/test_gpu_torch_stats.py::test_pytorch_memory_functions_opted_out_raise_as_pytorch_has_them"
export GPU_CHECK_TESTS
t0=$(date +%s)
timeout ${LIMIT_S:-530} scripts/gpu-check --log-dir $R/check pytest > $R/check.log 2>&1
echo "check rc=$? $(( $(date +%s)-t0 ))s" > $R/times.txt
cat $R/times.txt; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" $R/check/pytest.log | cut -c1-170 | tail -40
tar czf $OUT/g3.tgz -C $OUT r
