#!/usr/bin/env bash
# Experiment e1 (two H200s), library c888a14 (memory ahead only in a threshold's or a sleep's
# cycle): the defaults against a 5% growth slack (variant slack5: idle pages move once growth
# would pass 5% over the most in use; one page a handle), native and native-aa.
# GPU 0: bert, gpt2. GPU 1: vision_sizes, churn, multistream (in that order, one process).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/e1.sh $R/run.sh; t0=$(date +%s)
V=slack5:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=5%
C=native,native-aa,streampool-vmm
( CUDA_VISIBLE_DEVICES=0 timeout 330 taskset -c 0-15 python3 -m bench --workloads bert,gpt2 \
    --configs $C --variant $V --processes 3 --budget-s 320 --out-dir $R/models > $R/models.log 2>&1
  echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 330 taskset -c 16-31 python3 -m bench --workloads \
    vision_sizes,churn,multistream --configs $C --variant $V --pairs 8 --processes 3 --budget-s 320 \
    --out-dir $R/vision > $R/vision.log 2>&1
  echo "vision rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for n in models vision; do grep -A8 "^| workload | native | native-aa" $R/$n/report.md | head -7; grep -A9 "^## Peak device memory" $R/$n/report.md | grep '^| `'; done
tar czf $OUT/e1.tgz -C $OUT r
