#!/usr/bin/env bash
# Call f2 (two H200s), the same library as f1 (340a3bd).
# GPU 0: torch.empty loops and compiled: native, native-aa, expandable segments, vmm.
# GPU 1: GPU tests on vmm (scripts/gpu-check pytest, selected cases): data while pages move,
#   sleep and wake, near full, threads and streams, training losses, peak bytes, the soak, exit.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/f2.sh $R/run.sh; t0=$(date +%s)
C=native,native-aa,expandable,streampool-vmm
( CUDA_VISIBLE_DEVICES=0 timeout 300 taskset -c 0-15 python3 -m bench --workloads \
    empty_1KiB,empty_1MiB,empty_64MiB,compiled --configs $C --pairs 6 --processes 3 --budget-s 280 \
    --out-dir $R/alloc > $R/alloc.log 2>&1
  echo "alloc rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
T=python/tests/test_gpu.py
( CUDA_VISIBLE_DEVICES=1 STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS="$T::test_vmm_backend_keeps_every_element_while_pages_move $T::test_vmm_sleep_and_wake_keeps_tensors_graphs_and_training_right $T::test_a_device_near_full_serves_40_percent_of_the_card_from_a_checkerboard $T::test_threads_and_streams_under_load $T::test_training_losses_match_native $T::test_peak_allocated_bytes_match_native $T::test_soak_reserves_no_more_than_native_after_warm_up $T::test_exit_with_live_tensors_is_quiet" \
  timeout 420 taskset -c 16-31 scripts/gpu-check --log-dir $R/check pytest > $R/check.log 2>&1
  echo "check rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt; tail -4 $R/check.log
grep -A8 "^| workload | native | native-aa" $R/alloc/report.md | head -8; grep -A9 "^## Peak device memory" $R/alloc/report.md | grep '^| `'
tar czf $OUT/f2.tgz -C $OUT r
