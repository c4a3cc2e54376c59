#!/usr/bin/env bash
# Call 2 (two H200s): where BERT's time goes with one handle a page against 256 MiB handles and
# against no page moved (growth slack off, no cold moves): the profiler's host calls under the GPU's
# idle time, the driver calls and time inside my_malloc/my_free (call-counting library), and pairs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/c2.sh $R/run.sh
SPAN=STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_SPAN_SIZE=256MiB
OFF=STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=off,STREAMPOOL_VMM_COLD_AFTER=off
(
  export CUDA_VISIBLE_DEVICES=0 DIAG_WARM_LIBRARIES=1
  mkdir -p $R/profile
  DIAG_CONFIGS=native,vmm,vmmspan,vmmoff DIAG_VARIANTS="vmmspan:$SPAN;vmmoff:$OFF" DIAG_PROFILE_OUT=$R/profile \
    timeout 200 taskset -c 0-15 python3 bench/diag_profile.py bert > $R/profile/profile.txt 2>&1
  echo "profile rc=$?" >> $R/profile/profile.txt
  for c in vmm:STREAMPOOL_BACKEND=vmm vmmspan:$SPAN vmmoff:$OFF; do
    n=${c%%:*}; e=${c#*:}
    env $(echo $e | tr , ' ') STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-counts.so DIAG_ROUNDS=3 \
      timeout 100 taskset -c 0-15 python3 bench/diag_steps.py --child $n bert > $R/steps-calls-$n.txt 2>&1
    echo "rc=$?" >> $R/steps-calls-$n.txt
  done
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 300 taskset -c 16-31 python3 -m bench --workloads bert --configs native,native-aa,streampool-vmm \
    --variant span:$SPAN --variant off:$OFF --processes 3 --budget-s 240 --out-dir $R/gpu1 > $R/gpu1.log 2>&1
  echo "gpu1 rc=$?" >> $R/gpu1.log
) &
wait
grep -E "PROFILE|Error|rc=" $R/profile/profile.txt | cut -c1-400
for n in vmm vmmspan vmmoff; do echo "== $n"; grep -E "STEPS|my_malloc|my_free|cuMemSetAccess|cuMemMap|cuMemUnmap|cuMemCreate|rc=" $R/steps-calls-$n.txt | cut -c1-200; done
tail -n 1 $R/gpu1.log; grep -A3 "^| workload | native | native-aa" $R/gpu1/report.md | head -3
tar czf $OUT/g2.tgz -C $OUT r
