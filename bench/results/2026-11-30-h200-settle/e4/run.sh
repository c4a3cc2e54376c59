#!/usr/bin/env bash
# Experiment e4 (one H200): compiled under vmm, the library of 340a3bd (settling at each
# synchronisation) against c888a14's (variant prev, the commit before), native and native-aa.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/e4.sh $R/run.sh; t0=$(date +%s)
timeout 200 python3 -m bench --workloads compiled --configs native,native-aa,streampool-vmm \
  --variant prev:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so \
  --pairs 6 --processes 3 --budget-s 190 --out-dir $R/compiled > $R/compiled.log 2>&1
echo "compiled rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt; grep -A6 "^| workload | native | native-aa" $R/compiled/report.md | head -4
grep -A9 "^## Peak device memory" $R/compiled/report.md | grep '^| `'
grep -h streampool_library $R/compiled/results.json | sort | uniq -c | head
tar czf $OUT/e4.tgz -C $OUT r
