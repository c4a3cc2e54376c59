#!/usr/bin/env bash
# Call i1 (one H200), the library of the session's last commit (BUILT_FROM): the settling at a
# synchronisation asks each stream once (5afd1d7) and, on the vmm resource, happens only where
# more than one stream allocated since the last one (780ba80).
# multistream, churn and compiled: native, native-aa, expandable segments, vmm, and vmm under
#   1ff4597's library (variant prev, the session's start); then what the hook costs a step
#   (.gpu/h1.py: multistream and churn, native / hook / no hook, twice each).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/i1.sh $R/run.sh; cp .gpu/h1.py $R/; t0=$(date +%s)
timeout 300 python3 -m bench --workloads multistream,churn,compiled \
    --configs native,native-aa,expandable,streampool-vmm \
    --variant prev:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so \
    --pairs 6 --processes 3 --budget-s 280 --out-dir $R/models > $R/models.log 2>&1
echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
for w in multistream churn; do for round in 1 2; do for m in native hook nohook; do
  STREAMPOOL_BACKEND=vmm timeout 60 taskset -c 2-4 python3 .gpu/h1.py $m $w 2>&1 | grep -E "HOOK|Error"
done; done; done > $R/hook.txt
echo "hook rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt $R/hook.txt
grep -A7 "^| workload | native | native-aa" $R/models/report.md | head -6
grep -A9 "^## Peak device memory" $R/models/report.md | grep '^| `'
tar czf $OUT/i1.tgz -C $OUT r
