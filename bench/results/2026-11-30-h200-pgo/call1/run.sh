#!/usr/bin/env bash
# Call 1 (two H200s). The profile-guided library (scripts/build-pgo) against the plain release
# build of the same commit, each against native in the same run, with native's A/A:
# vision_sizes, churn, empty_1KiB. GPU 0, CPUs 0-15: vmm; GPU 1, CPUs 16-31: pool.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt
cp .gpu/g1.sh $R/run.sh; nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
P=$PWD/.gpu/libstreampool-plain.so
W=vision_sizes,churn,empty_1KiB
( CUDA_VISIBLE_DEVICES=0 timeout 560 taskset -c 0-15 python3 -m bench --workloads $W \
  --configs native,native-aa,streampool-vmm \
  --variant plain-vmm:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$P \
  --budget-s 420 --out-dir $R/vmm-ab > $R/vmm-ab.log 2>&1
  echo "vmm-ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 560 taskset -c 16-31 python3 -m bench --workloads $W \
  --configs native,native-aa,streampool-pool \
  --variant plain-pool:STREAMPOOL_BACKEND=pool,STREAMPOOL_LIBRARY=$P \
  --budget-s 420 --out-dir $R/pool-ab > $R/pool-ab.log 2>&1
  echo "pool-ab rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in vmm-ab pool-ab; do echo "== $g"; grep -A8 "^| workload | native | native-aa" $R/$g/report.md | head -8; done
tar czf $OUT/g1.tgz -C $OUT r && rm -rf $R
