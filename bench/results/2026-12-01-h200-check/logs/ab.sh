#!/usr/bin/env bash
# Call ab (one H200): the library of BUILT_FROM (vmm, the default) against db4902d's (variant prev,
# the library of the last full run), with native and the A/A control, on bert, multistream and
# churn, then torch.empty loops (the alloc group).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/ab.sh $R/logs/ab.sh
t0=$(date +%s)
timeout ${LIMIT_S:-330} python3 -m bench --workloads bert,multistream,churn --configs native,native-aa,streampool \
    --variant prev:STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so \
    --pairs 6 --processes 3 --budget-s 320 --out-dir $R/models > $R/logs/models.log 2>&1
echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
timeout ${ALLOC_S:-200} python3 -m bench --group alloc --configs native,native-aa,streampool \
    --variant prev:STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so --out-dir $R/alloc > $R/logs/alloc.log 2>&1
echo "alloc rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
cat $R/logs/times.txt; tail -12 $R/logs/models.log; tail -8 $R/logs/alloc.log
tar czf $OUT/ab.tgz -C $OUT r
