#!/usr/bin/env bash
# Call 3 (one H200). Where the time inside my_malloc and my_free goes: the call-counts library
# (.gpu/libstreampool-calls.so) times the device's allocate and free, the capture query, and the
# resource's fast-path calls, with 1 and with 6 rounds of the timed steps (the difference: 5
# rounds of steady state), vision_sizes and churn, pool and vmm.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; cat .gpu/CALLS_FROM > $R/built_from.txt
cp .gpu/g11.sh $R/run.sh; nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
for w in vision_sizes churn; do for b in pool vmm; do for rounds in 1 6; do
  DIAG_ROUNDS=$rounds STREAMPOOL_BACKEND=$b STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-calls.so \
    PYTHONPATH=$PWD:$PYTHONPATH timeout 100 taskset -c 0-7 python3 bench/diag_steps.py --child $b \
    $w > $R/calls-$w-$b-$rounds.txt 2>&1
  echo "calls $w $b $rounds rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
done; done; done
cat $R/times.txt
for f in $R/calls-*.txt; do echo "== $f"; grep -E "STEPS|my_malloc|my_free|device |capture query|resource try" $f; done
tar czf $OUT/g11.tgz -C $OUT r && rm -rf $R
