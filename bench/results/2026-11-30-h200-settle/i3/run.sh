#!/usr/bin/env bash
# Call i3 (one H200), the library of the session's last commit (BUILT_FROM; its code is 09f13db's): the settling at a
# synchronisation asks each stream once (5afd1d7) and, on the vmm resource, happens only where
# more than one stream allocated or freed since the last one (780ba80, 09f13db).
# multistream, churn and compiled: native, native-aa, expandable segments, vmm, and vmm under
#   06f0110's library (variant prev: streams that freed not counted).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/i3.sh $R/run.sh; t0=$(date +%s)
timeout 300 python3 -m bench --workloads multistream,churn,compiled \
    --configs native,native-aa,expandable,streampool-vmm \
    --variant prev:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so \
    --pairs 6 --processes 3 --budget-s 280 --out-dir $R/models > $R/models.log 2>&1
echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt
grep -A7 "^| workload | native | native-aa" $R/models/report.md | head -6
grep -A9 "^## Peak device memory" $R/models/report.md | grep '^| `'
tar czf $OUT/i3.tgz -C $OUT r
