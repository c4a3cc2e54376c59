#!/usr/bin/env bash
# Final call 2: vision_sizes beside native, its A/A and expandable segments, on vmm as it is and
# with idle pages counted cold after 1 s and a 5% growth slack (no remapping in the timed steps
# in the replay), time and memory.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; t0=$(date +%s)
timeout 540 python3 -m bench --workloads vision_sizes --configs native,native-aa,expandable,streampool-vmm \
  --variant noremap:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_COLD_AFTER=1s,STREAMPOOL_VMM_GROWTH_SLACK=5% \
  --budget-s 520 --out-dir $R/vision_sizes > $R/vision_sizes.log 2>&1
echo "vision_sizes rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt; tail -n 30 $R/vision_sizes.log
tar czf $OUT/f2.tgz -C $OUT r && rm -rf $R
