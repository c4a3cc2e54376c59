#!/usr/bin/env bash
# Call 3 (two H200s), vmm only: the profile-guided library against the plain build of the same
# commit, each against native with native's A/A. GPU 0, CPUs 0-15: vision_sizes again;
# GPU 1, CPUs 16-31: gpt2 and bert.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g3.sh $R/run.sh; t0=$(date +%s)
P=$PWD/.gpu/libstreampool-plain.so
V=plain-vmm:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$P
( CUDA_VISIBLE_DEVICES=0 timeout 470 taskset -c 0-15 python3 -m bench --workloads vision_sizes \
  --configs native,native-aa,streampool-vmm --variant $V \
  --budget-s 380 --out-dir $R/vision > $R/vision.log 2>&1
  echo "vision rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 470 taskset -c 16-31 python3 -m bench --workloads gpt2,bert \
  --configs native,native-aa,streampool-vmm --variant $V \
  --budget-s 400 --out-dir $R/models > $R/models.log 2>&1
  echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in vision models; do echo "== $g"; grep -A8 "^| workload | native | native-aa" $R/$g/report.md | head -8; done
tar czf $OUT/g3.tgz -C $OUT r && rm -rf $R
