#!/usr/bin/env bash
# Call g1 (two H200s), the library of 1ff4597 (settling at a synchronisation by driver queries,
# 7c95e4b, without a synchronisation of its own).
# GPU 0: compiled under vmm against c888a14's library (variant prev, before any settling),
#   native and native-aa.
# GPU 1: multistream and churn: native, native-aa, expandable segments, vmm.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g1.sh $R/run.sh; t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout 280 taskset -c 0-15 python3 -m bench --workloads compiled \
    --configs native,native-aa,streampool-vmm \
    --variant prev:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so \
    --pairs 8 --processes 3 --budget-s 260 --out-dir $R/compiled > $R/compiled.log 2>&1
  echo "compiled rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 280 taskset -c 16-31 python3 -m bench --workloads multistream,churn \
    --configs native,native-aa,expandable,streampool-vmm --pairs 8 --processes 3 --budget-s 260 \
    --out-dir $R/streams > $R/streams.log 2>&1
  echo "streams rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for d in compiled streams; do grep -A6 "^| workload | native | native-aa" $R/$d/report.md | head -5
  grep -A9 "^## Peak device memory" $R/$d/report.md | grep '^| `'; done
grep -h streampool_library $R/compiled/results.json | sort | uniq -c | head
tar czf $OUT/g1.tgz -C $OUT r
