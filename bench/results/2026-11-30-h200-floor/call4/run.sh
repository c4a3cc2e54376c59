#!/usr/bin/env bash
# Call 4 (two H200s). This library (allocations on the legacy stream ask nothing about captures)
# against the one before (5d7913d), each against native in the same run, with native's A/A:
# vision_sizes, churn, empty_1KiB. GPU 0, CPUs 0-15: vmm; GPU 1, CPUs 16-31: pool.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cat .gpu/BEFORE_FROM > $R/before_from.txt
cp .gpu/g12.sh $R/run.sh; nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
B=$PWD/.gpu/libstreampool-before.so
W=vision_sizes,churn,empty_1KiB
( CUDA_VISIBLE_DEVICES=0 timeout 450 taskset -c 0-15 python3 -m bench --workloads $W \
  --configs native,native-aa,streampool-vmm \
  --variant before-vmm:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$B \
  --budget-s 410 --out-dir $R/vmm-ab > $R/vmm-ab.log 2>&1
  echo "vmm-ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 450 taskset -c 16-31 python3 -m bench --workloads $W \
  --configs native,native-aa,streampool-pool \
  --variant before-pool:STREAMPOOL_BACKEND=pool,STREAMPOOL_LIBRARY=$B \
  --budget-s 410 --out-dir $R/pool-ab > $R/pool-ab.log 2>&1
  echo "pool-ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in vmm-ab pool-ab; do echo "== $g"; grep -A8 "^| workload | native | native-aa" $R/$g/report.md | head -8; done
tar czf $OUT/g12.tgz -C $OUT r && rm -rf $R
