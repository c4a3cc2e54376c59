#!/usr/bin/env bash
# Call t2 (one H200): GPU tests on the default backend (vmm), part 2, with the library of BUILT_FROM.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/t2.sh $R/logs/t2.sh
T=python/tests/test_gpu.py; t0=$(date +%s)
GPU_CHECK_TESTS="$T::test_vmm_sleep_discarding_a_tag_keeps_the_rest_and_reuses_the_host_buffer \
  $T::test_vmm_sleep_with_a_reserved_buffer_pins_nothing_more_and_restores_exactly \
  python/tests/test_gpu_ipc.py $T::test_vmm_backend_keeps_every_element_while_pages_move \
  $T::test_scoped_mempool_without_install $T::test_out_of_memory_in_a_scoped_mempool_is_torch_typed_error \
  $T::test_install_after_cuda_initialisation_is_refused_with_advice $T::test_record_stream_hook_keeps_side_stream_data_correct \
  $T::test_fork_after_install_gives_the_child_a_clear_error_and_the_parent_goes_on $T::test_cupy_and_torch_share_one_pool \
  $T::test_memory_timeline_opens_in_pytorchs_memory_viz $T::test_soak_reserves_no_more_than_native_after_warm_up \
  $T::test_case_under_streampool" timeout ${LIMIT_S:-430} scripts/gpu-check --log-dir $R/t2 pytest > $R/logs/t2.log 2>&1
echo "t2 rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
cat $R/logs/times.txt; grep -E "passed|failed|PASSED|FAILED|Error" $R/logs/t2.log | tail -25
tar czf $OUT/t2.tgz -C $OUT r
