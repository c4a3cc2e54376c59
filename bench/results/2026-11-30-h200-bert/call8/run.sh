#!/usr/bin/env bash
# Call 8 (one H200): BERT on vmm, the final commit's library built with its profile (as the
# release wheel's) against the same commit built plainly, each paired with native.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g8.sh $R/run.sh
timeout 215 python3 -m bench --workloads bert --configs native,native-aa,streampool-vmm \
  --variant plain:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-plain.so \
  --processes 3 --budget-s 200 --out-dir $R/pairs > $R/pairs.log 2>&1; echo "pairs rc=$?"
grep -A4 "^| workload | native | native-aa" $R/pairs/report.md | head -3
tar czf $OUT/g8.tgz -C $OUT r
