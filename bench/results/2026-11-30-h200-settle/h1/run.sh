#!/usr/bin/env bash
# Call h1 (one H200), the library of 5afd1d7: what the synchronisation hook costs a step
# (.gpu/h1.py), multistream and churn, native / vmm with the hook / vmm without it, twice each.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/h1.sh $R/run.sh; cp .gpu/h1.py $R/
for w in multistream churn; do for round in 1 2; do for m in native hook nohook; do
  STREAMPOOL_BACKEND=vmm timeout 60 taskset -c 2-4 python3 .gpu/h1.py $m $w 2>&1 | grep -E "HOOK|Error"
done; done; done | tee $R/hook.txt
tar czf $OUT/h1.tgz -C $OUT r
