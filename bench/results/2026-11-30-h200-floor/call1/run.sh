#!/usr/bin/env bash
# Call 1 (two H200s). The floor of PyTorch's pluggable path: native, its A/A, the floor allocator
# (bench/floor/floor.c), streampool's pool and vmm backends, in the same runs.
# GPU 0, CPUs 0-15: vision_sizes; GPU 1, CPUs 16-31: empty_1KiB, empty_64MiB, churn.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
export BENCH_FLOOR_LIBRARY=$PWD/.gpu/libfloor.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt
cp .gpu/g9.sh $R/run.sh; nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; t0=$(date +%s)
C=native,native-aa,pluggable-floor,streampool-pool,streampool-vmm
( CUDA_VISIBLE_DEVICES=0 timeout 560 taskset -c 0-15 python3 -m bench \
  --workloads vision_sizes --configs $C --budget-s 480 --out-dir $R/models > $R/models.log 2>&1
  echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 560 taskset -c 16-31 python3 -m bench \
  --workloads empty_1KiB,empty_64MiB,churn --configs $C --budget-s 480 --out-dir $R/alloc > $R/alloc.log 2>&1
  echo "alloc rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in models alloc; do echo "== $g"; tail -n 30 $R/$g.log; done
tar czf $OUT/g9.tgz -C $OUT r && rm -rf $R
