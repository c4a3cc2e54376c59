#!/usr/bin/env bash
# Call 2 (one H200). How much of a host-bound step is spent inside my_malloc and my_free: the
# steps of vision_sizes and churn under native, pool and vmm (ABBA, bench/diag_steps.py), then the
# library built with --features call-counts (.gpu/libstreampool-calls.so) on pool and vmm with 1
# and with 6 rounds of the timed steps: the difference is 5 rounds of steady state.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt
cp .gpu/g10.sh $R/run.sh; nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
DIAG_CONFIGS=native,pool,vmm STEPS_WORKLOADS="vision_sizes churn" timeout 300 taskset -c 0-7 \
  scripts/gpu-diag --log-dir $R/steps steps
echo "steps $(( $(date +%s)-t0 ))s" >> $R/times.txt
for w in vision_sizes churn; do for b in pool vmm; do for rounds in 1 6; do
  DIAG_ROUNDS=$rounds STREAMPOOL_BACKEND=$b STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-calls.so \
    PYTHONPATH=$PWD:$PYTHONPATH timeout 100 taskset -c 0-7 python3 bench/diag_steps.py --child $b \
    $w > $R/calls-$w-$b-$rounds.txt 2>&1
  echo "calls $w $b $rounds rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
done; done; done
cat $R/times.txt; grep -h STEPS $R/steps/steps.txt
for f in $R/calls-*.txt; do echo "== $f"; grep -E "STEPS|my_malloc|my_free|cuStreamIsCapturing|cuCtxGetCurrent" $f; done
tar czf $OUT/g10.tgz -C $OUT r && rm -rf $R
