#!/usr/bin/env bash
# Job q2 (one H200): where GPT-2's step time goes under STREAMPOOL_RELEASE_THRESHOLD=1GiB with a
# synchronisation after every step (scripts/gpu-diag steps: native, pool and vmm in ABBA order,
# then the call-counting build of the same commit on pool and vmm: every driver call's count and
# time, the time inside my_malloc and my_free).
set -u
export PYTHONUNBUFFERED=1 STREAMPOOL_LIBRARY=$PWD/.gpu/b/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/b/BUILT_FROM > $R/built_from.txt; cp .gpu/steps.sh $R/logs/
t0=$(date +%s)
STEPS_SYNC=1 STREAMPOOL_RELEASE_THRESHOLD=1GiB STEPS_WORKLOADS=gpt2 DIAG_WARM_LIBRARIES=1 \
  timeout 420 scripts/gpu-diag --log-dir $R/steps steps > $R/steps.log 2>&1
echo "steps rc=$? $(( $(date +%s)-t0 ))s" > $R/logs/times.txt
cat $R/logs/times.txt; cut -c1-220 $R/steps.log | tail -60
tar czf $OUT/q2.tgz -C $OUT r
