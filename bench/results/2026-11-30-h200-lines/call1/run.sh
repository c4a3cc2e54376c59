#!/usr/bin/env bash
# Call 1 (two H200s). Time of this library against the one before (1d46766), each against native
# in the same run, with native's A/A: vision_sizes and churn (host-bound). GPU 0, CPUs 0-15: vmm;
# GPU 1, CPUs 16-31: pool.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cat .gpu/BEFORE_FROM > $R/before_from.txt
cp .gpu/g6.sh $R/run.sh; nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
B=$PWD/.gpu/libstreampool-before.so
( CUDA_VISIBLE_DEVICES=0 timeout 540 taskset -c 0-15 python3 -m bench \
  --workloads vision_sizes,churn --configs native,native-aa,streampool-vmm \
  --variant before-vmm:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$B \
  --budget-s 500 --out-dir $R/vmm-ab > $R/vmm-ab.log 2>&1
  echo "vmm-ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 540 taskset -c 16-31 python3 -m bench \
  --workloads vision_sizes,churn --configs native,native-aa,streampool \
  --variant before-pool:STREAMPOOL_BACKEND=pool,STREAMPOOL_LIBRARY=$B \
  --budget-s 500 --out-dir $R/pool-ab > $R/pool-ab.log 2>&1
  echo "pool-ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in vmm-ab pool-ab; do echo "== $g"; tail -n 25 $R/$g.log; done
tar czf $OUT/g6.tgz -C $OUT r && rm -rf $R
