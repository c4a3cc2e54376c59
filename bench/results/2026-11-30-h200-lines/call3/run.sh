#!/usr/bin/env bash
# Call 3 (two H200s). The two-GPU suite with this library: on vmm, then on pool.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g8.sh $R/run.sh; t0=$(date +%s)
STREAMPOOL_BACKEND=vmm timeout 290 scripts/gpu-check --log-dir $R/vmm multigpu > $R/vmm.txt 2>&1
echo "vmm multigpu rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
timeout 270 scripts/gpu-check --log-dir $R/pool multigpu > $R/pool.txt 2>&1
echo "pool multigpu rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt
for g in vmm pool; do echo "== $g"; sed -n '/SUMMARY/,$p' $R/$g.txt | head -n 12; done
tar czf $OUT/g8.tgz -C $OUT r && rm -rf $R
