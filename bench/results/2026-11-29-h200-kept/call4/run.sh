#!/usr/bin/env bash
# Call 4 (two H200s): does vmm's BERT memory figure depend on the workloads run beside it?
# GPU 0: bert alone; GPU 1: bert with churn, torch.empty at 1 KiB and gpt2, as in call 1; both
# native and vmm (library a56a80b: this commit's allocation code), 4 pairs in one process set.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/lib-a56a80b.so
R=$OUT/r; mkdir -p $R; t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout 280 taskset -c 0-15 python3 -m bench --workloads bert \
    --configs native,streampool-vmm --pairs 4 --processes 1 --out-dir $R/alone > $R/alone.log 2>&1
  echo "alone rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 280 taskset -c 16-31 python3 -m bench --workloads bert,churn,empty_1KiB,gpt2 \
    --configs native,streampool-vmm --pairs 4 --processes 1 --out-dir $R/beside > $R/beside.log 2>&1
  echo "beside rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt; grep -h "memory pass" $R/alone.log $R/beside.log
tar czf $OUT/g4.tgz -C $OUT r && rm -rf $R
