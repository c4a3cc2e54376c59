#!/usr/bin/env bash
# Call 4 (two H200s, one used): the rest of the GPU cases on vmm with the final library.
export PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so STREAMPOOL_BACKEND=vmm
T=python/tests/test_gpu.py
GPU_CHECK_TESTS="$T::test_soak_reserves_no_more_than_native_after_warm_up $T::test_exit_with_live_tensors_is_quiet $T::test_fork_after_install_gives_the_child_a_clear_error_and_the_parent_goes_on $T::test_cupy_and_torch_share_one_pool $T::test_memory_timeline_opens_in_pytorchs_memory_viz" \
  timeout 200 scripts/gpu-check --log-dir $OUT/rest pytest
