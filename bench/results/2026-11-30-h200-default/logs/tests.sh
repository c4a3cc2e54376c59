#!/usr/bin/env bash
# Call $CALL on two H200s: the parity suite on vmm (GPU 0) and on the pool (GPU 1) side by side
# (tests, no timing), or the two-GPU tests on vmm (PART=multigpu).
# $OUT: the folder whose contents come back (the results folder of the run is made from it).
set -u
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/tests.sh $R/logs/tests.sh
t0=$(date +%s); T=$R/logs/$CALL-times.txt
if [ "${PART:-parity}" = multigpu ]; then
  CUDA_VISIBLE_DEVICES=0,1 STREAMPOOL_BACKEND=vmm timeout ${LIMIT_S:-560} scripts/gpu-check --log-dir $R/gpu-check/two-gpus-vmm multigpu > $R/logs/two-gpus-vmm.log 2>&1
  echo "two-gpus vmm rc=$? $(( $(date +%s)-t0 ))s" >> $T
else
  P=python/tests/test_gpu_parity.py
  (CUDA_VISIBLE_DEVICES=0 STREAMPOOL_BACKEND=vmm GPU_CHECK_TESTS=$P timeout ${LIMIT_S:-560} scripts/gpu-check --log-dir $R/gpu-check/parity-vmm pytest > $R/logs/parity-vmm.log 2>&1; echo "parity vmm rc=$? $(( $(date +%s)-t0 ))s" >> $T) &
  (CUDA_VISIBLE_DEVICES=1 STREAMPOOL_BACKEND=pool GPU_CHECK_TESTS=$P timeout ${LIMIT_S:-560} scripts/gpu-check --log-dir $R/gpu-check/parity-pool pytest > $R/logs/parity-pool.log 2>&1; echo "parity pool rc=$? $(( $(date +%s)-t0 ))s" >> $T) &
  wait
fi
cat $T; tail -5 $R/logs/*.log
tar czf $OUT/$CALL.tgz -C $OUT r
