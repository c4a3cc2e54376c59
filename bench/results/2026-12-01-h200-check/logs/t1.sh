#!/usr/bin/env bash
# Call t1 (one H200): GPU tests on the default backend (vmm), part 1, with the library of BUILT_FROM.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/t1.sh $R/logs/t1.sh
nvidia-smi > $R/nvidia-smi.txt 2>&1
T=python/tests/test_gpu.py; t0=$(date +%s)
GPU_CHECK_TESTS="$T::test_demo_runs_on_the_gpu $T::test_vmm_sleep_and_wake_keeps_tensors_graphs_and_training_right \
  $T::test_a_device_near_full_serves_40_percent_of_the_card_from_a_checkerboard $T::test_threads_and_streams_under_load \
  $T::test_training_losses_match_native $T::test_peak_allocated_bytes_match_native $T::test_exit_with_live_tensors_is_quiet \
  python/tests/test_gpu_torch_stats.py" timeout ${LIMIT_S:-430} scripts/gpu-check --log-dir $R/t1 pytest > $R/logs/t1.log 2>&1
echo "t1 rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
python3 -m streampool info >> $R/logs/times.txt 2>&1
cat $R/logs/times.txt | head -5; grep -E "passed|failed|PASSED|FAILED|Error" $R/logs/t1.log | tail -25
tar czf $OUT/t1.tgz -C $OUT r
